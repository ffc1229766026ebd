#include "engine/backend/cpu/gemm.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/cpu/gemm_test_util.h"

namespace moetrain::cpu {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

// ---------------------------------------------------------------------------------------------
// Dense GEMM.
// ---------------------------------------------------------------------------------------------

using GemmParam = std::tuple<DType, bool, bool, bool, Shape>;  // dtype, trans_a, trans_b, acc

class GemmTest : public ::testing::TestWithParam<GemmParam> {};

TEST_P(GemmTest, MatchesFloat64Reference) {
  const auto [dtype, trans_a, trans_b, accumulate, shape] = GetParam();
  const auto [m, n, k] = shape;
  std::mt19937 rng(static_cast<uint32_t>(1000003 * m + 1009 * n + k + 2 * trans_a + trans_b));
  Operand a = RandomOperand(dtype, trans_a ? std::vector<int64_t>{k, m} : std::vector{m, k}, rng);
  Operand b = RandomOperand(dtype, trans_b ? std::vector<int64_t>{n, k} : std::vector{k, n}, rng);
  // Accumulation adds into random existing values; otherwise NaN shows any element not written.
  Operand c = RandomOperand(DType::kF32, {m, n}, rng);
  if (!accumulate) c.tensor = Filled({m, n}, kNaN);
  const std::vector<double> want =
      RefGemm(a.values, b.values, c.values, m, n, k, trans_a, trans_b, accumulate);

  const absl::Status status = Gemm({.a = a.tensor,
                                    .b = b.tensor,
                                    .c = c.tensor,
                                    .trans_a = trans_a,
                                    .trans_b = trans_b,
                                    .accumulate = accumulate});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(RelError(c.tensor, want), Tolerance(dtype));
}

std::string GemmParamName(const ::testing::TestParamInfo<GemmParam>& info) {
  const auto& [dtype, trans_a, trans_b, accumulate, shape] = info.param;
  return std::string(Name(dtype)) + (trans_a ? "_At" : "_A") + (trans_b ? "Bt" : "B") +
         (accumulate ? "_Acc_" : "_") + std::to_string(shape.m) + "x" + std::to_string(shape.n) +
         "x" + std::to_string(shape.k);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GemmTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(Shape{1, 1, 1}, Shape{7, 13, 5},
                                                              Shape{33, 65, 17},
                                                              Shape{129, 3, 250})),
                         GemmParamName);

TEST(GemmEdgeTest, EmptyInnerDimensionZeroesOrKeepsC) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool transpose : {false, true}) {
      SCOPED_TRACE(std::string(Name(dtype)) + (transpose ? " transposed" : ""));
      std::mt19937 rng(7);
      Tensor a =
          Tensor::Empty(dtype, transpose ? std::vector<int64_t>{0, 5} : std::vector<int64_t>{5, 0});
      Tensor b =
          Tensor::Empty(dtype, transpose ? std::vector<int64_t>{6, 0} : std::vector<int64_t>{0, 6});
      Operand c = RandomOperand(DType::kF32, {5, 6}, rng);
      const Tensor before = Filled({5, 6}, 0.0f);
      std::memcpy(before.data<float>(), c.tensor.data<float>(), 30 * sizeof(float));

      GemmArgs args{.a = a, .b = b, .c = c.tensor, .trans_a = transpose, .trans_b = transpose};
      args.accumulate = true;
      absl::Status status = Gemm(args);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(SameBits(c.tensor, before)) << "accumulating an empty sum must keep c";

      args.accumulate = false;
      status = Gemm(args);
      ASSERT_TRUE(status.ok()) << status;
      for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(c.tensor.data<float>()[i], 0.0f) << i;
    }
  }
}

