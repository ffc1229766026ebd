#include "engine/ops/fp8/fp8.h"

#include <cmath>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/fp8/fp8_cpu.h"
#include "engine/ops/gemm/gemm.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/fp8/fp8_cuda.h"
#endif

namespace moetrain::ops {
namespace {

// Debian's Abseil has its own string_view type: StrCat takes std::string_view only through it.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t Pad4(int64_t n) { return (n + 3) / 4 * 4; }

const char* ScalingName(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kTensor:
      return "tensor";
    case Fp8Scaling::kBlock1x128:
      return "block1x128";
    case Fp8Scaling::kBlock128x128:
      return "block128x128";
    case Fp8Scaling::kMx1x32:
      return "mx1x32";
  }
  return "invalid";
}

absl::Status CheckFormatAndScaling(Fp8Format format, Fp8Scaling scaling, std::string_view name) {
  if (format != Fp8Format::kE4M3 && format != Fp8Format::kE5M2) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(name), ": invalid FP8 format ", static_cast<int>(format)));
  }
  if (static_cast<int>(scaling) > static_cast<int>(Fp8Scaling::kMx1x32)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(name), ": invalid FP8 scaling ", static_cast<int>(scaling)));
  }
  return absl::OkStatus();
}

// An Fp8Tensor's views agree with its format, scaling, rows and cols (fp8.h's layout).
absl::Status CheckFp8Tensor(const Fp8Tensor& t, std::string_view name) {
  MOETRAIN_RETURN_IF_ERROR(CheckFormatAndScaling(t.format, t.scaling, name));
  if (t.rows < 0 || t.cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(name), ": rows = ", t.rows, " and cols = ", t.cols, " must be >= 0"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(t.data, absl::StrCat(Sv(name), ".data"),
                                            Fp8DType(t.format), {t.rows, Fp8PaddedCols(t.cols)}));
  const std::array<int64_t, 2> shape = Fp8ScaleShape(t.scaling, t.rows, t.cols);
  return CheckDenseTensor(t.scale_inv, absl::StrCat(Sv(name), ".scale_inv"), DType::kF32,
                          {shape[0], shape[1]});
}

