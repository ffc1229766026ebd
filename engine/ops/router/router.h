// The router: scores, top-k selection, combine weights, aux and z losses, and their backward; and
// the expert-bias update. The per-token math is in router_math.h, shared with the CUDA kernels.
// Tokens are independent and every sum over tokens runs serially in token order: results do not
// depend on the thread count.
//
// Definitions (T tokens, E experts, k chosen per token, z = logits, all in f32):
//   score s_{t,e}: softmax(z_t)_e, or sigmoid(z_{t,e}).
//   selection score: s + b (b = expert bias, only when config.expert_bias), or, for softmax after
//     top-k, z + b. Top-k takes the k highest selection scores (ties: lower expert index first),
//     within the best group_top_k groups when group-limited (a group scores the sum of its best
//     group_score_members() selection scores; ties: lower group index first).
//   combine weights g_{t,j} for the chosen experts e_j:
//     softmax before top-k / sigmoid:  g = ρ·s_e / Σ_j s_{e_j} if normalize_topk_weights else ρ·s_e
//     softmax after top-k:             g = ρ·softmax over j of z_{t,e_j}
//   The bias never enters g.
//   probability for the aux loss p_{t,e}: softmax(z_t)_e for softmax scores (either order),
//     s_{t,e} / Σ_e s_{t,e} for sigmoid.
//   switch aux loss: α·E·Σ_e f_e·P_e, f_e = n_e/(T·k) (n_e = pairs chosen for e, a constant for
//     the gradient), P_e = mean_t p_{t,e}. The n_e and T of f_e are RouterOutput::aux_counts:
//     this call's own, unless the caller summed them over a group of ranks between RouterForward
//     and RouterAuxLoss (the ops never communicate). P_e stays the mean over this call's tokens:
//     each rank's loss is then its share, and with equal T on every rank the mean of the ranks'
//     losses (and of their gradients) is the loss of one call over the union of their tokens.
//   sequence aux loss: the same within each sequence of tokens_per_sequence consecutive tokens,
//     averaged over sequences.
//   z-loss: β·mean_t (logsumexp_e z_{t,e})².
#ifndef MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_H_
#define MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"

namespace moetrain::ops {

struct RouterArgs {
  TensorView logits;                // (T, E) f32
  TensorView expert_bias;           // (E) f32; read only when config.expert_bias
  int64_t tokens_per_sequence = 0;  // sequence aux loss: T must be a multiple of it; 0 = T
};

// On the op's device; reused by the next call with the same shapes.
struct RouterOutput {
  Tensor scores;             // (T, E) f32: s, the score function over all experts
  Tensor topk_experts;       // (T, k) i32: chosen experts, best selection score first
  Tensor topk_weights;       // (T, k) f32: combine weights g
  Tensor tokens_per_expert;  // (E) i64: pairs chosen for each expert
  // (E + 1) i64: the n_e, then the T, of the switch aux loss's f_e. RouterForward writes this
  // call's; a caller whose f_e spans several ranks sums it over them before RouterAuxLoss.
  Tensor aux_counts;
  Tensor losses;  // (2) f32: the aux loss and the z-loss, each already multiplied by α or β
};

// Scores, top-k, combine weights, counts and the z-loss into `out` (the aux loss is 0 until
// RouterAuxLoss). NonFiniteError naming the first NaN or Inf logit.
absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                           RouterOutput* out);

// out->losses[0] = the aux loss of RouterForward's `out`, from out->aux_counts (switch) or from
// the pairs of each sequence (sequence aux loss); 0 when config has none.
absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                           RouterOutput* out);

// d_logits (T, E) f32, written: the gradient of Σ g·d_topk_weights + w·(aux_loss + z_loss) with
// respect to the logits: the losses enter the total loss with weight w = loss_weight (> 0; the
// micro-batch's loss scale, like the one already in d_topk_weights).
absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights /* (T, k) f32 */,
                            TensorView d_logits, float loss_weight = 1.0f);

// Aux-loss-free balancing, once per optimizer step: b_e += rate·sign(mean(n) − n_e), where
// `tokens_per_expert` (E) i64 is summed over all ranks. bias (E) f32 is updated in place.
absl::Status UpdateExpertBias(const ExecContext& ctx, TensorView tokens_per_expert, float rate,
                              TensorView bias);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_H_
