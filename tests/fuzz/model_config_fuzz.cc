// The model configs a job reads from files, through the entry points the product uses, on
// arbitrary bytes: as a Hugging Face config.json (ParseJson then ModelConfigFromHuggingFace, as
// `moetrain import --from-hf` reads one) and as a checkpoint's manifest.json
// (LoadCheckpointManifest then ManifestModelConfig, as checkpoint.init_from and `moetrain eval`
// read one). Beyond not crashing, deeply nested inputs included: a refusal has the documented
// code, and an accepted model writes back (HuggingFaceConfig, ModelConfigToJson) to JSON that
// reads to the same model.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/core/json.h"
#include "engine/train/checkpoint.h"
#include "engine/train/hf_config.h"
#include "engine/train/model_config_json.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace moetrain::fuzz {
namespace {

// `read_back`, read from what this build wrote of `model`, is `model` again (as the JSON both
// write).
void ExpectSameModel(const ModelConfig& model, const absl::StatusOr<ModelConfig>& read_back,
                     std::string_view how) {
  const std::string what(how);
  if (!read_back.ok()) Fail(absl::StrCat(what, " does not read back"), read_back.status());
  if (ModelConfigToJson(*read_back) != ModelConfigToJson(model)) {
    Fail(absl::StrCat(what, " reads back to another model: ", ModelConfigToJson(model).dump(),
                      " became ", ModelConfigToJson(*read_back).dump()));
  }
}

void CheckConfigJson(std::string_view text) {
  absl::StatusOr<nlohmann::json> json = ParseJson(text, "config.json");
  if (Refused(json, {absl::StatusCode::kInvalidArgument}, "ParseJson")) return;
  int64_t seq_len = 0;
  absl::StatusOr<ModelConfig> model = ModelConfigFromHuggingFace(*json, &seq_len);
  if (Refused(model, {absl::StatusCode::kInvalidArgument}, "ModelConfigFromHuggingFace")) return;
  // What `moetrain export` would write of it, through the text a file holds.
  const std::string exported = HuggingFaceConfig(*model, seq_len).dump();
  absl::StatusOr<nlohmann::json> reparsed = ParseJson(exported, "exported config.json");
  if (!reparsed.ok()) Fail("an exported config.json does not parse", reparsed.status());
  int64_t exported_seq_len = 0;
  ExpectSameModel(*model, ModelConfigFromHuggingFace(*reparsed, &exported_seq_len),
                  "an exported config.json");
  if (exported_seq_len != seq_len) Fail("an exported config.json changed max_position_embeddings");
}

void CheckManifest(const std::string& step_dir) {
  absl::StatusOr<nlohmann::json> manifest = LoadCheckpointManifest(step_dir);
  if (Refused(manifest, {absl::StatusCode::kDataLoss, absl::StatusCode::kFailedPrecondition},
              "LoadCheckpointManifest")) {
    return;
  }
  absl::StatusOr<ModelConfig> model = ManifestModelConfig(*manifest);
  if (Refused(model, {absl::StatusCode::kInvalidArgument}, "ManifestModelConfig")) return;
  const nlohmann::json written = {{"model_config", ModelConfigToJson(*model)}};
  ExpectSameModel(*model, ManifestModelConfig(*ParseJson(written.dump(), "manifest.json")),
                  "a manifest's model_config");
}

}  // namespace
}  // namespace moetrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moetrain::fuzz::CheckConfigJson(std::string_view(reinterpret_cast<const char*>(data), size));
  moetrain::fuzz::WriteScratchFile("step-00000001/manifest.json", data, size);
  moetrain::fuzz::CheckManifest(moetrain::fuzz::ScratchDir() + "/step-00000001");
  return 0;
}
