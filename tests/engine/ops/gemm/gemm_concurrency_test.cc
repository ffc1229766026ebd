// ops::Gemm and the grouped GEMMs called from several threads at once give the bits of the same
// calls made alone (the cached oneDNN primitives and their scratchpads are shared by threads).
#include <cstdint>
#include <cstring>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/gemm/gemm_test_util.h"

namespace moetrain::ops_test {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

// ---------------------------------------------------------------------------------------------
// Calls from several threads at once (ranks run as threads, compute overlapped on a second
// thread). They share the cached primitives, so every call must give the bits of the same call
// made alone: oneDNN's library-managed scratchpad is one buffer per primitive, and two threads
// running a primitive of the same shape at once overwrote each other's temporaries.
// ---------------------------------------------------------------------------------------------

constexpr int kConcurrentThreads = 3;

// Runs body(thread) on `threads` threads released together, and joins them.
void RunTogether(int threads, absl::FunctionRef<void(int)> body) {
  std::latch start(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (std::thread& worker : workers) worker.join();
}

// What one thread saw: wrong results per case, and the first error of a failed call.
struct ThreadTally {
  std::vector<int64_t> mismatches;  // (cases)
  absl::Status first_error;
  void Record(size_t case_index, const absl::Status& status, bool same_bits) {
    if (!status.ok() && first_error.ok()) first_error = status;
    if (!status.ok() || !same_bits) ++mismatches[case_index];
  }
};
std::vector<ThreadTally> Tallies(int threads, size_t cases) {
  return std::vector<ThreadTally>(threads, ThreadTally{std::vector<int64_t>(cases, 0), {}});
}

// One dense GEMM with its operands and the result of the same call made alone.
struct DenseConcurrentCase {
  DType dtype;
  bool trans_a, trans_b, accumulate;
  Shape shape;
  Operand a, b, c0;  // a, b in dtype; c0 (m, n) f32: what c holds before an accumulating call
  Tensor want;       // (m, n) f32

  std::string Name() const {
    return std::string(gemm_test::Name(dtype)) + (trans_a ? "_At" : "_A") + (trans_b ? "Bt" : "B") +
           (accumulate ? "_Acc_" : "_") + std::to_string(shape.m) + "x" + std::to_string(shape.n) +
           "x" + std::to_string(shape.k);
  }
  // Sets c to what the call starts from, then runs the call.
  absl::Status Run(Tensor& c) const {
    if (accumulate) {
      std::memcpy(c.data<float>(), c0.tensor.data<float>(), c.numel() * sizeof(float));
    } else {
      for (int64_t i = 0; i < c.numel(); ++i) c.data<float>()[i] = kNaN;
    }
    return ops::Gemm(Cpu(), {.a = a.tensor,
                             .b = b.tensor,
                             .c = c,
                             .trans_a = trans_a,
                             .trans_b = trans_b,
                             .accumulate = accumulate});
  }
};

DenseConcurrentCase MakeDenseConcurrentCase(DType dtype, bool trans_a, bool trans_b,
                                            bool accumulate, Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto [m, n, k] = shape;
  DenseConcurrentCase c{dtype, trans_a, trans_b, accumulate, shape, {}, {}, {}, {}};
  c.a = RandomOperand(dtype, trans_a ? std::vector<int64_t>{k, m} : std::vector{m, k}, rng);
  c.b = RandomOperand(dtype, trans_b ? std::vector<int64_t>{n, k} : std::vector{k, n}, rng);
  c.c0 = RandomOperand(DType::kF32, {m, n}, rng);
  c.want = Filled({m, n}, kNaN);
  return c;
}

// Every layout, both dtypes, with and without accumulation; K long next to M and N, and shapes
// that are not multiples of any tile. Each of these asks oneDNN 2.6 for a scratchpad.
std::vector<DenseConcurrentCase> DenseConcurrentCases() {
  std::vector<DenseConcurrentCase> cases;
  uint32_t seed = 500;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    cases.push_back(MakeDenseConcurrentCase(dtype, false, false, false, {64, 48, 2048}, ++seed));
    cases.push_back(MakeDenseConcurrentCase(dtype, false, true, false, {33, 65, 1000}, ++seed));
    cases.push_back(MakeDenseConcurrentCase(dtype, true, false, true, {40, 24, 1500}, ++seed));
    cases.push_back(MakeDenseConcurrentCase(dtype, true, true, false, {17, 70, 700}, ++seed));
    cases.push_back(MakeDenseConcurrentCase(dtype, false, true, true, {129, 3, 250}, ++seed));
  }
  return cases;
}

TEST(GemmConcurrencyTest, DenseCallsOnThreadsMatchCallsAlone) {
  std::vector<DenseConcurrentCase> cases = DenseConcurrentCases();
  for (DenseConcurrentCase& c : cases) {
    const absl::Status status = c.Run(c.want);
    ASSERT_TRUE(status.ok()) << c.Name() << ": " << status;
  }

  constexpr int kIterations = 200;
  std::vector<ThreadTally> tallies = Tallies(kConcurrentThreads, cases.size());
  RunTogether(kConcurrentThreads, [&](int thread) {
    std::vector<Tensor> outputs;  // one c per case, owned by this thread
    for (const DenseConcurrentCase& c : cases) outputs.push_back(Filled({c.shape.m, c.shape.n}, 0));
    // Every thread walks the cases in the same order, so the same shape often runs on several
    // threads at the same moment.
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      for (size_t i = 0; i < cases.size(); ++i) {
        const absl::Status status = cases[i].Run(outputs[i]);
        tallies[thread].Record(i, status, status.ok() && SameBits(outputs[i], cases[i].want));
      }
    }
  });

