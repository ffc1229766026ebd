#include "engine/ops/swiglu/swiglu.h"

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/swiglu/swiglu_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/swiglu/swiglu_cuda.h"
#endif

namespace moetrain::ops {

absl::Status SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "swiglu", {{"gate_up", gate_up}, {"out", out}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (gate_up.dim(1) != 2 * f) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu gate_up: ", gate_up.dim(1), " columns is not even"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "swiglu out", {rows, f}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::SwigluForward(ctx, gate_up, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "swiglu");
  cpu::SwigluForward(ctx, gate_up, out);
  return absl::OkStatus();
}

absl::Status SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                            TensorView d_gate_up) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "swiglu backward", {{"gate_up", gate_up}, {"d_out", d_out}, {"d_gate_up", d_gate_up}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (gate_up.dim(1) != 2 * f) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu gate_up: ", gate_up.dim(1), " columns is not even"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_out, "swiglu d_out", DType::kF32, {rows, f}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_gate_up, "swiglu d_gate_up", {rows, 2 * f}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::SwigluBackward(ctx, gate_up, d_out, d_gate_up);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "swiglu backward");
  cpu::SwigluBackward(ctx, gate_up, d_out, d_gate_up);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