TEST(GemmEdgeTest, EmptyOutputIsFine) {
  for (bool accumulate : {false, true}) {
    Tensor a0 = Tensor::Empty(DType::kF32, {0, 4});
    Tensor b = Filled({4, 3}, 1.0f);
    Tensor c0 = Tensor::Empty(DType::kF32, {0, 3});
    absl::Status status = Gemm({.a = a0, .b = b, .c = c0, .accumulate = accumulate});
    EXPECT_TRUE(status.ok()) << "M = 0: " << status;

    Tensor a = Filled({2, 4}, 1.0f);
    Tensor b0 = Tensor::Empty(DType::kF32, {4, 0});
    Tensor c1 = Tensor::Empty(DType::kF32, {2, 0});
    status = Gemm({.a = a, .b = b0, .c = c1, .accumulate = accumulate});
    EXPECT_TRUE(status.ok()) << "N = 0: " << status;
  }
}

TEST(GemmEdgeTest, RejectsBadOperands) {
  Tensor a = Filled({4, 5}, 1.0f);  // (M, K)
  Tensor b = Filled({5, 3}, 1.0f);  // (K, N)
  Tensor c = Filled({4, 3}, 0.0f);  // (M, N)
  Tensor a_i32 = Tensor::Zeros(DType::kI32, {4, 5});
  Tensor b_i32 = Tensor::Zeros(DType::kI32, {5, 3});
  Tensor b_bf16 = Tensor::Zeros(DType::kBF16, {5, 3});
  Tensor c_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor c_wrong = Filled({4, 4}, 0.0f);
  Tensor b_wrong_k = Filled({6, 3}, 1.0f);

  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a_i32, .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b_i32, .c = c}), "gemm b"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b, .c = c_bf16}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b, .c = c_wrong}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = TensorView(), .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b_wrong_k, .c = c}), "K"));
  // Transposing a makes op(a) (5, 4): K = 4 no longer matches b.
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b, .c = c, .trans_a = true}), "K"));
  // Mixed input dtypes: the error shows both.
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b_bf16, .c = c}), "bf16"));

  // A non-contiguous a (every other row of a (8, 5) buffer).
  Tensor big = Filled({8, 5}, 1.0f);
  const TensorView strided_a(big.data<float>(), DType::kF32, {4, 5}, {10, 1});
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = strided_a, .b = b, .c = c}), "gemm a"));
}

// Wrong ranks and a missing output should name the operand like every other shape error does.
TEST(GemmEdgeTest, RankErrorsNameTheOperand) {
  Tensor a = Filled({4, 5}, 1.0f);
  Tensor b = Filled({5, 3}, 1.0f);
  Tensor c = Filled({4, 3}, 0.0f);
  Tensor a3 = Filled({1, 4, 5}, 1.0f);
  Tensor b1 = Filled({15}, 1.0f);
  Tensor c3 = Filled({1, 4, 3}, 0.0f);
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a3, .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b1, .c = c}), "gemm b"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b, .c = c3}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(Gemm({.a = a, .b = b, .c = TensorView()}), "gemm c"));
}

// 0 when a small bf16 Gemm either succeeds with the right values or returns an error Status.
int SmallBf16GemmExitCode() {
  std::mt19937 rng(5);
  Operand a = RandomOperand(DType::kBF16, {7, 5}, rng);
  Operand b = RandomOperand(DType::kBF16, {5, 13}, rng);
  Tensor c = Filled({7, 13}, kNaN);
  const absl::Status status = Gemm({.a = a.tensor, .b = b.tensor, .c = c});
  if (!status.ok()) return 0;
  const std::vector<double> want = RefGemm(a.values, b.values, {}, 7, 13, 5, false, false, false);
  return RelError(c, want) < Tolerance(DType::kBF16) ? 0 : 1;
}

