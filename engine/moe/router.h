// The router: scores, top-k selection, combine weights, aux and z losses, and their backward.
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
//     the gradient), P_e = mean_t p_{t,e}. With a count group (RouterArgs::count_group), n_e and T
//     are summed over the group's ranks while P_e stays the mean over this call's tokens: each
//     rank's loss is then its share, and with equal T on every rank the mean of the ranks' losses
//     (and of their gradients) is the loss of one call over the union of their tokens.
//   sequence aux loss: the same within each sequence of tokens_per_sequence consecutive tokens,
//     averaged over sequences.
//   z-loss: β·mean_t (logsumexp_e z_{t,e})².
#ifndef MOETRAIN_ENGINE_MOE_ROUTER_H_
#define MOETRAIN_ENGINE_MOE_ROUTER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"

namespace moetrain {

struct RouterArgs {
  TensorView logits;            // (T, E) f32
  TensorView expert_bias;       // (E) f32; read only when config.expert_bias
  int64_t tokens_per_sequence;  // sequence aux loss: T must be a multiple of it; 0 = T
  // Switch aux loss only: the ranks whose pair counts make f_e. RouterForward sums the E counts
  // and T over them (one all-reduce, so every rank of the group calls it together, with the same
  // config). Null: this call's tokens alone. Not owned.
  Communicator* count_group = nullptr;
};

struct RouterOutput {
  Tensor scores;                           // (T, E) f32: s, the score function over all experts
  Tensor topk_experts;                     // (T, k) i32: chosen experts, best selection score first
  Tensor topk_weights;                     // (T, k) f32: combine weights g
  std::vector<int64_t> tokens_per_expert;  // (E) pairs chosen for each expert
  float aux_loss = 0.0f;                   // already multiplied by α (0 when aux_loss is kNone)
  float z_loss = 0.0f;                     // already multiplied by β
  // The n_e (E) and T of f_e when they were summed over RouterArgs::count_group (which
  // RouterBackward then uses); empty and 0 when f_e counts this call's tokens.
  std::vector<int64_t> aux_counts;
  int64_t aux_tokens = 0;
};

// Fills `out` (allocating its tensors on first use or when shapes change).
absl::Status RouterForward(const MoeConfig& config, const RouterArgs& args, RouterOutput* out);

// d_logits (T, E) f32, written: the gradient of Σ g·d_topk_weights + w·(aux_loss + z_loss) with
// respect to the logits: the losses enter the total loss with weight w = loss_weight (> 0; the
// micro-batch's loss scale, like the one already in d_topk_weights).
absl::Status RouterBackward(const MoeConfig& config, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights /* (T, k) f32 */,
                            TensorView d_logits, float loss_weight = 1.0f);

// Aux-loss-free balancing, once per optimizer step: b_e += rate·sign(mean(n) − n_e), where
// `tokens_per_expert` (E) is summed over all ranks. bias (E) f32 is updated in place.
absl::Status UpdateExpertBias(const std::vector<int64_t>& tokens_per_expert, float rate,
                              TensorView bias);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_ROUTER_H_
