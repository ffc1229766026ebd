#include "engine/train/model_config_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

const char* ScoreName(ScoreFunction f) {
  return f == ScoreFunction::kSigmoid ? "sigmoid" : "softmax";
}
const char* AuxName(AuxLossType t) {
  return t == AuxLossType::kSwitch ? "switch" : t == AuxLossType::kSequence ? "sequence" : "none";
}
const char* DropName(DropPolicy p) {
  return p == DropPolicy::kPosition ? "position" : "probability";
}

// Reads json[key] into *out, or says which key (under `path`: "", "moe.") is wrong.
template <typename T>
absl::Status Read(const nlohmann::json& json, const char* path, const char* key, T* out) {
  return ReadJsonKey(json, absl::StrCat("model config: ", path), key, out);
}

template <typename Enum>
absl::Status ReadEnum(const nlohmann::json& json, const char* key,
                      std::initializer_list<std::pair<const char*, Enum>> names, Enum* out) {
  std::string name;
  MOETRAIN_RETURN_IF_ERROR(Read(json, "moe.", key, &name));
  for (const auto& [n, value] : names) {
    if (name == n) {
      *out = value;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model config: moe.", key, " = '", name, "' is not a known value"));
}

}  // namespace

absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         int64_t* out) {
  const auto it = json.find(key);
  if (it == json.end()) return absl::InvalidArgumentError(absl::StrCat(where, key, " is missing"));
  if (it->is_number_integer() && !it->is_number_unsigned()) {
    *out = it->get<int64_t>();
    return absl::OkStatus();
  }
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " must be an integer, not a JSON ", it->type_name()));
  }
  // A number is printed short whatever its source text, so it may be quoted whole.
  const std::string value = it->dump();
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, key, " = ", value, " is out of range (at most 2^63 - 1)"));
    }
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  // A double: exact integers only, and only where a double still tells them apart (|v| ≤ 2^53).
  const double v = it->get<double>();
  constexpr double kExactLimit = 9007199254740992.0;  // 2^53
  if (std::trunc(v) != v) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, " = ", value, " is not an integer"));
  }
  if (std::fabs(v) > kExactLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, key, " = ", value,
        " is out of range: an integer written as a floating-point number must be at most 2^53 "
        "in magnitude"));
  }
  *out = static_cast<int64_t>(v);
  return absl::OkStatus();
}

absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         float* out) {
  const auto it = json.find(key);
  if (it == json.end()) return absl::InvalidArgumentError(absl::StrCat(where, key, " is missing"));
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " must be a number, not a JSON ", it->type_name()));
  }
  const double v = it->get<double>();
  // JSON has no NaN or Inf, but a double beyond a float's range has no float to become.
  if (std::fabs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " = ", it->dump(), " is out of a 32-bit float's range"));
  }
  *out = static_cast<float>(v);
  return absl::OkStatus();
}

