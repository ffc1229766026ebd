// Configuration of one MoE layer. Field names and defaults mirror JobSpec.model.moe.
#ifndef MOETRAIN_ENGINE_MOE_MOE_CONFIG_H_
#define MOETRAIN_ENGINE_MOE_MOE_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace moetrain {

enum class ScoreFunction { kSoftmax, kSigmoid };
enum class AuxLossType { kNone, kSwitch, kSequence };
// Which pairs an over-full expert keeps in capacity mode: those with the highest router
// probability, or the first ones in (token, slot) order.
enum class DropPolicy { kProbability, kPosition };

struct MoeConfig {
  int64_t num_experts = 8;         // E
  int64_t top_k = 2;               // k: experts per token
  int64_t expert_ffn_dim = 1024;   // F: intermediate size of each routed expert
  int64_t num_shared_experts = 0;  // S: shared experts, fused into one SwiGLU of width S·F

  ScoreFunction score_function = ScoreFunction::kSoftmax;
  // Softmax only: true = softmax over all E, then top-k; false = top-k of the logits, then
  // softmax over the k chosen logits.
  bool softmax_before_topk = true;
  // Divide the chosen k weights by their sum (softmax before top-k and sigmoid).
  bool normalize_topk_weights = true;
  // ρ: every combine weight is multiplied by it.
  float routed_scaling_factor = 1.0f;

  // Group-limited routing: E experts in num_groups groups of E/G; a group scores the sum of its
  // best max(1, k / group_top_k) selection scores; experts come only from the best group_top_k
  // groups. num_groups = 1 turns it off.
  int64_t num_groups = 1;
  int64_t group_top_k = 1;

  // Aux-loss-free balancing: a per-expert bias added to the scores for selection only, moved by
  // expert_bias_update_rate·sign(mean load − load) once per optimizer step.
  bool expert_bias = false;
  float expert_bias_update_rate = 1e-3f;

  AuxLossType aux_loss = AuxLossType::kNone;
  float aux_loss_coeff = 0.0f;  // α
  float z_loss_coeff = 0.0f;    // β

  // 0 = dropless (the default). Otherwise each expert keeps at most ⌈cf·T·k/E⌉ pairs.
  float capacity_factor = 0.0f;
  DropPolicy drop_policy = DropPolicy::kProbability;

  // OK, or InvalidArgument naming the field and its value ("model.moe.top_k = 9 exceeds
  // model.moe.num_experts = 8").
  absl::Status Validate() const;

  // Experts of one group, and how many best members score a group.
  int64_t experts_per_group() const { return num_experts / num_groups; }
  int64_t group_score_members() const { return top_k / group_top_k > 0 ? top_k / group_top_k : 1; }
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_MOE_CONFIG_H_