  for (int thread = 0; thread < kConcurrentThreads; ++thread) {
    EXPECT_TRUE(tallies[thread].first_error.ok()) << tallies[thread].first_error;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(tallies[thread].mismatches[i], 0)
          << cases[i].Name() << ": thread " << thread << " got results that differ from the "
          << "same call made alone, in this many of " << kIterations << " calls";
    }
  }
}

// The first calls of a shape, made on several threads at once, build its primitive while other
// threads look it up: each must still get the bits a later call made alone gets.
TEST(GemmConcurrencyTest, FirstCallsOfNewShapesOnThreads) {
  // Shapes no other test uses, so that these calls are the first of their kind in the process.
  std::vector<DenseConcurrentCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    cases.push_back(MakeDenseConcurrentCase(dtype, false, false, false, {45, 31, 777}, 900));
    cases.push_back(MakeDenseConcurrentCase(dtype, true, true, true, {23, 59, 611}, 901));
  }
  std::vector<std::vector<Tensor>> got(kConcurrentThreads);
  std::vector<ThreadTally> tallies = Tallies(kConcurrentThreads, cases.size());
  RunTogether(kConcurrentThreads, [&](int thread) {
    for (size_t i = 0; i < cases.size(); ++i) {
      got[thread].push_back(Filled({cases[i].shape.m, cases[i].shape.n}, 0));
      tallies[thread].Record(i, cases[i].Run(got[thread][i]), true);
    }
  });
  for (DenseConcurrentCase& c : cases) {
    const absl::Status status = c.Run(c.want);
    ASSERT_TRUE(status.ok()) << c.Name() << ": " << status;
  }
  for (int thread = 0; thread < kConcurrentThreads; ++thread) {
    EXPECT_TRUE(tallies[thread].first_error.ok()) << tallies[thread].first_error;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_TRUE(SameBits(got[thread][i], cases[i].want))
          << cases[i].Name() << ": thread " << thread;
    }
  }
}

// The grouped entry points, whole, from several threads at once; SixtyFourGroups also spreads
// its groups over each calling thread's OpenMP team.
TEST(GemmConcurrencyTest, GroupedCallsOnThreadsMatchCallsAlone) {
  struct Outputs {
    Tensor y, dx, dw, dw_accumulated;  // (R, N), (R, K), (G, N, K), (G, N, K) f32
  };
  struct Case {
    std::string name;
    GroupedProblem p;
    Operand dw0;  // (G, N, K) f32: the gradient the accumulating call adds to
    Outputs want;
  };
  // Runs the four calls of `c` into `out`; all statuses must be OK.
  const auto run = [](const Case& c, Outputs& out) -> absl::Status {
    const GroupedProblem& p = c.p;
    std::memcpy(out.dw_accumulated.data<float>(), c.dw0.tensor.data<float>(),
                out.dw_accumulated.numel() * sizeof(float));
    absl::Status status = ops::GroupedGemmForward(Cpu(), p.x.tensor, p.w.tensor, p.offsets, out.y);
    status.Update(ops::GroupedGemmBackwardData(Cpu(), p.dy.tensor, p.w.tensor, p.offsets, out.dx));
    status.Update(
        ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets, out.dw, false));
    status.Update(ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets,
                                                 out.dw_accumulated, true));
    return status;
  };
  const auto fresh_outputs = [](const GroupedProblem& p) {
    return Outputs{Filled({p.rows, p.n}, kNaN), Filled({p.rows, p.k}, kNaN),
                   Filled({p.groups, p.n, p.k}, kNaN), Filled({p.groups, p.n, p.k}, kNaN)};
  };

  std::vector<Case> cases;
  for (const GroupedCase& grouped : GroupedCases()) {
    if (grouped.name != "Ragged" && grouped.name != "SixtyFourGroups") continue;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      Case c{grouped.name + "_" + Name(dtype), MakeGroupedProblem(dtype, grouped, 77), {}, {}};
      std::mt19937 rng(78);
      c.dw0 = RandomOperand(DType::kF32, {c.p.groups, c.p.n, c.p.k}, rng);
      c.want = fresh_outputs(c.p);
      const absl::Status status = run(c, c.want);
      ASSERT_TRUE(status.ok()) << c.name << ": " << status;
      cases.push_back(std::move(c));
    }
  }

  constexpr int kIterations = 40;
  std::vector<ThreadTally> tallies = Tallies(kConcurrentThreads, cases.size());
  RunTogether(kConcurrentThreads, [&](int thread) {
    std::vector<Outputs> outputs;
    for (const Case& c : cases) outputs.push_back(fresh_outputs(c.p));
    for (int iteration = 0; iteration < kIterations; ++iteration) {
      for (size_t i = 0; i < cases.size(); ++i) {
        const absl::Status status = run(cases[i], outputs[i]);
        const Outputs& got = outputs[i];
        const Outputs& want = cases[i].want;
        tallies[thread].Record(i, status,
                               SameBits(got.y, want.y) && SameBits(got.dx, want.dx) &&
                                   SameBits(got.dw, want.dw) &&
                                   SameBits(got.dw_accumulated, want.dw_accumulated));
      }
    }
  });

  for (int thread = 0; thread < kConcurrentThreads; ++thread) {
    EXPECT_TRUE(tallies[thread].first_error.ok()) << tallies[thread].first_error;
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(tallies[thread].mismatches[i], 0)
          << cases[i].name << ": thread " << thread << " got results that differ from the "
          << "same calls made alone, in this many of " << kIterations << " rounds";
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
