// The CUDA FP8 ops against the CPU's exact emulation, on fresh random inputs. Skips, naming why,
// where there is no GPU.
//
// Quantisation runs the same formulas (engine/core/fp8_math.h) on both, so every output is
// compared bit for bit: the FP8 data with its zero padding, scale_inv with its pad4 entries, the
// computed scale, the saturated count; the amax statistic too, except that where it is NaN only
// NaN-ness is compared (which NaN's payload survives depends on the fold order). Dequantisation:
// bit for bit, NaN compared as NaN (a GPU multiply returns the canonical NaN, the CPU the input's).
// Every CUDA result is computed twice, into buffers filled with garbage first, and the two must
// be bit-identical (and so every byte was written).
//
// GEMM tolerance, per element: S = Σ_k |ā_ik·b̄_jk| (+ |c0_ij| when accumulating), ā and b̄ the
// dequantised operands. The CPU multiplies the exact f32 values in f32; cuBLASLt's FP8 kernels
// form exact products of the stored values but accumulate inside the tensor cores with a reduced
// precision (about 2^-14 relative, DeepSeek-V3's report) between promotions to f32 (split
// accumulation), and apply the scales to the partial sums; the dequantised paths are f32 or bf16
// GEMMs of exact values. 1e-3·S covers all of these several times over, while a wrong scale,
// layout or transpose gives errors of order S (the sources' magnitudes vary by up to 2^16
// between rows and between 128-column blocks, so that every misplaced scale shows).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/fp8_math.h"
#include "engine/core/tensor.h"
#include "engine/ops/fp8/fp8.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

using ops::Fp8Scaling;
using ops::Fp8Tensor;

const char* Name(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::kTensor:
      return "tensor";
    case Fp8Scaling::kBlock1x128:
      return "1x128";
    case Fp8Scaling::kBlock128x128:
      return "128x128";
    case Fp8Scaling::kMx1x32:
      return "mx1x32";
  }
  return "?";
}

constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kBlock1x128,
                                    Fp8Scaling::kBlock128x128, Fp8Scaling::kMx1x32};

// A source (rows, cols) whose magnitudes vary by row and by 128-column block (2^-8 .. 2^8 each),
// so that every block gets its own scale. With `edges`: +inf, -inf and NaN elements, an all-zero
// 128-block (and, when there are 256 rows, an all-zero 128×128 tile), subnormals, a row of huge
// values (saturated under a fixed scale) and a block whose amax is exactly a power of two.
std::vector<float> RandomValues(int64_t rows, int64_t cols, bool edges, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> col_block_scale((cols + 127) / 128 + 1);
  for (float& s : col_block_scale) s = std::ldexp(1.0f, exponent(rng));
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, exponent(rng));
    for (int64_t c = 0; c < cols; ++c) {
      v[r * cols + c] = normal(rng) * row_scale * col_block_scale[c / 128];
    }
  }
  if (!edges) return v;
  const float inf = std::numeric_limits<float>::infinity();
  auto at = [&](int64_t r, int64_t c) -> float* {
    return r >= 0 && c >= 0 && r < rows && c < cols ? &v[r * cols + c] : nullptr;
  };
  if (float* p = at(0, 3)) *p = inf;
  if (float* p = at(rows / 2, cols - 1)) *p = -inf;
  if (float* p = at(1, cols / 2)) *p = std::numeric_limits<float>::quiet_NaN();
  for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) {
    if (float* p = at(2, c)) *p = 0.0f;
  }
  for (int64_t c = 0; c < cols; c += 3) {
    if (float* p = at(3, c)) *p = (c % 2 ? -1.0f : 1.0f) * 1e-40f;
  }
  for (int64_t c = 0; c < cols; ++c) {
    if (float* p = at(4, c)) *p = (c % 2 ? -3.0e30f : 2.5e30f);
  }
  for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) {
    if (float* p = at(5, c)) *p = c == 7 ? 448.0f : 0.5f * (c % 5);
  }
  if (rows >= 256) {
    for (int64_t r = 128; r < 256; ++r) {
      for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) *at(r, c) = 0.0f;
    }
  }
  return v;
}