// A (1) tensor of `dtype` (a one-element view of any rank).
absl::Status CheckScalar(const TensorView& t, std::string_view name, DType dtype) {
  if (t.dtype() != dtype || t.numel() != 1 || !t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(name), ": expected one ", Sv(DTypeName(dtype)), " element, got ", t.DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace

DType Fp8DType(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? DType::kF8E4M3 : DType::kF8E5M2;
}

int64_t Fp8PaddedCols(int64_t cols) { return (cols + 15) / 16 * 16; }

std::array<int64_t, 2> Fp8ScaleShape(Fp8Scaling scaling, int64_t rows, int64_t cols) {
  switch (scaling) {
    case Fp8Scaling::kTensor:
      return {1, 1};
    case Fp8Scaling::kBlock1x128:
      return {CeilDiv(cols, 128), Pad4(rows)};
    case Fp8Scaling::kBlock128x128:
      return {CeilDiv(rows, 128), Pad4(CeilDiv(cols, 128))};
    case Fp8Scaling::kMx1x32:
      return {rows, CeilDiv(cols, 32)};
  }
  return {0, 0};
}

absl::StatusOr<OwnedFp8Tensor> AllocateFp8Tensor(const ExecContext& ctx, Fp8Format format,
                                                 Fp8Scaling scaling, int64_t rows, int64_t cols) {
  MOETRAIN_RETURN_IF_ERROR(CheckFormatAndScaling(format, scaling, "AllocateFp8Tensor"));
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllocateFp8Tensor: rows = ", rows, " and cols = ", cols, " must be >= 0"));
  }
  OwnedFp8Tensor owned;
  MOETRAIN_ASSIGN_OR_RETURN(
      owned.data, Tensor::Allocate(ctx.allocator(), Fp8DType(format), {rows, Fp8PaddedCols(cols)}));
  const std::array<int64_t, 2> shape = Fp8ScaleShape(scaling, rows, cols);
  MOETRAIN_ASSIGN_OR_RETURN(owned.scale_inv,
                            Tensor::Allocate(ctx.allocator(), DType::kF32, {shape[0], shape[1]}));
  owned.view = {.format = format,
                .scaling = scaling,
                .rows = rows,
                .cols = cols,
                .data = owned.data.view(),
                .scale_inv = owned.scale_inv.view()};
  return owned;
}

absl::Status Fp8Quantize(const ExecContext& ctx, const Fp8QuantizeArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "fp8 quantize",
                                        {{"src", args.src},
                                         {"scale", args.scale},
                                         {"out.data", args.out.data},
                                         {"out.scale_inv", args.out.scale_inv},
                                         {"amax", args.amax},
                                         {"saturated", args.saturated}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.src, "fp8 quantize src", {-1, -1}));
  const int64_t rows = args.transpose ? args.src.dim(1) : args.src.dim(0);
  const int64_t cols = args.transpose ? args.src.dim(0) : args.src.dim(1);
  if (args.out.rows != rows || args.out.cols != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 quantize out: (rows, cols) = (", args.out.rows, ", ", args.out.cols, "), but src ",
        args.src.DebugString(), " with transpose = ", args.transpose ? "true" : "false", " needs (",
        rows, ", ", cols, ")"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckFp8Tensor(args.out, "fp8 quantize out"));
  if (!(args.amax_epsilon >= 0.0f) || std::isinf(args.amax_epsilon)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 quantize amax_epsilon = ", args.amax_epsilon, " must be finite and >= 0"));
  }
  // Only kTensor reads or writes `scale` (and compute_scale); the block scalings ignore both.
  if (args.out.scaling == Fp8Scaling::kTensor) {
    if (args.scale.empty()) {
      return absl::InvalidArgumentError(
          "fp8 quantize scale: empty, but kTensor scaling needs a (1) f32 scale (read with "
          "compute_scale = false, written with true)");
    }
    MOETRAIN_RETURN_IF_ERROR(CheckScalar(args.scale, "fp8 quantize scale", DType::kF32));
  }
  if (!args.amax.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckScalar(args.amax, "fp8 quantize amax", DType::kF32));
  }
  if (!args.saturated.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckScalar(args.saturated, "fp8 quantize saturated", DType::kI64));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Fp8Quantize(ctx, args);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "fp8 quantize");
  cpu::Fp8Quantize(ctx, args);
  return absl::OkStatus();
}

absl::Status Fp8Dequantize(const ExecContext& ctx, const Fp8Tensor& src, TensorView dst) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "fp8 dequantize",
                   {{"src.data", src.data}, {"src.scale_inv", src.scale_inv}, {"dst", dst}}));
  MOETRAIN_RETURN_IF_ERROR(CheckFp8Tensor(src, "fp8 dequantize src"));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(dst, "fp8 dequantize dst", {src.rows, src.cols}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Fp8Dequantize(ctx, src, dst);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "fp8 dequantize");
  cpu::Fp8Dequantize(ctx, src, dst);
  return absl::OkStatus();
}