// oneDNN 2.x has no bf16 matmul on CPUs without AVX-512 (simulated here by capping its ISA at
// AVX2 in a fresh child process). Gemm must then fall back or return a Status: a dnnl::error
// escaping it would terminate a training process that only asked for a GEMM.
TEST(GemmDeathTest, Bf16WithoutAvx512ReturnsInsteadOfThrowing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Before the child's first oneDNN call, which is when oneDNN reads it.
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        std::_Exit(SmallBf16GemmExitCode());
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(GemmEdgeTest, IdenticalCallsGiveIdenticalBits) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(11);
    Operand a = RandomOperand(dtype, {129, 250}, rng);
    Operand b = RandomOperand(dtype, {3, 250}, rng);
    Tensor c1 = Filled({129, 3}, kNaN), c2 = Filled({129, 3}, kNaN);
    ASSERT_TRUE(Gemm({.a = a.tensor, .b = b.tensor, .c = c1, .trans_b = true}).ok());
    ASSERT_TRUE(Gemm({.a = a.tensor, .b = b.tensor, .c = c2, .trans_b = true}).ok());
    EXPECT_TRUE(SameBits(c1, c2)) << Name(dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// Grouped GEMM: reference over ragged groups.
// ---------------------------------------------------------------------------------------------

// y_g = x_g · w_gᵀ: x (R, K), w (G, N, K) -> y (R, N).
std::vector<double> RefGroupedForward(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<int64_t>& offsets, int64_t n, int64_t k) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> y(offsets.back() * n);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p) sum += x[r * k + p] * w[(g * n + j) * k + p];
        y[r * n + j] = sum;
      }
    }
  }
  return y;
}

// dx_g = dy_g · w_g: dy (R, N), w (G, N, K) -> dx (R, K).
std::vector<double> RefGroupedBackwardData(const std::vector<double>& dy,
                                           const std::vector<double>& w,
                                           const std::vector<int64_t>& offsets, int64_t n,
                                           int64_t k) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> dx(offsets.back() * k);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t p = 0; p < k; ++p) {
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += dy[r * n + j] * w[(g * n + j) * k + p];
        dx[r * k + p] = sum;
      }
    }
  }
  return dx;
}

// dw_g = [dw0_g +] dy_gᵀ · x_g: dy (R, N), x (R, K) -> dw (G, N, K).
std::vector<double> RefGroupedBackwardWeight(const std::vector<double>& dy,
                                             const std::vector<double>& x,
                                             const std::vector<int64_t>& offsets, int64_t n,
                                             int64_t k, const std::vector<double>& dw0,
                                             bool accumulate) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> dw(groups * n * k);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        double sum = accumulate ? dw0[(g * n + j) * k + p] : 0.0;
        for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) sum += dy[r * n + j] * x[r * k + p];
        dw[(g * n + j) * k + p] = sum;
      }
    }
  }
  return dw;
}

// Checks each block of `block_elems` elements (a group's rows, or a group's weight) on its own,
// so that a wrong small group cannot hide under the norm of the large ones.
void ExpectBlocksClose(const Tensor& got, const std::vector<double>& want,
                       const std::vector<int64_t>& block_begin, int64_t block_elems, double tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t g = 0; g + 1 < block_begin.size(); ++g) {
    const int64_t begin = block_begin[g] * block_elems, end = block_begin[g + 1] * block_elems;
    EXPECT_LT(RelError(got.data<float>() + begin, want.data() + begin, end - begin), tol)
        << "group " << g << " (elements " << begin << " .. " << end << ")";
  }
}

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n + 1);
  for (int64_t i = 0; i <= n; ++i) v[i] = i;
  return v;
}

using GroupedParam = std::tuple<DType, GroupedCase>;

class GroupedGemmTest : public ::testing::TestWithParam<GroupedParam> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  GroupedProblem Problem(uint32_t seed) const {
    return MakeGroupedProblem(dtype(), std::get<1>(GetParam()), seed);
  }
};

TEST_P(GroupedGemmTest, ForwardMatchesReference) {
  GroupedProblem p = Problem(1);
  Tensor y = Filled({p.rows, p.n}, kNaN);
  const absl::Status status = GroupedGemmForward(p.x.tensor, p.w.tensor, p.offsets, y);
  ASSERT_TRUE(status.ok()) << status;
  ExpectBlocksClose(y, RefGroupedForward(p.x.values, p.w.values, p.offsets, p.n, p.k), p.offsets,
                    p.n, Tolerance(dtype()));
}

