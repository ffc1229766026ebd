#include "engine/ops/optim/optim.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/optim/optim_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/optim/optim_cuda.h"
#endif

namespace moetrain::ops {
namespace {

// Dense tensors of `dtype` (f32 unless said) on ctx's device.
absl::Status CheckTensors(const ExecContext& ctx, const char* op, const char* what,
                          absl::Span<const TensorView> tensors, DType dtype = DType::kF32) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = absl::StrCat(what, "[", i, "]");
    MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, op, {{name, tensors[i]}}));
    if (tensors[i].empty() || tensors[i].dtype() != dtype || !tensors[i].is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", name, " must be a dense ", std::string(DTypeName(dtype)), " tensor, got ",
          tensors[i].empty() ? std::string("none") : tensors[i].DebugString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(const ExecContext& ctx, const AdamWStepArgs& args) {
  const size_t n = args.params.size();
  if (args.grads.size() != n || args.exp_avg.size() != n || args.exp_avg_sq.size() != n ||
      args.weight_decay == nullptr || args.weight_decay->size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adamw: ", n, " params need as many grads, exp_avg, exp_avg_sq and weight_decay flags"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "adamw", "params", args.params));
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "adamw", "grads", args.grads));
  // The moments' dtype is the first one's: f32 or bf16, the same for all.
  const DType moments = n > 0 && !args.exp_avg[0].empty() && args.exp_avg[0].dtype() == DType::kBF16
                            ? DType::kBF16
                            : DType::kF32;
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "adamw", "exp_avg", args.exp_avg, moments));
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "adamw", "exp_avg_sq", args.exp_avg_sq, moments));
  for (size_t i = 0; i < n; ++i) {
    for (const TensorView* t : {&args.grads[i], &args.exp_avg[i], &args.exp_avg_sq[i]}) {
      if (t->shape() != args.params[i].shape()) {
        return absl::InvalidArgumentError(absl::StrCat("adamw: tensor ", t->DebugString(),
                                                       " does not match params[", i, "] ",
                                                       args.params[i].DebugString()));
      }
    }
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::AdamWStep(ctx, args);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "adamw");
  cpu::AdamWStep(ctx, args);
  return absl::OkStatus();
}

absl::StatusOr<double> SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "squared norm", "tensors", tensors));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::SquaredNorm(ctx, tensors);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "squared norm");
  return cpu::SquaredNorm(ctx, tensors);
}

absl::Status ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors,
                          float scale) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "scale", "tensors", tensors));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::ScaleTensors(ctx, tensors, scale);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "scale");
  cpu::ScaleTensors(ctx, tensors, scale);
  return absl::OkStatus();
}

absl::StatusOr<bool> AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensors(ctx, "all finite", "tensors", tensors));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::AllFinite(ctx, tensors);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "all finite");
  return cpu::AllFinite(ctx, tensors);
}

absl::Status CheckAdamWMoments(const ExecContext& ctx, std::string_view m_name, TensorView m,
                               std::string_view v_name, TensorView v) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "adamw state", {{m_name, m}, {v_name, v}}));
  for (const auto& [name, t] : {std::pair{m_name, m}, {v_name, v}}) {
    if (t.empty() || t.dtype() != DType::kF32 || !t.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adamw state: ", absl::string_view(name.data(), name.size()),
          " must be a dense f32 tensor, got ", t.empty() ? std::string("none") : t.DebugString()));
    }
  }
  if (m.numel() != v.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("adamw state: ", m.DebugString(), " and ",
                                                   v.DebugString(), " differ in size"));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::CheckAdamWMoments(ctx, m_name, m, v_name, v);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "adamw state");
  return cpu::CheckAdamWMoments(m_name, m, v_name, v);
}

}  // namespace moetrain::ops
