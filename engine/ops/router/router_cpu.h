// The CPU side of router.h. Shapes arrive validated (as RouterExtents); values are checked here,
// where they are read.
#ifndef MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CPU_H_
#define MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CPU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"

namespace moetrain::cpu {

// The validated extents of one router call.
struct RouterExtents {
  int64_t tokens;   // T
  int64_t experts;  // E
  int64_t top_k;    // k
  int64_t seq_len;  // L: tokens per aux-loss sequence (T for the switch loss)
  int64_t num_sequences() const { return seq_len > 0 ? tokens / seq_len : 0; }
};

absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                           const ops::RouterArgs& args, ops::RouterOutput* out);
absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                           ops::RouterOutput* out);
absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                            const ops::RouterArgs& args, const ops::RouterOutput& forward,
                            TensorView d_topk_weights, TensorView d_logits, float loss_weight);
absl::Status UpdateExpertBias(TensorView tokens_per_expert, float rate, TensorView bias);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_CPU_H_