TEST_P(GroupedGemmTest, BackwardDataMatchesReference) {
  GroupedProblem p = Problem(2);
  Tensor dx = Filled({p.rows, p.k}, kNaN);
  const absl::Status status = GroupedGemmBackwardData(p.dy.tensor, p.w.tensor, p.offsets, dx);
  ASSERT_TRUE(status.ok()) << status;
  ExpectBlocksClose(dx, RefGroupedBackwardData(p.dy.values, p.w.values, p.offsets, p.n, p.k),
                    p.offsets, p.k, Tolerance(dtype()));
}

TEST_P(GroupedGemmTest, BackwardWeightOverwrites) {
  GroupedProblem p = Problem(3);
  // NaN everywhere: a group without rows must come out exactly zero, not left as it was.
  Tensor dw = Filled({p.groups, p.n, p.k}, kNaN);
  const absl::Status status =
      GroupedGemmBackwardWeight(p.dy.tensor, p.x.tensor, p.offsets, dw, /*accumulate=*/false);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<double> want =
      RefGroupedBackwardWeight(p.dy.values, p.x.values, p.offsets, p.n, p.k, {}, false);
  ExpectBlocksClose(dw, want, Iota(p.groups), p.n * p.k, Tolerance(dtype()));
  for (int64_t g = 0; g < p.groups; ++g) {
    if (p.offsets[g + 1] != p.offsets[g]) continue;
    for (int64_t i = 0; i < p.n * p.k; ++i) {
      ASSERT_EQ(dw.data<float>()[g * p.n * p.k + i], 0.0f) << "empty group " << g;
    }
  }
}

TEST_P(GroupedGemmTest, BackwardWeightAccumulates) {
  GroupedProblem p = Problem(4);
  std::mt19937 rng(44);
  Operand dw = RandomOperand(DType::kF32, {p.groups, p.n, p.k}, rng);
  const Tensor before = Filled({p.groups, p.n, p.k}, 0.0f);
  std::memcpy(before.data<float>(), dw.tensor.data<float>(), before.numel() * sizeof(float));
  const absl::Status status =
      GroupedGemmBackwardWeight(p.dy.tensor, p.x.tensor, p.offsets, dw.tensor, true);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<double> want =
      RefGroupedBackwardWeight(p.dy.values, p.x.values, p.offsets, p.n, p.k, dw.values, true);
  ExpectBlocksClose(dw.tensor, want, Iota(p.groups), p.n * p.k, Tolerance(dtype()));
  for (int64_t g = 0; g < p.groups; ++g) {
    if (p.offsets[g + 1] != p.offsets[g]) continue;
    const int64_t begin = g * p.n * p.k;
    EXPECT_EQ(std::memcmp(dw.tensor.data<float>() + begin, before.data<float>() + begin,
                          p.n * p.k * sizeof(float)),
              0)
        << "empty group " << g << " must keep its gradient";
  }
}

TEST_P(GroupedGemmTest, IdenticalCallsGiveIdenticalBits) {
  GroupedProblem p = Problem(5);
  Tensor y1 = Filled({p.rows, p.n}, kNaN), y2 = Filled({p.rows, p.n}, kNaN);
  ASSERT_TRUE(GroupedGemmForward(p.x.tensor, p.w.tensor, p.offsets, y1).ok());
  ASSERT_TRUE(GroupedGemmForward(p.x.tensor, p.w.tensor, p.offsets, y2).ok());
  EXPECT_TRUE(SameBits(y1, y2)) << "forward";

  Tensor dx1 = Filled({p.rows, p.k}, kNaN), dx2 = Filled({p.rows, p.k}, kNaN);
  ASSERT_TRUE(GroupedGemmBackwardData(p.dy.tensor, p.w.tensor, p.offsets, dx1).ok());
  ASSERT_TRUE(GroupedGemmBackwardData(p.dy.tensor, p.w.tensor, p.offsets, dx2).ok());
  EXPECT_TRUE(SameBits(dx1, dx2)) << "backward data";

  Tensor dw1 = Filled({p.groups, p.n, p.k}, kNaN), dw2 = Filled({p.groups, p.n, p.k}, kNaN);
  ASSERT_TRUE(GroupedGemmBackwardWeight(p.dy.tensor, p.x.tensor, p.offsets, dw1, false).ok());
  ASSERT_TRUE(GroupedGemmBackwardWeight(p.dy.tensor, p.x.tensor, p.offsets, dw2, false).ok());
  EXPECT_TRUE(SameBits(dw1, dw2)) << "backward weight";
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::ValuesIn(GroupedCases())),
                         [](const ::testing::TestParamInfo<GroupedParam>& info) {
                           return std::get<1>(info.param).name + "_" +
                                  Name(std::get<0>(info.param));
                         });

