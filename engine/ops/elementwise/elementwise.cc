#include "engine/ops/elementwise/elementwise.h"

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/elementwise/elementwise_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/elementwise/elementwise_cuda.h"
#endif

namespace moetrain::ops {
namespace {

std::string Describe(const TensorView& t) { return t.empty() ? "none" : t.DebugString(); }

}  // namespace

absl::Status ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "convert", {{"src", src}, {"dst", dst}}));
  if (src.empty() || dst.empty() || !IsActDType(src.dtype()) || !IsActDType(dst.dtype()) ||
      src.shape() != dst.shape() || !src.is_contiguous() || !dst.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("convert: cannot convert ", Describe(src), " into ", Describe(dst)));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::ConvertTensor(ctx, src, dst);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "convert");
  cpu::ConvertTensor(ctx, src, dst);
  return absl::OkStatus();
}

absl::Status CopyTensor(const ExecContext& ctx, TensorView src, TensorView dst) {
  for (const auto& [name, t] : {std::pair{"src", src}, {"dst", dst}}) {
    if (!t.empty() && !t.device().is_cpu() && t.device() != ctx.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy: ", name, " is on ", t.device().DebugString(),
                       ", neither the CPU nor the op's device ", ctx.device().DebugString()));
    }
  }
  // A strided source is gathered on the host; between devices both sides are dense.
  const bool src_ok = src.is_contiguous() || src.device().is_cpu();
  if (src.empty() || dst.empty() || src.dtype() != dst.dtype() || src.shape() != dst.shape() ||
      !src_ok || !dst.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy: cannot copy ", Describe(src), " into ", Describe(dst),
                     " (of one dtype and shape, dst dense, src dense or on the host)"));
  }
#if MOETRAIN_HAVE_CUDA
  // A copy between two host tensors needs no device, whatever ctx's is.
  const bool host_only = src.device().is_cpu() && dst.device().is_cpu();
  if (ctx.device().type == DeviceType::kCuda && !host_only) return cuda::CopyTensor(ctx, src, dst);
#endif
  if (!src.device().is_cpu() || !dst.device().is_cpu()) return NoBackend(ctx, "copy");
  cpu::CopyToDense(src, dst);
  return absl::OkStatus();
}

absl::Status CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                         int64_t dst_col, int64_t cols) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "copy columns", {{"src", src}, {"dst", dst}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(src, "copy columns src", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(dst, "copy columns dst", {src.dim(0), -1}));
  if (src.dtype() != dst.dtype() || cols < 0 || src_col < 0 || dst_col < 0 ||
      src_col + cols > src.dim(1) || dst_col + cols > dst.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("copy columns: cannot copy columns [", src_col,
                                                   ", ", src_col + cols, ") of ", src.DebugString(),
                                                   " to columns [", dst_col, ", ", dst_col + cols,
                                                   ") of ", dst.DebugString()));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::CopyColumns(ctx, src, src_col, dst, dst_col, cols);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "copy columns");
  cpu::CopyColumns(ctx, src, src_col, dst, dst_col, cols);
  return absl::OkStatus();
}

absl::Status Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "add", {{"a", a}, {"b", b}, {"out", out}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(a, "add a", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(b, "add b", {a.dim(0), a.dim(1)}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(out, "add out", DType::kF32, {a.dim(0), a.dim(1)}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Add(ctx, a, b, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "add");
  cpu::Add(ctx, a, b, out);
  return absl::OkStatus();
}

absl::Status Fill(const ExecContext& ctx, TensorView t, float value) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "fill", {{"t", t}}));
  const bool dtype_ok =
      !t.empty() && (IsActDType(t.dtype()) || t.dtype() == DType::kI32 || t.dtype() == DType::kI64);
  if (!dtype_ok || (!t.is_contiguous() && !t.device().is_cpu())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fill: t must be an f32, bf16, i32 or i64 tensor (dense off the host), got ", Describe(t)));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Fill(ctx, t, value);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "fill");
  cpu::Fill(ctx, t, value);
  return absl::OkStatus();
}

absl::Status FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean,
                        float stddev) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "fill normal", {{"t", t}}));
  if (t.empty() || t.dtype() != DType::kF32 || !t.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill normal: t must be a dense f32 tensor, got ", Describe(t)));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::FillNormal(ctx, t, rng, mean, stddev);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "fill normal");
  cpu::FillNormal(ctx, t, rng, mean, stddev);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
