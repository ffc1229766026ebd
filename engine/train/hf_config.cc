#include "engine/train/hf_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/json.h"
#include "engine/core/status.h"
#include "engine/train/model_config_json.h"

namespace moetrain {
namespace {

using Json = nlohmann::json;

// json[key] as T, or InvalidArgument naming the key.
template <typename T>
absl::Status ReadKey(const Json& json, const char* key, T* out) {
  return ReadJsonKey(json, "config.json: ", key, out);
}

// A key the engine supports only at one value (absent counts as `expected` too).
absl::Status Expect(const Json& json, const char* key, const Json& expected, const char* why) {
  auto it = json.find(key);
  if (it == json.end() || *it == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: ", key, " = ", JsonExcerpt(*it), " is not supported: ", why));
}

}  // namespace

std::vector<std::string> DeepseekV3Differences(const ModelConfig& c, bool* group_scoring) {
  const MoeConfig& m = c.moe;
  std::vector<std::string> why;
  if (group_scoring != nullptr) *group_scoring = false;
  if (!c.is_mla()) {
    why.push_back(
        "attention is grouped-query attention (q_proj, k_proj, v_proj, o_proj); "
        "DeepSeek-V3's is Multi-head Latent Attention");
  }
  if (m.score_function != ScoreFunction::kSigmoid) {
    why.push_back("router scores are a softmax; DeepSeek-V3's code takes a sigmoid");
  }
  if (!m.expert_bias) {
    why.push_back(
        "model.moe.expert_bias is false; DeepSeek-V3's code always adds a selection bias "
        "(mlp.gate.e_score_correction_bias), which this model has no tensor for");
  }
  if (m.capacity_factor > 0) {
    why.push_back(absl::StrCat("model.moe.capacity_factor = ", m.capacity_factor,
                               " drops tokens over an expert's capacity; DeepSeek-V3's code is "
                               "dropless"));
  }
  if (c.is_mla() && c.rms_norm_eps != 1e-6f) {
    why.push_back(absl::StrCat("model.rms_norm_eps = ", c.rms_norm_eps,
                               "; DeepSeek-V3's code builds q_a_layernorm and kv_a_layernorm with "
                               "eps 1e-6 whatever config.json says"));
  }
  const bool group_limited = m.num_groups > 1 && m.group_top_k < m.num_groups;
  if (group_limited && m.num_experts / m.num_groups < 2) {
    why.push_back(absl::StrCat("groups of ", m.num_experts / m.num_groups,
                               " expert; DeepSeek-V3's code scores a group by its best 2"));
  } else if (group_limited && m.group_score_members() != 2) {
    why.push_back(absl::StrCat(
        "a group scores the sum of its best model.moe.top_k / model.moe.group_top_k = ",
        m.group_score_members(), " experts; DeepSeek-V3's code sums its best 2"));
    if (group_scoring != nullptr) *group_scoring = true;
  }
  return why;
}

Json HuggingFaceConfig(const ModelConfig& c, int64_t seq_len, bool force_deepseek_v3) {
  const MoeConfig& m = c.moe;
  bool group_scoring = false;
  const std::vector<std::string> differences = DeepseekV3Differences(c, &group_scoring);
  const bool deepseek =
      differences.empty() || (force_deepseek_v3 && group_scoring && differences.size() == 1);
  Json json = {
      {"architectures", {deepseek ? kDeepseekV3Architecture : kMoetrainArchitecture}},
      {"model_type", deepseek ? "deepseek_v3" : "moetrain"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"intermediate_size", c.ffn_dim},
      {"moe_intermediate_size", m.expert_ffn_dim},
      {"n_routed_experts", m.num_experts},
      {"num_experts_per_tok", m.top_k},
      {"n_shared_experts", m.num_shared_experts},
      {"first_k_dense_replace", c.first_dense_layers},
      {"moe_layer_freq", 1},
      {"scoring_func", m.score_function == ScoreFunction::kSigmoid ? "sigmoid" : "softmax"},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", m.normalize_topk_weights},
      {"routed_scaling_factor", m.routed_scaling_factor},
      // Every group chosen is no group limit: written as one group, which DeepSeek-V3's code
      // scores without needing 2 experts in each.
      {"n_group", m.group_top_k < m.num_groups ? m.num_groups : 1},
      {"topk_group", m.group_top_k < m.num_groups ? m.group_top_k : 1},
      {"num_nextn_predict_layers", c.mtp_depth},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"max_position_embeddings", seq_len},
      {"tie_word_embeddings", c.tie_embeddings},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"initializer_range", c.init_std},
      {"torch_dtype", "bfloat16"},
      {"moetrain_model_config", ModelConfigToJson(c)},
  };
  if (c.is_mla()) {
    const MlaConfig& a = c.mla;
    json["num_key_value_heads"] = c.num_heads;
    json["q_lora_rank"] = a.q_lora_rank > 0 ? Json(a.q_lora_rank) : Json(nullptr);
    json["kv_lora_rank"] = a.kv_lora_rank;
    json["qk_nope_head_dim"] = a.qk_nope_head_dim;
    json["qk_rope_head_dim"] = a.qk_rope_head_dim;
    json["v_head_dim"] = a.v_head_dim;
    json["head_dim"] = a.qk_rope_head_dim;  // what DeepseekV3Config itself sets: the RoPE width
    json["rope_interleave"] = true;
  } else {
    json["num_key_value_heads"] = c.num_kv_heads;
    json["head_dim"] = c.resolved_head_dim();
  }
  if (!differences.empty()) json["moetrain_differences"] = differences;
  return json;
}