nlohmann::json ModelConfigToJson(const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  nlohmann::json json = {{"vocab_size", c.vocab_size},
                         {"hidden_size", c.hidden_size},
                         {"num_layers", c.num_layers},
                         {"num_heads", c.num_heads},
                         {"num_kv_heads", c.num_kv_heads},
                         {"head_dim", c.head_dim},
                         {"ffn_dim", c.ffn_dim},
                         {"first_dense_layers", c.first_dense_layers},
                         {"max_seq_len", c.max_seq_len},
                         {"rope_theta", c.rope_theta},
                         {"rms_norm_eps", c.rms_norm_eps},
                         {"tie_embeddings", c.tie_embeddings},
                         {"init_std", c.init_std},
                         {"moe",
                          {{"num_experts", m.num_experts},
                           {"top_k", m.top_k},
                           {"expert_ffn_dim", m.expert_ffn_dim},
                           {"num_shared_experts", m.num_shared_experts},
                           {"score_function", ScoreName(m.score_function)},
                           {"softmax_before_topk", m.softmax_before_topk},
                           {"normalize_topk_weights", m.normalize_topk_weights},
                           {"routed_scaling_factor", m.routed_scaling_factor},
                           {"num_groups", m.num_groups},
                           {"group_top_k", m.group_top_k},
                           {"expert_bias", m.expert_bias},
                           {"expert_bias_update_rate", m.expert_bias_update_rate},
                           {"aux_loss", AuxName(m.aux_loss)},
                           {"aux_loss_coeff", m.aux_loss_coeff},
                           {"z_loss_coeff", m.z_loss_coeff},
                           {"capacity_factor", m.capacity_factor},
                           {"drop_policy", DropName(m.drop_policy)}}}};
  // Written only when used, so that the manifests of earlier models stay as they were.
  if (c.is_mla()) {
    json["attention"] = "mla";
    json["mla"] = {{"q_lora_rank", c.mla.q_lora_rank},
                   {"kv_lora_rank", c.mla.kv_lora_rank},
                   {"qk_nope_head_dim", c.mla.qk_nope_head_dim},
                   {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
                   {"v_head_dim", c.mla.v_head_dim}};
  }
  if (c.mtp_depth > 0) {
    json["mtp_depth"] = c.mtp_depth;
    json["mtp_loss_weight"] = c.mtp_loss_weight;
  }
  return json;
}

nlohmann::json ModelFunctionJson(const ModelConfig& config) {
  nlohmann::json json = ModelConfigToJson(config);
  for (const char* key : {"init_std", "max_seq_len", "mtp_loss_weight"}) json.erase(key);
  for (const char* key : {"aux_loss", "aux_loss_coeff", "z_loss_coeff", "expert_bias_update_rate",
                          "capacity_factor", "drop_policy"}) {
    json["moe"].erase(key);
  }
  return json;
}

absl::StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("moe") || !json["moe"].is_object()) {
    return absl::InvalidArgumentError("model config: expected an object with a 'moe' object");
  }
  ModelConfig c;
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "vocab_size", &c.vocab_size));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "hidden_size", &c.hidden_size));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "num_layers", &c.num_layers));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "num_heads", &c.num_heads));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "num_kv_heads", &c.num_kv_heads));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "head_dim", &c.head_dim));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "ffn_dim", &c.ffn_dim));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "first_dense_layers", &c.first_dense_layers));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "max_seq_len", &c.max_seq_len));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "rope_theta", &c.rope_theta));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "rms_norm_eps", &c.rms_norm_eps));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "tie_embeddings", &c.tie_embeddings));
  MOETRAIN_RETURN_IF_ERROR(Read(json, "", "init_std", &c.init_std));
  if (json.contains("attention")) {
    std::string attention;
    MOETRAIN_RETURN_IF_ERROR(Read(json, "", "attention", &attention));
    if (attention != "mla") {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: attention = '", attention, "' is not a known value"));
    }
    if (!json.contains("mla") || !json["mla"].is_object()) {
      return absl::InvalidArgumentError("model config: attention = 'mla' needs an 'mla' object");
    }
    const nlohmann::json& mla = json["mla"];
    c.attention = AttentionType::kMla;
    MOETRAIN_RETURN_IF_ERROR(Read(mla, "mla.", "q_lora_rank", &c.mla.q_lora_rank));
    MOETRAIN_RETURN_IF_ERROR(Read(mla, "mla.", "kv_lora_rank", &c.mla.kv_lora_rank));
    MOETRAIN_RETURN_IF_ERROR(Read(mla, "mla.", "qk_nope_head_dim", &c.mla.qk_nope_head_dim));
    MOETRAIN_RETURN_IF_ERROR(Read(mla, "mla.", "qk_rope_head_dim", &c.mla.qk_rope_head_dim));
    MOETRAIN_RETURN_IF_ERROR(Read(mla, "mla.", "v_head_dim", &c.mla.v_head_dim));
  }
  if (json.contains("mtp_depth")) {
    MOETRAIN_RETURN_IF_ERROR(Read(json, "", "mtp_depth", &c.mtp_depth));
    MOETRAIN_RETURN_IF_ERROR(Read(json, "", "mtp_loss_weight", &c.mtp_loss_weight));
  }
  const nlohmann::json& moe = json["moe"];
  MoeConfig& m = c.moe;
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "num_experts", &m.num_experts));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "top_k", &m.top_k));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "expert_ffn_dim", &m.expert_ffn_dim));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "num_shared_experts", &m.num_shared_experts));
  MOETRAIN_RETURN_IF_ERROR(
      ReadEnum(moe, "score_function",
               {{"softmax", ScoreFunction::kSoftmax}, {"sigmoid", ScoreFunction::kSigmoid}},
               &m.score_function));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "softmax_before_topk", &m.softmax_before_topk));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "normalize_topk_weights", &m.normalize_topk_weights));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "routed_scaling_factor", &m.routed_scaling_factor));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "num_groups", &m.num_groups));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "group_top_k", &m.group_top_k));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "expert_bias", &m.expert_bias));
  MOETRAIN_RETURN_IF_ERROR(
      Read(moe, "moe.", "expert_bias_update_rate", &m.expert_bias_update_rate));
  MOETRAIN_RETURN_IF_ERROR(ReadEnum(moe, "aux_loss",
                                    {{"none", AuxLossType::kNone},
                                     {"switch", AuxLossType::kSwitch},
                                     {"sequence", AuxLossType::kSequence}},
                                    &m.aux_loss));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "aux_loss_coeff", &m.aux_loss_coeff));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "z_loss_coeff", &m.z_loss_coeff));
  MOETRAIN_RETURN_IF_ERROR(Read(moe, "moe.", "capacity_factor", &m.capacity_factor));
  MOETRAIN_RETURN_IF_ERROR(
      ReadEnum(moe, "drop_policy",
               {{"probability", DropPolicy::kProbability}, {"position", DropPolicy::kPosition}},
               &m.drop_policy));
  MOETRAIN_RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::StatusOr<ModelConfig> ManifestModelConfig(const nlohmann::json& manifest) {
  const auto it = manifest.find("model_config");
  if (it == manifest.end()) return ModelConfigFromJson(nlohmann::json());
  return ModelConfigFromJson(*it);
}

}  // namespace moetrain
