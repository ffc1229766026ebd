// The CUDA side of router.h (router_cuda.cu); arguments arrive validated by the dispatch in
// router.cc, ctx is on a CUDA device, RouterForward's outputs are allocated. Host-safe: no CUDA
// headers.
//
// The per-token math is router_math.h's, the CPU's own: one thread per token runs it, so that
// scores and selection follow the same operations as the CPU (a warp per token would be faster,
// but its reductions would reorder the sums and the CPU and GPU could choose different experts
// on near ties). Sums over tokens run serially in token order, in the CPU's precision, on one
// device thread; counts use integer atomics (order-independent). No floating-point atomics.
//
// Where the host cannot check a value without waiting for the device:
// - RouterForward waits once, at its end (the layer reads the counts there anyway), and returns
//   the CPU's errors: InvalidArgument for a non-finite expert bias, NonFiniteError naming the
//   first non-finite logit in (token, expert) order.
// - RouterAuxLoss and RouterBackward do not wait. A switch aux loss whose aux_counts count fewer
//   tokens than this call's T (InvalidArgument on the CPU) gives a NaN aux loss and NaN
//   gradients, which the trainer's non-finite checks catch; a token whose forward.topk_experts
//   holds no expert in [0, E) (a stale or foreign `forward`) gets a NaN row of d_logits and adds
//   nothing to the per-sequence counts.
// - UpdateExpertBias waits (once per optimizer step) and returns the CPU's error for a negative
//   count, leaving the bias unchanged.
#ifndef MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CUDA_H_
#define MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"
#include "engine/ops/router/router_cpu.h"

namespace moetrain::ops::cuda {

absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config,
                           const cpu::RouterExtents& x, const RouterArgs& args, RouterOutput* out);
absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config,
                           const cpu::RouterExtents& x, RouterOutput* out);
absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config,
                            const cpu::RouterExtents& x, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights,
                            TensorView d_logits, float loss_weight);
absl::Status UpdateExpertBias(const ExecContext& ctx, TensorView tokens_per_expert, float rate,
                              TensorView bias);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CUDA_H_