absl::StatusOr<ModelConfig> ModelConfigFromHuggingFace(const Json& json, int64_t* seq_len) {
  if (!json.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "max_position_embeddings", seq_len));
  // Checked here for both paths: a moetrain export's model config does not read it.
  if (*seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: max_position_embeddings = ", *seq_len, " must be at least 1"));
  }
  if (json.contains("moetrain_model_config")) {
    return ModelConfigFromJson(json["moetrain_model_config"]);
  }
  std::vector<std::string> architectures;
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "architectures", &architectures));
  if (architectures.size() != 1 || architectures[0] != kDeepseekV3Architecture) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: architectures = ", JsonExcerpt(json["architectures"]),
                     " is not supported; moetrain imports [\"", kDeepseekV3Architecture,
                     "\"] and its own exports"));
  }
  MOETRAIN_RETURN_IF_ERROR(Expect(json, "rope_scaling", nullptr,
                                  "the engine has no RoPE scaling (YaRN) yet; only plain RoPE"));
  MOETRAIN_RETURN_IF_ERROR(
      Expect(json, "rope_interleave", true, "the engine's MLA rotates interleaved pairs only"));
  MOETRAIN_RETURN_IF_ERROR(Expect(json, "attention_bias", false, "projections have no bias"));
  MOETRAIN_RETURN_IF_ERROR(Expect(json, "hidden_act", "silu", "experts are SwiGLU"));
  MOETRAIN_RETURN_IF_ERROR(Expect(json, "moe_layer_freq", 1,
                                  "every block from "
                                  "first_k_dense_replace on is MoE"));
  MOETRAIN_RETURN_IF_ERROR(
      Expect(json, "scoring_func", "sigmoid", "DeepSeek-V3's code scores by sigmoid"));

  ModelConfig c;
  c.attention = AttentionType::kMla;
  c.moe.score_function = ScoreFunction::kSigmoid;
  c.moe.expert_bias = true;  // e_score_correction_bias
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "vocab_size", &c.vocab_size));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "hidden_size", &c.hidden_size));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "num_hidden_layers", &c.num_layers));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "num_attention_heads", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  if (json.contains("num_key_value_heads")) {
    int64_t kv_heads = 0;
    MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "num_key_value_heads", &kv_heads));
    if (kv_heads != c.num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: num_key_value_heads = ", kv_heads,
                       " is not supported: MLA's keys and values "
                       "have num_attention_heads = ",
                       c.num_heads, " heads"));
    }
  }
  if (json.contains("initializer_range")) {
    MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "initializer_range", &c.init_std));
  }
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "intermediate_size", &c.ffn_dim));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "moe_intermediate_size", &c.moe.expert_ffn_dim));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "n_routed_experts", &c.moe.num_experts));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "num_experts_per_tok", &c.moe.top_k));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "n_shared_experts", &c.moe.num_shared_experts));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "first_k_dense_replace", &c.first_dense_layers));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "norm_topk_prob", &c.moe.normalize_topk_weights));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "routed_scaling_factor", &c.moe.routed_scaling_factor));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "n_group", &c.moe.num_groups));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "topk_group", &c.moe.group_top_k));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "rms_norm_eps", &c.rms_norm_eps));
  if (c.rms_norm_eps != 1e-6f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: rms_norm_eps = ", c.rms_norm_eps,
        " is not supported: DeepSeek-V3's code uses 1e-6 in q_a_layernorm and kv_a_layernorm "
        "whatever this says, and the engine has one eps for every norm"));
  }
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "rope_theta", &c.rope_theta));
  if (json.contains("tie_word_embeddings")) {
    MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "tie_word_embeddings", &c.tie_embeddings));
  }
  if (json.contains("num_nextn_predict_layers")) {
    MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "num_nextn_predict_layers", &c.mtp_depth));
  }
  if (json.contains("q_lora_rank") && !json["q_lora_rank"].is_null()) {
    MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "q_lora_rank", &c.mla.q_lora_rank));
  }
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "kv_lora_rank", &c.mla.kv_lora_rank));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "qk_nope_head_dim", &c.mla.qk_nope_head_dim));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "qk_rope_head_dim", &c.mla.qk_rope_head_dim));
  MOETRAIN_RETURN_IF_ERROR(ReadKey(json, "v_head_dim", &c.mla.v_head_dim));
  c.max_seq_len = *seq_len;
  if (absl::Status valid = c.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", valid.message()));
  }
  bool group_scoring = false;
  DeepseekV3Differences(c, &group_scoring);
  if (group_scoring) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: num_experts_per_tok = ", c.moe.top_k, " and topk_group = ", c.moe.group_top_k,
        ": moetrain's router scores a group by its best num_experts_per_tok / topk_group "
        "experts and DeepSeek-V3's code by its best 2, so it would route differently"));
  }
  return c;
}

}  // namespace moetrain
