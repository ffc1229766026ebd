// The CUDA Gemm (cuBLASLt) against the CPU Gemm and a float64 reference, on fresh random inputs.
// Skips, naming why, where there is no GPU.
//
// Tolerance, per element and for both dtypes: bf16 inputs hold exact values and their products
// are exact in f32; both backends add the k products in f32 (no TF32), in different orders. An
// f32 sum lies within (k + 1)·2⁻²⁴ of the exact one relative to S = Σ_p |a_ip·b_pj| (+ |c_ij|
// when accumulating). CUDA vs float64 allows 4 times that (tensor-core adders need not round to
// nearest), at least 1e-5·S; CUDA vs CPU twice as much again. A wrong index or transpose gives
// errors of order S, far above it.
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
#include "engine/ops/gemm/gemm.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/gemm/gemm_test_util.h"

namespace moetrain::ops_test {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

// S of every element of c (m, n): Σ_p |op(a)_ip · op(b)_pj| [+ |c0_ij|].
std::vector<double> AbsSums(const std::vector<double>& a, const std::vector<double>& b,
                            const std::vector<double>& c0, int64_t m, int64_t n, int64_t k,
                            bool trans_a, bool trans_b, bool accumulate) {
  std::vector<double> abs_a(a.size()), abs_b(b.size()), abs_c0(c0.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(a[i]);
  for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(b[i]);
  for (size_t i = 0; i < c0.size(); ++i) abs_c0[i] = std::fabs(c0[i]);
  return RefGemm(abs_a, abs_b, abs_c0, m, n, k, trans_a, trans_b, accumulate);
}

std::vector<double> Doubles(const Tensor& t) { return test_util::ToDoubles(t); }

Tensor Clone(const Tensor& t) {
  Tensor copy = Tensor::Empty(t.dtype(), t.view().shape());
  std::memcpy(copy.view().raw(), t.view().raw(), t.numel() * DTypeSize(t.dtype()));
  return copy;
}

using GemmCudaParam = std::tuple<DType, bool, bool, bool, Shape>;  // dtype, trans_a, trans_b, acc

class GemmCudaTest : public ::testing::TestWithParam<GemmCudaParam> {};

TEST_P(GemmCudaTest, MatchesCpuAndRepeatsBitIdentically) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const auto [dtype, trans_a, trans_b, accumulate, shape] = GetParam();
  const auto [m, n, k] = shape;
  std::mt19937 rng(static_cast<uint32_t>(7919 * m + 104729 * n + k + 2 * trans_a + trans_b));
  Operand a = RandomOperand(dtype, trans_a ? std::vector<int64_t>{k, m} : std::vector{m, k}, rng);
  Operand b = RandomOperand(dtype, trans_b ? std::vector<int64_t>{n, k} : std::vector{k, n}, rng);
  // Accumulation adds into random values; otherwise NaN shows any element not written.
  Operand c0 = RandomOperand(DType::kF32, {m, n}, rng);
  const Tensor c_init = accumulate ? Clone(c0.tensor) : Filled({m, n}, kNaN);
  const auto args = [&](TensorView a_view, TensorView b_view, TensorView c_view) {
    return ops::GemmArgs{.a = a_view,
                         .b = b_view,
                         .c = c_view,
                         .trans_a = trans_a,
                         .trans_b = trans_b,
                         .accumulate = accumulate};
  };

  Tensor c_cpu = Clone(c_init);
  ASSERT_OK(ops::Gemm(Cpu(), args(a.tensor, b.tensor, c_cpu)));

  const Tensor a_gpu = test_util::ToDevice(gpu, a.tensor);
  const Tensor b_gpu = test_util::ToDevice(gpu, b.tensor);
  Tensor results[2];
  for (Tensor& result : results) {
    const Tensor c_gpu = test_util::ToDevice(gpu, c_init);
    ASSERT_OK(ops::Gemm(gpu, args(a_gpu, b_gpu, c_gpu)));
    result = test_util::ToHost(gpu, c_gpu);
  }

  const std::vector<double> scale =
      AbsSums(a.values, b.values, c0.values, m, n, k, trans_a, trans_b, accumulate);
  const double tol = ElementTolerance(k);
  ExpectElementsClose(results[0], Doubles(c_cpu), scale, 2.0 * tol, "CUDA vs CPU");
  ExpectElementsClose(results[0],
                      RefGemm(a.values, b.values, c0.values, m, n, k, trans_a, trans_b, accumulate),
                      scale, tol, "CUDA vs float64");
  EXPECT_TRUE(test_util::SameBytes(results[0], results[1])) << "two identical CUDA calls differ";
}

std::string GemmCudaParamName(const ::testing::TestParamInfo<GemmCudaParam>& info) {
  const auto& [dtype, trans_a, trans_b, accumulate, shape] = info.param;
  return std::string(Name(dtype)) + (trans_a ? "_At" : "_A") + (trans_b ? "Bt" : "B") +
         (accumulate ? "_Acc_" : "_") + std::to_string(shape.m) + "x" + std::to_string(shape.n) +
         "x" + std::to_string(shape.k);
}

// Sizes that are not multiples of any tile (37×53×29), one element, a thin output, a long K
// (where cuBLASLt may split K), and a larger square-ish one.
INSTANTIATE_TEST_SUITE_P(
    AllLayouts, GemmCudaTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool(),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(Shape{1, 1, 1}, Shape{37, 53, 29}, Shape{129, 3, 250},
                                         Shape{48, 40, 2048}, Shape{300, 257, 130})),
    GemmCudaParamName);

