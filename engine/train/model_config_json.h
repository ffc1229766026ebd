// ModelConfig ⇄ JSON, for checkpoint manifests: a checkpoint names its whole architecture, so
// that `moetrain eval` (or a resumed job) can rebuild the model from the checkpoint alone.
#ifndef MOETRAIN_ENGINE_TRAIN_MODEL_CONFIG_JSON_H_
#define MOETRAIN_ENGINE_TRAIN_MODEL_CONFIG_JSON_H_

#include <cstdint>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/json.h"
#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

namespace moetrain {

// Integer keys take a JSON integer, or a number without a fraction, within int64's range
// (exactly: a double holds integers exactly up to 2^53): "config.json: hidden_size = 32.5 is not
// an integer", never 32; "... = 1e+30 is out of range", never INT64_MIN. A boolean is no integer.
absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         int64_t* out);
// Float keys take a JSON number within a float's range (a larger double would not convert).
absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         float* out);

// json[key] into *out, or InvalidArgument "<where><key> is missing" / "... has the wrong type: …"
// (where: "model config: moe.", "config.json: "). Other integer types as int64 above, then within
// their own range; strings, booleans and the rest as nlohmann reads them.
template <typename T>
absl::Status ReadJsonKey(const nlohmann::json& json, absl::string_view where, const char* key,
                         T* out) {
  static_assert(!std::is_floating_point_v<T>, "a float key reads into a float");
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    int64_t wide = 0;
    MOETRAIN_RETURN_IF_ERROR(ReadJsonKey(json, where, key, &wide));
    if (!std::in_range<T>(wide)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, key, " = ", wide, " is out of the range of ",
                       std::is_signed_v<T> ? "a " : "an unsigned ", 8 * sizeof(T), "-bit integer"));
    }
    *out = static_cast<T>(wide);
    return absl::OkStatus();
  } else {
    auto it = json.find(key);
    if (it == json.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, key, " is missing"));
    }
    try {
      *out = it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, key, " has the wrong type: ", JsonExcerpt(*it)));
    }
    return absl::OkStatus();
  }
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