// A host tensor of `dtype` and `shape` whose bytes are all `byte`: what a CUDA output buffer
// holds before the op, so that a byte it forgets to write shows.
Tensor Garbage(DType dtype, std::vector<int64_t> shape, uint8_t byte) {
  Tensor t = Tensor::Empty(dtype, shape);
  std::memset(t.view().raw(), byte, static_cast<size_t>(t.numel()) * DTypeSize(dtype));
  return t;
}

// An Fp8Tensor view over device tensors.
Fp8Tensor View(Fp8Format format, Fp8Scaling scaling, int64_t rows, int64_t cols, const Tensor& data,
               const Tensor& scale_inv) {
  return {.format = format,
          .scaling = scaling,
          .rows = rows,
          .cols = cols,
          .data = data.view(),
          .scale_inv = scale_inv.view()};
}

::testing::AssertionResult SameBits(const TensorView& expected, const TensorView& actual,
                                    bool nan_as_nan, const std::string& what) {
  if (expected.dtype() != actual.dtype() || expected.shape() != actual.shape()) {
    return ::testing::AssertionFailure() << what << ": dtype or shape differ";
  }
  const int64_t n = expected.numel();
  const size_t size = DTypeSize(expected.dtype());
  const auto* e = static_cast<const uint8_t*>(expected.raw());
  const auto* a = static_cast<const uint8_t*>(actual.raw());
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(e + i * size, a + i * size, size) == 0) continue;
    if (nan_as_nan) {
      float x = 0.0f, y = 0.0f;
      if (expected.dtype() == DType::kF32) {
        std::memcpy(&x, e + i * size, 4);
        std::memcpy(&y, a + i * size, 4);
      } else if (expected.dtype() == DType::kBF16) {
        uint16_t bx, by;
        std::memcpy(&bx, e + i * size, 2);
        std::memcpy(&by, a + i * size, 2);
        const uint32_t wx = static_cast<uint32_t>(bx) << 16, wy = static_cast<uint32_t>(by) << 16;
        std::memcpy(&x, &wx, 4);
        std::memcpy(&y, &wy, 4);
      }
      if (std::isnan(x) && std::isnan(y)) continue;
    }
    ::testing::AssertionResult failure = ::testing::AssertionFailure();
    failure << what << ": element " << i << " of " << n << " differs: bytes";
    for (size_t b = 0; b < size; ++b) failure << " " << int{e[i * size + b]};
    failure << " (CPU) vs";
    for (size_t b = 0; b < size; ++b) failure << " " << int{a[i * size + b]};
    return failure << " (CUDA)";
  }
  return ::testing::AssertionSuccess();
}

struct QuantizeCase {
  DType dtype;
  Fp8Format format;
  Fp8Scaling scaling;
  bool transpose;
  bool compute_scale;  // kTensor only
  bool pow2;
  float epsilon;
  int64_t rows, cols;  // of the source
  bool edges;
};

std::string Describe(const QuantizeCase& c) {
  return absl::StrCat(
      std::string(DTypeName(c.dtype)), " ", c.format == Fp8Format::kE4M3 ? "e4m3" : "e5m2", " ",
      Name(c.scaling), c.transpose ? " transposed" : "",
      c.scaling == Fp8Scaling::kTensor ? (c.compute_scale ? " current" : " delayed") : "",
      c.pow2 ? " pow2" : "", " eps ", c.epsilon, " src (", c.rows, ", ", c.cols, ")",
      c.edges ? " with inf/NaN/zero/huge" : "");
}

