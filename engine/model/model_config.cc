#include "engine/model/model_config.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

// absl::string_view, not std::: this Abseil is built with its own string_view, which StrCat needs.
absl::Status Invalid(absl::string_view field, auto value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("model.", field, " = ", value, " ", why));
}

bool PositiveFinite(float v) { return v > 0.0f && std::isfinite(v); }

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (vocab_size < 1) return Invalid("vocab_size", vocab_size, "must be at least 1");
  // Tokens travel as i32.
  if (vocab_size > std::numeric_limits<int32_t>::max()) {
    return Invalid("vocab_size", vocab_size, "must be at most 2147483647");
  }
  if (hidden_size < 1) return Invalid("hidden_size", hidden_size, "must be at least 1");
  if (num_layers < 1) return Invalid("num_layers", num_layers, "must be at least 1");
  if (num_heads < 1) return Invalid("num_heads", num_heads, "must be at least 1");
  if (is_mla()) {
    MOETRAIN_RETURN_IF_ERROR(ValidateMla());
  } else {
    MOETRAIN_RETURN_IF_ERROR(ValidateGqa());
  }
  if (ffn_dim < 1) return Invalid("ffn_dim", ffn_dim, "must be at least 1");
  if (first_dense_layers < 0 || first_dense_layers > num_layers) {
    return Invalid("first_dense_layers", first_dense_layers,
                   absl::StrCat("must be in [0, model.num_layers = ", num_layers, "]"));
  }
  if (max_seq_len < 1) return Invalid("max_seq_len", max_seq_len, "must be at least 1");
  if (!PositiveFinite(rope_theta)) {
    return Invalid("rope_theta", rope_theta, "must be positive and finite");
  }
  if (!PositiveFinite(rms_norm_eps)) {
    return Invalid("rms_norm_eps", rms_norm_eps, "must be positive and finite");
  }
  if (!PositiveFinite(init_std))
    return Invalid("init_std", init_std, "must be positive and finite");
  if (mtp_depth < 0) return Invalid("mtp_depth", mtp_depth, "must not be negative");
  if (!(mtp_loss_weight >= 0.0f) || !std::isfinite(mtp_loss_weight)) {
    return Invalid("mtp_loss_weight", mtp_loss_weight, "must be non-negative and finite");
  }
  return moe.Validate();
}

absl::Status ModelConfig::ValidateGqa() const {
  if (num_kv_heads < 1) return Invalid("num_kv_heads", num_kv_heads, "must be at least 1");
  if (num_heads % num_kv_heads != 0) {
    return Invalid("num_kv_heads", num_kv_heads,
                   absl::StrCat("does not divide model.num_heads = ", num_heads));
  }
  if (head_dim < 0) {
    return Invalid("head_dim", head_dim, "must not be negative (0 = hidden_size / num_heads)");
  }
  if (head_dim == 0 && hidden_size % num_heads != 0) {
    return Invalid("hidden_size", hidden_size,
                   absl::StrCat("is not a multiple of model.num_heads = ", num_heads,
                                " (set model.head_dim explicitly)"));
  }
  // RoPE rotates pairs of features (i, i + Dh/2).
  if (resolved_head_dim() % 2 != 0) {
    return head_dim > 0
               ? Invalid("head_dim", head_dim, "must be even (RoPE rotates pairs of features)")
               : Invalid("hidden_size", hidden_size,
                         absl::StrCat("/ model.num_heads = ", resolved_head_dim(),
                                      " is odd; the head dimension must be even (RoPE)"));
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::ValidateMla() const {
  const MlaConfig& m = mla;
  if (m.q_lora_rank < 0) {
    return Invalid("mla.q_lora_rank", m.q_lora_rank, "must not be negative (0 = no compression)");
  }
  if (m.kv_lora_rank < 1) return Invalid("mla.kv_lora_rank", m.kv_lora_rank, "must be at least 1");
  if (m.qk_nope_head_dim < 0) {
    return Invalid("mla.qk_nope_head_dim", m.qk_nope_head_dim, "must not be negative");
  }
  if (m.qk_rope_head_dim < 2 || m.qk_rope_head_dim % 2 != 0) {
    return Invalid("mla.qk_rope_head_dim", m.qk_rope_head_dim,
                   "must be even and at least 2 (RoPE rotates pairs of features)");
  }
  if (m.qk_nope_head_dim % 2 != 0) {
    return Invalid("mla.qk_nope_head_dim", m.qk_nope_head_dim,
                   "must be even (the attention core takes an even head width)");
  }
  if (m.v_head_dim < 1 || m.v_head_dim > m.qk_head_dim()) {
    return Invalid(
        "mla.v_head_dim", m.v_head_dim,
        absl::StrCat("must be in [1, mla.qk_nope_head_dim + mla.qk_rope_head_dim = ",
                     m.qk_head_dim(), "] (the attention core pads values to the query/key width)"));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