TEST(GemmCudaEdgeTest, EmptyInnerDimensionZeroesOrKeepsC) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(dtype));
    std::mt19937 rng(17);
    const Tensor a = test_util::ToDevice(gpu, Tensor::Empty(dtype, {5, 0}));
    const Tensor b = test_util::ToDevice(gpu, Tensor::Empty(dtype, {0, 6}));
    Operand c0 = RandomOperand(DType::kF32, {5, 6}, rng);

    const Tensor c_acc = test_util::ToDevice(gpu, c0.tensor);
    ASSERT_OK(ops::Gemm(gpu, {.a = a, .b = b, .c = c_acc, .accumulate = true}));
    EXPECT_TRUE(test_util::SameBytes(test_util::ToHost(gpu, c_acc), c0.tensor))
        << "accumulating an empty sum must keep c";

    const Tensor c_nan = test_util::ToDevice(gpu, Filled({5, 6}, kNaN));
    ASSERT_OK(ops::Gemm(gpu, {.a = a, .b = b, .c = c_nan}));
    EXPECT_TRUE(test_util::SameBytes(test_util::ToHost(gpu, c_nan), Filled({5, 6}, 0.0f)))
        << "an empty sum overwrites c with zeros";
  }
}

TEST(GemmCudaEdgeTest, EmptyOutputIsFine) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (bool accumulate : {false, true}) {
    const Tensor a0 = test_util::ToDevice(gpu, Tensor::Empty(DType::kF32, {0, 4}));
    const Tensor b = test_util::ToDevice(gpu, Filled({4, 3}, 1.0f));
    const Tensor c0 = test_util::ToDevice(gpu, Tensor::Empty(DType::kF32, {0, 3}));
    ASSERT_OK(ops::Gemm(gpu, {.a = a0, .b = b, .c = c0, .accumulate = accumulate}));
    const Tensor a = test_util::ToDevice(gpu, Filled({2, 4}, 1.0f));
    const Tensor b0 = test_util::ToDevice(gpu, Tensor::Empty(DType::kF32, {4, 0}));
    const Tensor c1 = test_util::ToDevice(gpu, Tensor::Empty(DType::kF32, {2, 0}));
    ASSERT_OK(ops::Gemm(gpu, {.a = a, .b = b0, .c = c1, .accumulate = accumulate}));
    ASSERT_OK(gpu.Synchronize());
  }
}

// Operands that start one element into a buffer (4-byte aligned f32, 2-byte aligned bf16, as a
// group's rows inside a grouped GEMM do): cuBLASLt must be told, or it may pick a kernel that
// needs 16-byte alignment.
TEST(GemmCudaEdgeTest, MisalignedOperands) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const int64_t m = 21, n = 19, k = 35;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(dtype));
    std::mt19937 rng(23);
    Operand a = RandomOperand(dtype, {m, k}, rng);
    Operand b = RandomOperand(dtype, {k, n}, rng);
    Tensor c_cpu = Filled({m, n}, kNaN);
    ASSERT_OK(ops::Gemm(Cpu(), {.a = a.tensor, .b = b.tensor, .c = c_cpu}));

    // One spare element before each operand.
    const size_t elem = DTypeSize(dtype);
    absl::StatusOr<Tensor> a_buffer = Tensor::Allocate(gpu.allocator(), dtype, {m * k + 1});
    absl::StatusOr<Tensor> b_buffer = Tensor::Allocate(gpu.allocator(), dtype, {k * n + 1});
    absl::StatusOr<Tensor> c_buffer = Tensor::Allocate(gpu.allocator(), DType::kF32, {m * n + 1});
    ASSERT_TRUE(a_buffer.ok() && b_buffer.ok() && c_buffer.ok());
    const TensorView a_gpu(static_cast<char*>(a_buffer->view().raw()) + elem, dtype, {m, k},
                           gpu.device());
    const TensorView b_gpu(static_cast<char*>(b_buffer->view().raw()) + elem, dtype, {k, n},
                           gpu.device());
    const TensorView c_gpu(static_cast<float*>(c_buffer->view().raw()) + 1, DType::kF32, {m, n},
                           gpu.device());
    ASSERT_OK(ops::CopyTensor(gpu, a.tensor, a_gpu));
    ASSERT_OK(ops::CopyTensor(gpu, b.tensor, b_gpu));
    ASSERT_OK(ops::Gemm(gpu, {.a = a_gpu, .b = b_gpu, .c = c_gpu}));
    const Tensor c = test_util::ToHost(gpu, c_gpu);

    const std::vector<double> scale = AbsSums(a.values, b.values, {}, m, n, k, false, false, false);
    ExpectElementsClose(c, Doubles(c_cpu), scale, 2.0 * ElementTolerance(k), "CUDA vs CPU");
  }
}

TEST(GemmCudaEdgeTest, MeasureGemmFlopsRuns) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const absl::StatusOr<double> flops = ops::MeasureGemmFlops(gpu, dtype, 512, 2);
    ASSERT_TRUE(flops.ok()) << flops.status();
    EXPECT_GT(*flops, 0.0) << Name(dtype);
  }
}

}  // namespace
}  // namespace moetrain::ops_test