// Quantises one source on the CPU and twice on CUDA; compares everything, and dequantises the
// result on both (f32 and bf16).
void CheckQuantize(const ExecContext& gpu, const QuantizeCase& c, std::mt19937& rng) {
  SCOPED_TRACE(Describe(c));
  const ExecContext& cpu = ExecContext::Cpu();
  const Tensor src =
      test_util::MakeTensor(c.dtype, {c.rows, c.cols}, RandomValues(c.rows, c.cols, c.edges, rng));
  const int64_t out_rows = c.transpose ? c.cols : c.rows;
  const int64_t out_cols = c.transpose ? c.rows : c.cols;
  const std::array<int64_t, 2> scale_shape = ops::Fp8ScaleShape(c.scaling, out_rows, out_cols);
  // A delayed scale that saturates the huge row and is not a power of two; the statistics start
  // from non-trivial values, which the op must fold into.
  const Tensor initial_scale = test_util::MakeTensor(DType::kF32, {1}, {3.0f});
  const Tensor initial_amax = test_util::MakeTensor(DType::kF32, {1}, {0.375f});
  Tensor initial_saturated = Tensor::Empty(DType::kI64, {1});
  initial_saturated.data<int64_t>()[0] = 5;

  absl::StatusOr<ops::OwnedFp8Tensor> cpu_out =
      ops::AllocateFp8Tensor(cpu, c.format, c.scaling, out_rows, out_cols);
  ASSERT_TRUE(cpu_out.ok()) << cpu_out.status();
  Tensor cpu_scale = test_util::MakeTensor(DType::kF32, {1}, {3.0f});
  Tensor cpu_amax = test_util::MakeTensor(DType::kF32, {1}, {0.375f});
  Tensor cpu_saturated = Tensor::Empty(DType::kI64, {1});
  cpu_saturated.data<int64_t>()[0] = 5;
  ops::Fp8QuantizeArgs args{.src = src,
                            .transpose = c.transpose,
                            .pow2_scales = c.pow2,
                            .amax_epsilon = c.epsilon,
                            .scale = cpu_scale,
                            .compute_scale = c.compute_scale,
                            .out = cpu_out->view,
                            .amax = cpu_amax,
                            .saturated = cpu_saturated};
  if (c.scaling != Fp8Scaling::kTensor) {
    args.scale = TensorView();
    args.compute_scale = false;
  }
  ASSERT_OK(ops::Fp8Quantize(cpu, args));

  const Tensor src_d = test_util::ToDevice(gpu, src);
  Tensor results[2][5];  // data, scale_inv, scale, amax, saturated of each CUDA run
  for (int run = 0; run < 2; ++run) {
    const Tensor data_d = test_util::ToDevice(
        gpu, Garbage(ops::Fp8DType(c.format), {out_rows, ops::Fp8PaddedCols(out_cols)}, 0xA5));
    const Tensor scale_inv_d =
        test_util::ToDevice(gpu, Garbage(DType::kF32, {scale_shape[0], scale_shape[1]}, 0xFF));
    const Tensor scale_d = test_util::ToDevice(gpu, initial_scale);
    const Tensor amax_d = test_util::ToDevice(gpu, initial_amax);
    const Tensor saturated_d = test_util::ToDevice(gpu, initial_saturated);
    ops::Fp8QuantizeArgs gpu_args = args;
    gpu_args.src = src_d;
    gpu_args.out = View(c.format, c.scaling, out_rows, out_cols, data_d, scale_inv_d);
    gpu_args.amax = amax_d;
    gpu_args.saturated = saturated_d;
    if (c.scaling == Fp8Scaling::kTensor) gpu_args.scale = scale_d;
    ASSERT_OK(ops::Fp8Quantize(gpu, gpu_args));
    results[run][0] = test_util::ToHost(gpu, data_d);
    results[run][1] = test_util::ToHost(gpu, scale_inv_d);
    results[run][2] = test_util::ToHost(gpu, scale_d);
    results[run][3] = test_util::ToHost(gpu, amax_d);
    results[run][4] = test_util::ToHost(gpu, saturated_d);
  }
  EXPECT_TRUE(SameBits(cpu_out->data, results[0][0], false, "data"));
  EXPECT_TRUE(SameBits(cpu_out->scale_inv, results[0][1], false, "scale_inv"));
  EXPECT_TRUE(SameBits(cpu_scale, results[0][2], false, "scale"));
  EXPECT_TRUE(SameBits(cpu_amax, results[0][3], true, "amax"));
  EXPECT_EQ(cpu_saturated.data<int64_t>()[0], results[0][4].data<int64_t>()[0]) << "saturated";
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(test_util::SameBytes(results[0][i], results[1][i]))
        << "output " << i << " (data, scale_inv, scale, amax, saturated) differs between runs";
  }

  // Dequantise the CPU's tensor on both.
  const Tensor data_d = test_util::ToDevice(gpu, cpu_out->data);
  const Tensor scale_inv_d = test_util::ToDevice(gpu, cpu_out->scale_inv);
  const Fp8Tensor on_gpu = View(c.format, c.scaling, out_rows, out_cols, data_d, scale_inv_d);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor expected = Tensor::Empty(dtype, {out_rows, out_cols});
    ASSERT_OK(ops::Fp8Dequantize(cpu, cpu_out->view, expected));
    const Tensor dst_d = test_util::ToDevice(gpu, Garbage(dtype, {out_rows, out_cols}, 0x5A));
    ASSERT_OK(ops::Fp8Dequantize(gpu, on_gpu, dst_d));
    EXPECT_TRUE(SameBits(expected, test_util::ToHost(gpu, dst_d), true,
                         absl::StrCat("dequantised to ", std::string(DTypeName(dtype)))));
  }
}

