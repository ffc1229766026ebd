// The Hugging Face config.json of a model, and a model from one (moetrain import/export and
// every checkpoint's config.json; docs/checkpoints.md).
//
// config.json names the Hugging Face class whose code computes the same function as the weights,
// as far as reading that code tells (transformers' modeling_deepseek_v3.py; no test here runs it):
//   DeepseekV3ForCausalLM  MLA attention, sigmoid scores with the selection bias, dropless, RMSNorm
//                          eps 1e-6 (the code's fixed eps of the MLA latents' norms), and (when
//                          group-limited routing is on) groups scored by their best 2 experts, as
//                          that code does (our router uses top_k / group_top_k);
//   MoetrainForCausalLM    anything else. No Hugging Face code has that name, so no tool loads
//                          the weights into a model that would compute something else; the key
//                          "moetrain_differences" lists why DeepSeek-V3's code would differ.
// One difference no config can state: that code masks the experts of unchosen groups with a score
// of 0 where ours uses −∞, so the two choose alike while every score plus bias of a chosen group
// is ≥ 0 (sigmoid scores are positive; only a bias below −1 can break it).
// Every config.json also carries "moetrain_model_config" (model_config_json.h), from which import
// rebuilds the model exactly.
#ifndef MOETRAIN_ENGINE_TRAIN_HF_CONFIG_H_
#define MOETRAIN_ENGINE_TRAIN_HF_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace moetrain {

inline constexpr char kDeepseekV3Architecture[] = "DeepseekV3ForCausalLM";
inline constexpr char kMoetrainArchitecture[] = "MoetrainForCausalLM";

// Why Hugging Face's DeepseekV3ForCausalLM would compute another function than this model, one
// sentence each; empty when it computes the same. `group_scoring` (may be null) is set when one
// of them is only the group scoring (top_k / group_top_k ≠ 2), which export --force accepts.
std::vector<std::string> DeepseekV3Differences(const ModelConfig& config, bool* group_scoring);

// config.json for a model trained at sequence length `seq_len` (max_position_embeddings).
// force_deepseek_v3 names DeepseekV3ForCausalLM even when the group scoring differs (and only
// then); the differences stay listed.
nlohmann::json HuggingFaceConfig(const ModelConfig& config, int64_t seq_len,
                                 bool force_deepseek_v3 = false);

// The model of a config.json: its "moetrain_model_config" when present, else the DeepSeek-V3
// keys of a DeepseekV3ForCausalLM config. `seq_len` receives max_position_embeddings.
// InvalidArgument naming the key for another architecture, a missing or mistyped key, or a
// feature the engine does not have (rope_scaling such as YaRN, rope_interleave false, attention
// biases, softmax scoring, moe_layer_freq ≠ 1).
absl::StatusOr<ModelConfig> ModelConfigFromHuggingFace(const nlohmann::json& config,
                                                       int64_t* seq_len);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_HF_CONFIG_H_
