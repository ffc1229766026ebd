// The optimizer's ops over many tensors at once (multi-tensor: one pass over all of them, split
// among threads as one flat range): the AdamW update, the squared norm of the gradients, scaling
// them, the NaN/Inf check, and the check of a saved AdamW state. Tensors are dense f32 unless
// said otherwise. Every result is independent of the thread count: updates are elementwise, and
// the norm is summed over fixed blocks in a fixed order. The CUDA backend (optim_cuda.h) gives
// the CPU's bits for every finite result: the same rounding per operation, the same order.
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/optim/adamw_math.h"

namespace moetrain::ops {

// Tensor i: params[i] updated from grads[i] with its moments exp_avg[i] and exp_avg_sq[i] (all of
// params[i]'s shape), by `decaying` when weight_decay[i] and by `plain` otherwise. The moments are
// all f32, or all bf16 (AdamWUpdateElementBf16). Bit-identical on every CPU and GPU: no
// multiply-add is ever fused (adamw_math.h).
struct AdamWStepArgs {
  absl::Span<const TensorView> params;
  absl::Span<const TensorView> grads;
  absl::Span<const TensorView> exp_avg;
  absl::Span<const TensorView> exp_avg_sq;
  const std::vector<bool>* weight_decay = nullptr;
  AdamWScalars decaying;
  AdamWScalars plain;
};
absl::Status AdamWStep(const ExecContext& ctx, const AdamWStepArgs& args);

// Σ x² over every element of every tensor, as if concatenated, summed in f64 in a fixed order:
// the same on every run, thread count and CPU. NaN or Inf when an element is.
absl::StatusOr<double> SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors);

// Every element of every tensor *= scale.
absl::Status ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors,
                          float scale);

// True when no element of any tensor is NaN or ±Inf.
absl::StatusOr<bool> AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors);

// A saved AdamW state of one parameter: m finite, v non-negative and finite. InvalidArgument
// naming the first bad element by the tensor's name ("w.exp_avg_sq[3] = -1 must be non-negative
// and finite").
absl::Status CheckAdamWMoments(const ExecContext& ctx, std::string_view m_name, TensorView m,
                               std::string_view v_name, TensorView v);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_H_