// The primitive cache is keyed by shape with the ragged dimension left to run time: calls with
// other offsets (and other row counts) over the same weights must not reuse stale sizes.
TEST(GroupedGemmCacheTest, ChangingOffsetsBetweenCalls) {
  const int64_t n = 21, k = 30;
  const std::vector<std::vector<int64_t>> offset_sets = {
      {0, 10, 10, 40, 41, 60},  // A
      {0, 0, 60, 60, 60, 60},   // B: everything in one group
      {0, 10, 10, 40, 41, 60},  // A again
      {0, 3, 4, 4, 20, 37},     // C: fewer rows in total
      {0, 0, 60, 60, 60, 60},   // B again
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(dtype == DType::kF32 ? 101 : 202);
    Operand x = RandomOperand(dtype, {60, k}, rng);
    Operand w = RandomOperand(dtype, {5, n, k}, rng);
    Operand dy = RandomOperand(dtype, {60, n}, rng);
    for (size_t call = 0; call < offset_sets.size(); ++call) {
      const std::vector<int64_t>& offsets = offset_sets[call];
      const int64_t rows = offsets.back();
      SCOPED_TRACE(std::string(Name(dtype)) + " call " + std::to_string(call));
      const TensorView xr = x.tensor.view().Slice(0, rows), dyr = dy.tensor.view().Slice(0, rows);
      const std::vector<double> xv(x.values.begin(), x.values.begin() + rows * k);
      const std::vector<double> dyv(dy.values.begin(), dy.values.begin() + rows * n);

      Tensor y = Filled({rows, n}, kNaN);
      ASSERT_TRUE(GroupedGemmForward(xr, w.tensor, offsets, y).ok());
      ExpectBlocksClose(y, RefGroupedForward(xv, w.values, offsets, n, k), offsets, n,
                        Tolerance(dtype));

      Tensor dx = Filled({rows, k}, kNaN);
      ASSERT_TRUE(GroupedGemmBackwardData(dyr, w.tensor, offsets, dx).ok());
      ExpectBlocksClose(dx, RefGroupedBackwardData(dyv, w.values, offsets, n, k), offsets, k,
                        Tolerance(dtype));

      Tensor dw = Filled({5, n, k}, kNaN);
      ASSERT_TRUE(GroupedGemmBackwardWeight(dyr, xr, offsets, dw, false).ok());
      ExpectBlocksClose(dw, RefGroupedBackwardWeight(dyv, xv, offsets, n, k, {}, false), Iota(5),
                        n * k, Tolerance(dtype));
    }
  }
}

TEST(GroupedGemmErrorTest, RejectsBadOffsets) {
  const int64_t rows = 10, groups = 3, n = 4, k = 6;
  Tensor x = Filled({rows, k}, 1.0f), w = Filled({groups, n, k}, 1.0f);
  Tensor dy = Filled({rows, n}, 1.0f);
  Tensor y = Filled({rows, n}, 0.0f), dx = Filled({rows, k}, 0.0f);
  Tensor dw = Filled({groups, n, k}, 0.0f);
  const std::vector<std::vector<int64_t>> bad = {
      {},                 // no offsets at all
      {0, 4, 10},         // G entries
      {0, 4, 6, 10, 10},  // G + 2 entries
      {1, 4, 6, 10},      // does not start at 0
      {0, 4, 6, 9},       // does not end at R
      {0, 4, 6, 11},      // runs past R
      {0, 6, 4, 10},      // decreases
      {0, -2, 6, 10},     // negative
  };
  for (const std::vector<int64_t>& offsets : bad) {
    SCOPED_TRACE(::testing::PrintToString(offsets));
    EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w, offsets, y), "offsets"));
    EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardData(dy, w, offsets, dx), "offsets"));
    EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardWeight(dy, x, offsets, dw, false), "offsets"));
    EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardWeight(dy, x, offsets, dw, true), "offsets"));
  }
}

