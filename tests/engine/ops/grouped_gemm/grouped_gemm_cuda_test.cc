// The CUDA grouped GEMMs (one cuBLASLt matmul per group over side streams) against the CPU
// backend and a float64 reference, on fresh random inputs. Skips, naming why, without a GPU.
//
// Tolerance, per element and for both dtypes (as in gemm_cuda_test.cc): bf16 products are exact
// in f32 and both backends sum in f32 (no TF32), so a result lies within (K + 1)·2⁻²⁴ of the
// exact sum relative to S = Σ |products| (+ |dw0| when accumulating), K the product's inner
// dimension. CUDA vs float64 allows 4 times that (tensor-core adders need not round to nearest),
// at least 1e-5·S; CUDA vs CPU twice as much again. Groups with no rows are checked exactly.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/gemm/gemm_test_util.h"
#include "tests/engine/ops/grouped_gemm/grouped_gemm_reference.h"

namespace moetrain::ops_test {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

std::vector<double> Abs(std::vector<double> v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

Tensor Clone(const Tensor& t) {
  Tensor copy = Tensor::Empty(t.dtype(), t.view().shape());
  std::memcpy(copy.view().raw(), t.view().raw(), t.numel() * DTypeSize(t.dtype()));
  return copy;
}

int64_t MaxGroupRows(const std::vector<int64_t>& offsets) {
  int64_t most = 0;
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    most = std::max(most, offsets[g + 1] - offsets[g]);
  return most;
}

// The cases of the CPU tests, plus the ragged sizes and one group holding every row.
std::vector<GroupedCase> CudaCases() {
  std::vector<GroupedCase> cases = GroupedCases();
  cases.push_back({"IssueRagged", {0, 1, 7, 0, 130, 33}, 37, 29});
  cases.push_back({"EveryRowInOneGroup", {0, 0, 171, 0}, 40, 24});
  // Big enough for cuBLASLt's larger tiles, with a group of 1 and an empty one between.
  cases.push_back({"Large", {300, 1, 0, 517}, 256, 192});
  return cases;
}

using GroupedCudaParam = std::tuple<DType, GroupedCase>;

class GroupedGemmCudaTest : public ::testing::TestWithParam<GroupedCudaParam> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  GroupedProblem Problem(uint32_t seed) const {
    return MakeGroupedProblem(dtype(), std::get<1>(GetParam()), seed);
  }
};

TEST_P(GroupedGemmCudaTest, ForwardMatchesCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  GroupedProblem p = Problem(11);
  Tensor y_cpu = Filled({p.rows, p.n}, kNaN);
  ASSERT_OK(ops::GroupedGemmForward(Cpu(), p.x.tensor, p.w.tensor, p.offsets, y_cpu));

  const Tensor x = test_util::ToDevice(gpu, p.x.tensor), w = test_util::ToDevice(gpu, p.w.tensor);
  Tensor results[2];
  for (Tensor& result : results) {
    const Tensor y = test_util::ToDevice(gpu, Filled({p.rows, p.n}, kNaN));
    ASSERT_OK(ops::GroupedGemmForward(gpu, x, w, p.offsets, y));
    result = test_util::ToHost(gpu, y);
  }
  const std::vector<double> scale =
      RefGroupedForward(Abs(p.x.values), Abs(p.w.values), p.offsets, p.n, p.k);
  const double tol = ElementTolerance(p.k);
  ExpectElementsClose(results[0], test_util::ToDoubles(y_cpu), scale, 2.0 * tol, "CUDA vs CPU");
  ExpectElementsClose(results[0], RefGroupedForward(p.x.values, p.w.values, p.offsets, p.n, p.k),
                      scale, tol, "CUDA vs float64");
  EXPECT_TRUE(test_util::SameBytes(results[0], results[1])) << "two identical calls differ";
}

TEST_P(GroupedGemmCudaTest, BackwardDataMatchesCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  GroupedProblem p = Problem(12);
  Tensor dx_cpu = Filled({p.rows, p.k}, kNaN);
  ASSERT_OK(ops::GroupedGemmBackwardData(Cpu(), p.dy.tensor, p.w.tensor, p.offsets, dx_cpu));

  const Tensor dy = test_util::ToDevice(gpu, p.dy.tensor);
  const Tensor w = test_util::ToDevice(gpu, p.w.tensor);
  Tensor results[2];
  for (Tensor& result : results) {
    const Tensor dx = test_util::ToDevice(gpu, Filled({p.rows, p.k}, kNaN));
    ASSERT_OK(ops::GroupedGemmBackwardData(gpu, dy, w, p.offsets, dx));
    result = test_util::ToHost(gpu, dx);
  }
  const std::vector<double> scale =
      RefGroupedBackwardData(Abs(p.dy.values), Abs(p.w.values), p.offsets, p.n, p.k);
  const double tol = ElementTolerance(p.n);
  ExpectElementsClose(results[0], test_util::ToDoubles(dx_cpu), scale, 2.0 * tol, "CUDA vs CPU");
  ExpectElementsClose(results[0],
                      RefGroupedBackwardData(p.dy.values, p.w.values, p.offsets, p.n, p.k), scale,
                      tol, "CUDA vs float64");
  EXPECT_TRUE(test_util::SameBytes(results[0], results[1])) << "two identical calls differ";
}

TEST_P(GroupedGemmCudaTest, BackwardWeightMatchesCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    GroupedProblem p = Problem(accumulate ? 14 : 13);
    std::mt19937 rng(accumulate ? 41 : 31);
    // Accumulation adds into random values; overwriting starts from NaN, which an empty group's
    // gradient must not keep.
    Operand dw0 = RandomOperand(DType::kF32, {p.groups, p.n, p.k}, rng);
    const Tensor dw_init = accumulate ? Clone(dw0.tensor) : Filled({p.groups, p.n, p.k}, kNaN);

    Tensor dw_cpu = Clone(dw_init);
    ASSERT_OK(ops::GroupedGemmBackwardWeight(Cpu(), p.dy.tensor, p.x.tensor, p.offsets, dw_cpu,
                                             accumulate));

    const Tensor dy = test_util::ToDevice(gpu, p.dy.tensor);
    const Tensor x = test_util::ToDevice(gpu, p.x.tensor);
    Tensor results[2];
    for (Tensor& result : results) {
      const Tensor dw = test_util::ToDevice(gpu, dw_init);
      ASSERT_OK(ops::GroupedGemmBackwardWeight(gpu, dy, x, p.offsets, dw, accumulate));
      result = test_util::ToHost(gpu, dw);
    }
    const std::vector<double> scale = RefGroupedBackwardWeight(
        Abs(p.dy.values), Abs(p.x.values), p.offsets, p.n, p.k, Abs(dw0.values), accumulate);
    const double tol = ElementTolerance(MaxGroupRows(p.offsets));
    ExpectElementsClose(results[0], test_util::ToDoubles(dw_cpu), scale, 2.0 * tol, "CUDA vs CPU");
    ExpectElementsClose(results[0],
                        RefGroupedBackwardWeight(p.dy.values, p.x.values, p.offsets, p.n, p.k,
                                                 dw0.values, accumulate),
                        scale, tol, "CUDA vs float64");
    EXPECT_TRUE(test_util::SameBytes(results[0], results[1])) << "two identical calls differ";

    // A group without rows: exactly zero when overwriting, its old bits when accumulating.
    const int64_t block = p.n * p.k;
    for (int64_t g = 0; g < p.groups; ++g) {
      if (p.offsets[g + 1] != p.offsets[g]) continue;
      const float* got = results[0].data<float>() + g * block;
      for (int64_t i = 0; i < block; ++i) {
        const float want = accumulate ? dw0.tensor.data<float>()[g * block + i] : 0.0f;
        ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0)
            << "empty group " << g << " element " << i << " is " << got[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmCudaTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::ValuesIn(CudaCases())),
                         [](const ::testing::TestParamInfo<GroupedCudaParam>& info) {
                           return std::get<1>(info.param).name + "_" +
                                  Name(std::get<0>(info.param));
                         });

// An inner dimension of 0 (K for forward, N for backward data): every output is an empty sum,
// so the whole output is zeroed; backward weight's output is then empty and nothing happens.
TEST(GroupedGemmCudaEdgeTest, EmptyInnerDimension) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const std::vector<int64_t> offsets = {0, 3, 3, 8};
  const int64_t rows = 8, groups = 3;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(dtype));
    const Tensor x0 = test_util::ToDevice(gpu, Tensor::Empty(dtype, {rows, 0}));
    const Tensor w_k0 = test_util::ToDevice(gpu, Tensor::Empty(dtype, {groups, 5, 0}));
    const Tensor y = test_util::ToDevice(gpu, Filled({rows, 5}, kNaN));
    ASSERT_OK(ops::GroupedGemmForward(gpu, x0, w_k0, offsets, y));
    EXPECT_TRUE(test_util::SameBytes(test_util::ToHost(gpu, y), Filled({rows, 5}, 0.0f)));

