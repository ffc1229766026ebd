#include "engine/moe/moe_config.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moetrain {
namespace {

// absl::string_view, not std::: this Abseil is built with its own string_view, which StrCat needs.
absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("model.moe.", field, " = ", value, " ", why));
}

}  // namespace

absl::Status MoeConfig::Validate() const {
  if (num_experts < 1) return Invalid("num_experts", num_experts, "must be at least 1");
  // Chosen experts travel as i32 (RouterOutput::topk_experts).
  if (num_experts > std::numeric_limits<int32_t>::max()) {
    return Invalid("num_experts", num_experts, "must be at most 2147483647");
  }
  if (top_k < 1) return Invalid("top_k", top_k, "must be at least 1");
  if (top_k > num_experts) {
    return Invalid("top_k", top_k, absl::StrCat("exceeds model.moe.num_experts = ", num_experts));
  }
  if (expert_ffn_dim < 1) return Invalid("expert_ffn_dim", expert_ffn_dim, "must be at least 1");
  if (num_shared_experts < 0) {
    return Invalid("num_shared_experts", num_shared_experts, "must not be negative");
  }
  // An enum read from a wider integer may hold no enumerator; every switch on it would misroute.
  if (score_function != ScoreFunction::kSoftmax && score_function != ScoreFunction::kSigmoid) {
    return Invalid("score_function", static_cast<int>(score_function), "is not a score function");
  }
  if (aux_loss != AuxLossType::kNone && aux_loss != AuxLossType::kSwitch &&
      aux_loss != AuxLossType::kSequence) {
    return Invalid("aux_loss", static_cast<int>(aux_loss), "is not an aux loss type");
  }
  if (drop_policy != DropPolicy::kProbability && drop_policy != DropPolicy::kPosition) {
    return Invalid("drop_policy", static_cast<int>(drop_policy), "is not a drop policy");
  }
  if (!(routed_scaling_factor > 0.0f) || !std::isfinite(routed_scaling_factor)) {
    return Invalid("routed_scaling_factor", routed_scaling_factor, "must be positive and finite");
  }
  if (num_groups < 1) return Invalid("num_groups", num_groups, "must be at least 1");
  if (num_experts % num_groups != 0) {
    return Invalid("num_groups", num_groups,
                   absl::StrCat("does not divide model.moe.num_experts = ", num_experts));
  }
  if (group_top_k < 1 || group_top_k > num_groups) {
    return Invalid("group_top_k", group_top_k,
                   absl::StrCat("must be in [1, model.moe.num_groups = ", num_groups, "]"));
  }
  if (num_groups > 1 && top_k > group_top_k * experts_per_group()) {
    return Invalid("top_k", top_k,
                   absl::StrCat("exceeds the ", group_top_k * experts_per_group(),
                                " experts of model.moe.group_top_k = ", group_top_k, " groups of ",
                                experts_per_group()));
  }
  if (!(expert_bias_update_rate >= 0.0f) || !std::isfinite(expert_bias_update_rate)) {
    return Invalid("expert_bias_update_rate", expert_bias_update_rate,
                   "must be non-negative and finite");
  }
  if (!(aux_loss_coeff >= 0.0f) || !std::isfinite(aux_loss_coeff)) {
    return Invalid("aux_loss_coeff", aux_loss_coeff, "must be non-negative and finite");
  }
  if (!(z_loss_coeff >= 0.0f) || !std::isfinite(z_loss_coeff)) {
    return Invalid("z_loss_coeff", z_loss_coeff, "must be non-negative and finite");
  }
  if (!(capacity_factor >= 0.0f) || !std::isfinite(capacity_factor)) {
    return Invalid("capacity_factor", capacity_factor,
                   "must be non-negative and finite (0 = dropless)");
  }
  return absl::OkStatus();
}

}  // namespace moetrain
