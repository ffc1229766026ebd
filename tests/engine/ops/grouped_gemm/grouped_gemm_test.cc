#include "engine/ops/grouped_gemm/grouped_gemm.h"

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
#include "tests/engine/ops/gemm/gemm_test_util.h"
#include "tests/engine/ops/grouped_gemm/grouped_gemm_reference.h"

namespace moetrain::ops_test {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

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
  const absl::Status status = ops::GroupedGemmForward(Cpu(), p.x.tensor, p.w.tensor, p.offsets, y);
  ASSERT_TRUE(status.ok()) << status;
  ExpectBlocksClose(y, RefGroupedForward(p.x.values, p.w.values, p.offsets, p.n, p.k), p.offsets,
                    p.n, Tolerance(dtype()));
}

TEST_P(GroupedGemmTest, BackwardDataMatchesReference) {
  GroupedProblem p = Problem(2);
  Tensor dx = Filled({p.rows, p.k}, kNaN);
  const absl::Status status =
      ops::GroupedGemmBackwardData(Cpu(), p.dy.tensor, p.w.tensor, p.offsets, dx);
  ASSERT_TRUE(status.ok()) << status;
  ExpectBlocksClose(dx, RefGroupedBackwardData(p.dy.values, p.w.values, p.offsets, p.n, p.k),
                    p.offsets, p.k, Tolerance(dtype()));
}

TEST_P(GroupedGemmTest, BackwardWeightOverwrites) {
  GroupedProblem p = Problem(3);
  // NaN everywhere: a group without rows must come out exactly zero, not left as it was.
  Tensor dw = Filled({p.groups, p.n, p.k}, kNaN);
  const absl::Status status = ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor,
                                                             p.offsets, dw, /*accumulate=*/false);
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
      ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets, dw.tensor, true);
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
  ASSERT_TRUE(ops::GroupedGemmForward(Cpu(), p.x.tensor, p.w.tensor, p.offsets, y1).ok());
  ASSERT_TRUE(ops::GroupedGemmForward(Cpu(), p.x.tensor, p.w.tensor, p.offsets, y2).ok());
  EXPECT_TRUE(SameBits(y1, y2)) << "forward";

  Tensor dx1 = Filled({p.rows, p.k}, kNaN), dx2 = Filled({p.rows, p.k}, kNaN);
  ASSERT_TRUE(ops::GroupedGemmBackwardData(Cpu(), p.dy.tensor, p.w.tensor, p.offsets, dx1).ok());
  ASSERT_TRUE(ops::GroupedGemmBackwardData(Cpu(), p.dy.tensor, p.w.tensor, p.offsets, dx2).ok());
  EXPECT_TRUE(SameBits(dx1, dx2)) << "backward data";

  Tensor dw1 = Filled({p.groups, p.n, p.k}, kNaN), dw2 = Filled({p.groups, p.n, p.k}, kNaN);
  ASSERT_TRUE(
      ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets, dw1, false).ok());
  ASSERT_TRUE(
      ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets, dw2, false).ok());
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
      ASSERT_TRUE(ops::GroupedGemmForward(Cpu(), xr, w.tensor, offsets, y).ok());
      ExpectBlocksClose(y, RefGroupedForward(xv, w.values, offsets, n, k), offsets, n,
                        Tolerance(dtype));

      Tensor dx = Filled({rows, k}, kNaN);
      ASSERT_TRUE(ops::GroupedGemmBackwardData(Cpu(), dyr, w.tensor, offsets, dx).ok());
      ExpectBlocksClose(dx, RefGroupedBackwardData(dyv, w.values, offsets, n, k), offsets, k,
                        Tolerance(dtype));

      Tensor dw = Filled({5, n, k}, kNaN);
      ASSERT_TRUE(ops::GroupedGemmBackwardWeight(Cpu(), dyr, xr, offsets, dw, false).ok());
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
    EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w, offsets, y), "offsets"));
    EXPECT_TRUE(
        IsInvalidArgument(ops::GroupedGemmBackwardData(Cpu(), dy, w, offsets, dx), "offsets"));
    EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardWeight(Cpu(), dy, x, offsets, dw, false),
                                  "offsets"));
    EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardWeight(Cpu(), dy, x, offsets, dw, true),
                                  "offsets"));
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

  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w_wrong_k, offsets, y),
                                "grouped gemm w"));
  EXPECT_TRUE(
      IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w_bf16, offsets, y), "grouped gemm w"));
  EXPECT_TRUE(
      IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w, offsets, y_bf16), "grouped gemm y"));
  EXPECT_TRUE(
      IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w, offsets, y_wrong), "grouped gemm y"));
  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmForward(Cpu(), TensorView(), w, offsets, y),
                                "grouped gemm x"));
  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardData(Cpu(), dy, w, offsets, dx_wrong),
                                "grouped gemm dx"));
  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardData(Cpu(), dy, w_bf16, offsets, dx),
                                "grouped gemm w"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::GroupedGemmBackwardWeight(Cpu(), dy, x, offsets, dw_wrong, false), "grouped gemm dw"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::GroupedGemmBackwardWeight(Cpu(), dy, x_bf16, offsets, dw, false), "grouped gemm x"));
  EXPECT_TRUE(
      IsInvalidArgument(ops::GroupedGemmBackwardWeight(Cpu(), dy, x_wrong_rows, offsets, dw, false),
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
  EXPECT_TRUE(
      IsInvalidArgument(ops::GroupedGemmForward(Cpu(), x, w, offsets, y), "grouped gemm y"));
  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardData(Cpu(), dy, w, offsets, dx),
                                "grouped gemm dx"));
  EXPECT_TRUE(IsInvalidArgument(ops::GroupedGemmBackwardWeight(Cpu(), dy, x, offsets, dw, false),
                                "grouped gemm dw"));
}

}  // namespace
}  // namespace moetrain::ops_test