    const Tensor dy0 = test_util::ToDevice(gpu, Tensor::Empty(dtype, {rows, 0}));
    const Tensor w_n0 = test_util::ToDevice(gpu, Tensor::Empty(dtype, {groups, 0, 6}));
    const Tensor dx = test_util::ToDevice(gpu, Filled({rows, 6}, kNaN));
    ASSERT_OK(ops::GroupedGemmBackwardData(gpu, dy0, w_n0, offsets, dx));
    EXPECT_TRUE(test_util::SameBytes(test_util::ToHost(gpu, dx), Filled({rows, 6}, 0.0f)));

    const Tensor x = test_util::ToDevice(gpu, Tensor::Empty(dtype, {rows, 6}));
    const Tensor dw = test_util::ToDevice(gpu, Tensor::Empty(DType::kF32, {groups, 0, 6}));
    ASSERT_OK(ops::GroupedGemmBackwardWeight(gpu, dy0, x, offsets, dw, false));
    ASSERT_OK(gpu.Synchronize());
  }
}

// Many calls in a row with changing offsets, each result read back only at the end: every call
// must join its side streams into the compute stream, or a later call (or the copy) could run
// before an earlier product finished.
TEST(GroupedGemmCudaEdgeTest, BackToBackCallsWithChangingOffsets) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const int64_t n = 64, k = 48, rows = 400, groups = 6;
  const std::vector<std::vector<int64_t>> offset_sets = {
      {0, 50, 50, 250, 251, 300, 400},
      {0, 0, 400, 400, 400, 400, 400},
      {0, 1, 2, 3, 4, 5, 400},
      {0, 100, 200, 300, 300, 300, 400},
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(dtype));
    std::mt19937 rng(dtype == DType::kF32 ? 5 : 6);
    Operand x = RandomOperand(dtype, {rows, k}, rng);
    Operand w = RandomOperand(dtype, {groups, n, k}, rng);
    const Tensor x_gpu = test_util::ToDevice(gpu, x.tensor);
    const Tensor w_gpu = test_util::ToDevice(gpu, w.tensor);
    std::vector<Tensor> outputs;
    for (const std::vector<int64_t>& offsets : offset_sets) {
      outputs.push_back(test_util::ToDevice(gpu, Filled({rows, n}, kNaN)));
      ASSERT_OK(ops::GroupedGemmForward(gpu, x_gpu, w_gpu, offsets, outputs.back()));
    }
    for (size_t call = 0; call < offset_sets.size(); ++call) {
      SCOPED_TRACE(call);
      Tensor y_cpu = Filled({rows, n}, kNaN);
      ASSERT_OK(ops::GroupedGemmForward(Cpu(), x.tensor, w.tensor, offset_sets[call], y_cpu));
      const std::vector<double> scale =
          RefGroupedForward(Abs(x.values), Abs(w.values), offset_sets[call], n, k);
      ExpectElementsClose(test_util::ToHost(gpu, outputs[call]), test_util::ToDoubles(y_cpu), scale,
                          2.0 * ElementTolerance(k), "CUDA vs CPU");
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
