// ModelConfig ⇄ JSON, for checkpoint manifests: a checkpoint names its whole architecture, so
// that `moetrain eval` (or a resumed job) can rebuild the model from the checkpoint alone.
#ifndef MOETRAIN_ENGINE_TRAIN_MODEL_CONFIG_JSON_H_
#define MOETRAIN_ENGINE_TRAIN_MODEL_CONFIG_JSON_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/json.h"
#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace moetrain {

// json[key] into *out, or InvalidArgument "<where><key> is missing" / "... has the wrong type: …"
// / "<where><key> = 1e+30 is not a 64-bit integer" (where: "model config: moe.", "config.json: ").
// An integer must be a JSON integer that fits T, a float a number T holds: nlohmann converts
// 32.5 to 32, and a number past T's range to whatever the conversion, undefined there, gives.
template <typename T>
absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         T* out) {
  auto it = json.find(key);
  if (it == json.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, " is missing"));
  }
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const bool fits = it->is_number_unsigned()  ? std::in_range<T>(it->template get<uint64_t>())
                      : it->is_number_integer() ? std::in_range<T>(it->template get<int64_t>())
                                                : !it->is_number();  // else the wrong type, below
    if (!fits) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, key, " = ", JsonExcerpt(*it), " is not ",
                       std::is_signed_v<T> ? "a " : "an unsigned ", 8 * sizeof(T), "-bit integer"));
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (it->is_number() && !(std::abs(it->template get<double>()) <=
                             static_cast<double>(std::numeric_limits<T>::max()))) {
      return absl::InvalidArgumentError(absl::StrCat(where, key, " = ", JsonExcerpt(*it),
                                                     " is out of the range of a ", 8 * sizeof(T),
                                                     "-bit float"));
    }
  }
  try {
    *out = it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " has the wrong type: ", JsonExcerpt(*it)));
  }
  return absl::OkStatus();
}

// Every field, named as in the job spec (model.*, model.moe.*), enums by name.
nlohmann::json ModelConfigToJson(const ModelConfig& config);

// The fields of a model config that change the function its weights compute (and the weights'
// shapes), as ModelConfigToJson names them: the training-only ones (init_std, max_seq_len,
// mtp_loss_weight, the aux and z losses, the bias update rate, capacity and drops) left out.
// Two configs whose weights may start one another's jobs (checkpoint.init_from) have equal ones.
nlohmann::json ModelFunctionJson(const ModelConfig& config);

// The inverse; InvalidArgument naming the key when one is missing or of the wrong type, and the
// result is validated.
absl::StatusOr<ModelConfig> ModelConfigFromJson(const nlohmann::json& json);

// The model a checkpoint manifest records under "model_config", as ModelConfigFromJson reads it:
// what a job that starts from the checkpoint (checkpoint.init_from) and `moetrain eval` build.
absl::StatusOr<ModelConfig> ManifestModelConfig(const nlohmann::json& manifest);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_MODEL_CONFIG_JSON_H_