TEST(GroupedGemmErrorTest, RejectsBadShapesAndDtypes) {
  const int64_t rows = 10, groups = 3, n = 4, k = 6;
  const std::vector<int64_t> offsets = {0, 3, 3, 10};
  Tensor x = Filled({rows, k}, 1.0f), w = Filled({groups, n, k}, 1.0f);
  Tensor dy = Filled({rows, n}, 1.0f);
  Tensor y = Filled({rows, n}, 0.0f), dx = Filled({rows, k}, 0.0f);
  Tensor dw = Filled({groups, n, k}, 0.0f);
  Tensor w_bf16 = Tensor::Zeros(DType::kBF16, {groups, n, k});
  Tensor x_bf16 = Tensor::Zeros(DType::kBF16, {rows, k});
  Tensor w_wrong_k = Filled({groups, n, k + 1}, 1.0f);
  Tensor y_bf16 = Tensor::Zeros(DType::kBF16, {rows, n});
  Tensor y_wrong = Filled({rows + 1, n}, 0.0f);
  Tensor dx_wrong = Filled({rows, k + 1}, 0.0f);
  Tensor dw_wrong = Filled({groups, n + 1, k}, 0.0f);
  Tensor x_wrong_rows = Filled({rows - 1, k}, 1.0f);

  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w_wrong_k, offsets, y), "grouped gemm w"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w_bf16, offsets, y), "grouped gemm w"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w, offsets, y_bf16), "grouped gemm y"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w, offsets, y_wrong), "grouped gemm y"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(TensorView(), w, offsets, y), "grouped gemm x"));
  EXPECT_TRUE(
      IsInvalidArgument(GroupedGemmBackwardData(dy, w, offsets, dx_wrong), "grouped gemm dx"));
  EXPECT_TRUE(
      IsInvalidArgument(GroupedGemmBackwardData(dy, w_bf16, offsets, dx), "grouped gemm w"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardWeight(dy, x, offsets, dw_wrong, false),
                                "grouped gemm dw"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardWeight(dy, x_bf16, offsets, dw, false),
                                "grouped gemm x"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardWeight(dy, x_wrong_rows, offsets, dw, false),
                                "grouped gemm x"));
}

// The outputs are written through raw pointers as if contiguous, so a strided view must be
// refused (as Gemm does for c) rather than filled in the wrong places.
TEST(GroupedGemmErrorTest, RejectsNonContiguousOutputs) {
  const int64_t rows = 10, groups = 3, n = 4, k = 6;
  const std::vector<int64_t> offsets = {0, 3, 3, 10};
  Tensor x = Filled({rows, k}, 1.0f), w = Filled({groups, n, k}, 1.0f);
  Tensor dy = Filled({rows, n}, 1.0f);
  // Every output is every other row of a buffer twice its size.
  Tensor y_buffer = Filled({rows, 2 * n}, 0.0f), dx_buffer = Filled({rows, 2 * k}, 0.0f);
  Tensor dw_buffer = Filled({groups, 2 * n, k}, 0.0f);
  const TensorView y(y_buffer.data<float>(), DType::kF32, {rows, n}, {2 * n, 1});
  const TensorView dx(dx_buffer.data<float>(), DType::kF32, {rows, k}, {2 * k, 1});
  const TensorView dw(dw_buffer.data<float>(), DType::kF32, {groups, n, k}, {2 * n * k, k, 1});
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmForward(x, w, offsets, y), "grouped gemm y"));
  EXPECT_TRUE(IsInvalidArgument(GroupedGemmBackwardData(dy, w, offsets, dx), "grouped gemm dx"));
  EXPECT_TRUE(
      IsInvalidArgument(GroupedGemmBackwardWeight(dy, x, offsets, dw, false), "grouped gemm dw"));
}

}  // namespace
}  // namespace moetrain::cpu
