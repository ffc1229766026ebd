#include "engine/ops/norm/rms_norm.h"

#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/norm/rms_norm_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/norm/rms_norm_cuda.h"
#endif

namespace moetrain::ops {

absl::Status RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                            TensorView out, TensorView rstd) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "rms_norm", {{"x", x}, {"weight", weight}, {"out", out}, {"rstd", rstd}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(x, "rms_norm x", DType::kF32, {-1, -1}));
  const int64_t t = x.dim(0), d = x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weight, "rms_norm weight", DType::kF32, {d}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "rms_norm out", {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rstd, "rms_norm rstd", DType::kF32, {t}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::RmsNormForward(ctx, x, weight, eps, out, rstd);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "rms_norm");
  cpu::RmsNormForward(ctx, x, weight, eps, out, rstd);
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "rms_norm backward",
                                        {{"x", args.x},
                                         {"weight", args.weight},
                                         {"rstd", args.rstd},
                                         {"d_out", args.d_out},
                                         {"d_x", args.d_x},
                                         {"d_weight", args.d_weight}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.x, "rms_norm x", DType::kF32, {-1, -1}));
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.weight, "rms_norm weight", DType::kF32, {d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.rstd, "rms_norm rstd", DType::kF32, {t}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.d_out, "rms_norm d_out", {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.d_x, "rms_norm d_x", DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.d_weight, "rms_norm d_weight", DType::kF32, {d}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::RmsNormBackward(ctx, args);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "rms_norm backward");
  cpu::RmsNormBackward(ctx, args);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