namespace {

// The CPU's FP8 GEMM: exact quantisation, products in bf16 where that is exact, else f32.
//   kTensor × kTensor: c [+]= (sa·sb)·(qa·qbᵀ), as the per-tensor FP8 GEMM computes it: the
//     stored values are exact in bf16, their products exact in f32, the sums f32.
//   block scalings: the dequantised values q·s are exact in bf16 when every factor s is a power of
//     two not too small for bf16 to hold q·s (MXFP8 always; blockwise with its default power-of-two
//     scales), then multiplied in bf16; otherwise in f32.
absl::Status CpuFp8Gemm(const ExecContext& ctx, const Fp8GemmArgs& args) {
  const Fp8Tensor& a = args.a;
  const Fp8Tensor& b = args.b;
  if (a.scaling == Fp8Scaling::kTensor) {
    MOETRAIN_ASSIGN_OR_RETURN(Tensor one, Tensor::Allocate(ctx.allocator(), DType::kF32, {1, 1}));
    one.data<float>()[0] = 1.0f;
    Fp8Tensor a_codes = a, b_codes = b;
    a_codes.scale_inv = b_codes.scale_inv = one;
    MOETRAIN_ASSIGN_OR_RETURN(Tensor a_values,
                              Tensor::Allocate(ctx.allocator(), DType::kBF16, {a.rows, a.cols}));
    MOETRAIN_ASSIGN_OR_RETURN(Tensor b_values,
                              Tensor::Allocate(ctx.allocator(), DType::kBF16, {b.rows, b.cols}));
    MOETRAIN_ASSIGN_OR_RETURN(Tensor products,
                              Tensor::Allocate(ctx.allocator(), DType::kF32, {a.rows, b.rows}));
    cpu::Fp8Dequantize(ctx, a_codes, a_values);
    cpu::Fp8Dequantize(ctx, b_codes, b_values);
    MOETRAIN_RETURN_IF_ERROR(
        Gemm(ctx, {.a = a_values, .b = b_values, .c = products, .trans_b = true}));
    const float factor = a.scale_inv.data<float>()[0] * b.scale_inv.data<float>()[0];
    cpu::ScaleProducts(ctx, products, factor, args.accumulate, args.c);
    return absl::OkStatus();
  }
  const DType dtype =
      cpu::Fp8ValuesExactInBf16(a) && cpu::Fp8ValuesExactInBf16(b) ? DType::kBF16 : DType::kF32;
  MOETRAIN_ASSIGN_OR_RETURN(Tensor a_values,
                            Tensor::Allocate(ctx.allocator(), dtype, {a.rows, a.cols}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor b_values,
                            Tensor::Allocate(ctx.allocator(), dtype, {b.rows, b.cols}));
  cpu::Fp8Dequantize(ctx, a, a_values);
  cpu::Fp8Dequantize(ctx, b, b_values);
  return Gemm(
      ctx,
      {.a = a_values, .b = b_values, .c = args.c, .trans_b = true, .accumulate = args.accumulate});
}

}  // namespace

absl::Status Fp8Gemm(const ExecContext& ctx, const Fp8GemmArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "fp8 gemm",
                                        {{"a.data", args.a.data},
                                         {"a.scale_inv", args.a.scale_inv},
                                         {"b.data", args.b.data},
                                         {"b.scale_inv", args.b.scale_inv},
                                         {"c", args.c}}));
  MOETRAIN_RETURN_IF_ERROR(CheckFp8Tensor(args.a, "fp8 gemm a"));
  MOETRAIN_RETURN_IF_ERROR(CheckFp8Tensor(args.b, "fp8 gemm b"));
  const Fp8Tensor& a = args.a;
  const Fp8Tensor& b = args.b;
  if (a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat("fp8 gemm: a is (", a.rows, ", ", a.cols,
                                                   ") and b is (", b.rows, ", ", b.cols,
                                                   "): their K (cols) differ"));
  }
  const bool block_a =
      a.scaling == Fp8Scaling::kBlock1x128 || a.scaling == Fp8Scaling::kBlock128x128;
  const bool block_b =
      b.scaling == Fp8Scaling::kBlock1x128 || b.scaling == Fp8Scaling::kBlock128x128;
  const bool pair_ok =
      (a.scaling == b.scaling && a.scaling != Fp8Scaling::kBlock128x128) ||
      (block_a && block_b &&
       (a.scaling == Fp8Scaling::kBlock1x128 || b.scaling == Fp8Scaling::kBlock1x128));
  if (!pair_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 gemm: scalings a = ", ScalingName(a.scaling), ", b = ", ScalingName(b.scaling),
        " are not a supported pair (tensor x tensor, block1x128 with block1x128 or "
        "block128x128 on either side, or mx1x32 x mx1x32)"));
  }
  if (a.format == Fp8Format::kE5M2 && b.format == Fp8Format::kE5M2) {
    return absl::InvalidArgumentError(
        "fp8 gemm: formats a = e5m2, b = e5m2 are not supported (one side must be e4m3)");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.c, "fp8 gemm c", DType::kF32, {a.rows, b.rows}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Fp8Gemm(ctx, args);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "fp8 gemm");
  if (a.rows == 0 || b.rows == 0) return absl::OkStatus();
  if (a.cols == 0) {
    if (!args.accumulate) {
      float* c = args.c.data<float>();
      for (int64_t i = 0; i < a.rows * b.rows; ++i) c[i] = 0.0f;
    }
    return absl::OkStatus();
  }
  return CpuFp8Gemm(ctx, args);
}

}  // namespace moetrain::ops