TEST(Fp8CudaTest, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  // Not multiples of 16, 32 or 128, single elements, exact multiples, several 128-tiles; empty.
  const std::pair<int64_t, int64_t> shapes[] = {
      {1, 1}, {5, 37}, {7, 128}, {64, 256}, {130, 200}, {257, 300}, {300, 129}, {0, 16}, {9, 0}};
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
      for (const Fp8Scaling scaling : kScalings) {
        for (const bool transpose : {false, true}) {
          for (const auto& [rows, cols] : shapes) {
            for (const bool edges : {false, true}) {
              const bool pow2 = (rows + cols + edges) % 2 == 0;
              const float epsilon = edges ? 1e-6f : 0.0f;
              const bool tensor = scaling == Fp8Scaling::kTensor;
              for (const bool compute_scale : {true, false}) {
                if (!tensor && !compute_scale) continue;
                CheckQuantize(gpu,
                              {dtype, format, scaling, transpose, tensor && compute_scale, pow2,
                               epsilon, rows, cols, edges},
                              rng);
                if (HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// Enough elements for every grid-stride loop to go round several times, and many CTAs folding
// the statistics.
TEST(Fp8CudaTest, LargeQuantizeMatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (const Fp8Scaling scaling : kScalings) {
    for (const bool transpose : {false, true}) {
      CheckQuantize(gpu,
                    {DType::kBF16, Fp8Format::kE4M3, scaling, transpose, true, false, 0.0f,
                     4096 + 3, 2048 + 40, true},
                    rng);
      if (HasFatalFailure()) return;
    }
  }
}

// A source quantised on the CPU, and the same tensor copied to the device.
struct Operand {
  ops::OwnedFp8Tensor cpu;
  Tensor data_d, scale_inv_d;
  Fp8Tensor gpu;
  std::vector<double> values;  // dequantised (f32), row-major (rows, cols)
};

Operand MakeOperand(const ExecContext& gpu, Fp8Format format, Fp8Scaling scaling, int64_t rows,
                    int64_t cols, std::mt19937& rng) {
  const ExecContext& cpu = ExecContext::Cpu();
  Operand op;
  const Tensor src =
      test_util::MakeTensor(DType::kF32, {rows, cols}, RandomValues(rows, cols, false, rng));
  absl::StatusOr<ops::OwnedFp8Tensor> out =
      ops::AllocateFp8Tensor(cpu, format, scaling, rows, cols);
  EXPECT_TRUE(out.ok()) << out.status();
  op.cpu = *std::move(out);
  Tensor scale = Tensor::Zeros(DType::kF32, {1});
  ops::Fp8QuantizeArgs args{.src = src,
                            .scale = TensorView(),
                            .out = op.cpu.view,
                            .amax = TensorView(),
                            .saturated = TensorView()};
  if (scaling == Fp8Scaling::kTensor) {
    args.scale = scale;
    args.compute_scale = true;
  }
  const absl::Status quantized = ops::Fp8Quantize(cpu, args);
  EXPECT_TRUE(quantized.ok()) << quantized;
  op.data_d = test_util::ToDevice(gpu, op.cpu.data);
  op.scale_inv_d = test_util::ToDevice(gpu, op.cpu.scale_inv);
  op.gpu = View(format, scaling, rows, cols, op.data_d, op.scale_inv_d);
  Tensor values = Tensor::Empty(DType::kF32, {rows, cols});
  const absl::Status dequantized = ops::Fp8Dequantize(cpu, op.cpu.view, values);
  EXPECT_TRUE(dequantized.ok()) << dequantized;
  op.values = test_util::ToDoubles(values);
  return op;
}

TEST(Fp8CudaTest, GemmMatchesTheCpuAndRepeatsBitIdentically) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const ExecContext& cpu = ExecContext::Cpu();
  struct Pair {
    Fp8Scaling a, b;
    Fp8Format fa, fb;
  };
  const Pair pairs[] = {
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Format::kE5M2, Fp8Format::kE4M3},
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Format::kE4M3, Fp8Format::kE5M2},
      {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock1x128, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock128x128, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kBlock128x128, Fp8Scaling::kBlock1x128, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock1x128, Fp8Format::kE5M2, Fp8Format::kE4M3},
      {Fp8Scaling::kMx1x32, Fp8Scaling::kMx1x32, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kMx1x32, Fp8Scaling::kMx1x32, Fp8Format::kE4M3, Fp8Format::kE5M2},
  };
  // (M, N, K): aligned; N not a multiple of 8 (block scaling falls back); K not a multiple of
  // 16 or 128; several 128-tiles each way; one row; K = 0.
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {
      {128, 256, 256}, {64, 12, 200}, {200, 136, 300}, {1, 8, 40}, {33, 16, 1000}, {8, 8, 0}};
  for (const Pair& pair : pairs) {
    for (const auto& [m, n, k] : shapes) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(absl::StrCat(Name(pair.a), " x ", Name(pair.b), " formats ",
                                  static_cast<int>(pair.fa), "/", static_cast<int>(pair.fb), " (",
                                  m, ", ", n, ", ", k, ")", accumulate ? " accumulate" : ""));
        const Operand a = MakeOperand(gpu, pair.fa, pair.a, m, k, rng);
        const Operand b = MakeOperand(gpu, pair.fb, pair.b, n, k, rng);
        std::vector<float> c0_values(static_cast<size_t>(m * n));
        std::normal_distribution<float> normal;
        for (float& v : c0_values) v = normal(rng);
        Tensor c_cpu = test_util::MakeTensor(DType::kF32, {m, n}, c0_values);
        ASSERT_OK(ops::Fp8Gemm(
            cpu, {.a = a.cpu.view, .b = b.cpu.view, .c = c_cpu, .accumulate = accumulate}));
        Tensor c_gpu[2];
        for (Tensor& result : c_gpu) {
          const Tensor c_d =
              test_util::ToDevice(gpu, test_util::MakeTensor(DType::kF32, {m, n}, c0_values));
          ASSERT_OK(
              ops::Fp8Gemm(gpu, {.a = a.gpu, .b = b.gpu, .c = c_d, .accumulate = accumulate}));
          result = test_util::ToHost(gpu, c_d);
        }
        EXPECT_TRUE(test_util::SameBytes(c_gpu[0], c_gpu[1])) << "CUDA runs differ";
        const float* expected = c_cpu.data<float>();
        const float* actual = c_gpu[0].data<float>();
        int64_t reported = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = accumulate ? std::fabs(c0_values[i * n + j]) : 0.0;
            for (int64_t p = 0; p < k; ++p) {
              s += std::fabs(a.values[i * k + p] * b.values[j * k + p]);
            }
            const double error = std::fabs(double{actual[i * n + j]} - expected[i * n + j]);
            if (!(error <= 1e-3 * s + 1e-30) && reported++ < 5) {
              ADD_FAILURE() << "c[" << i << ", " << j << "] = " << actual[i * n + j] << " on CUDA, "
                            << expected[i * n + j] << " on the CPU; S = " << s;
            }
          }
        }
        if (reported > 0) return;
      }
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
