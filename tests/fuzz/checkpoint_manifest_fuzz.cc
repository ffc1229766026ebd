// The checkpoint manifest reader (LoadCheckpointManifest, engine/train/checkpoint.h) on arbitrary
// manifest.json contents, in a directory whose name gives no step and in one named
// step-00000001 (so the manifest's step is checked against the name too). Beyond not crashing:
// a refusal is DataLoss (FailedPrecondition for another format version), and an accepted
// manifest has the fields LoadCheckpoint goes on to read, with the documented types.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/train/checkpoint.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

namespace moetrain::fuzz {
namespace {

void Check(const std::string& step_dir) {
  absl::StatusOr<nlohmann::json> manifest = LoadCheckpointManifest(step_dir);
  if (Refused(manifest, {absl::StatusCode::kDataLoss, absl::StatusCode::kFailedPrecondition},
              "LoadCheckpointManifest")) {
    return;
  }
  if (!manifest->is_object()) Fail("an accepted manifest is no object");
  const int64_t version = manifest->at("format_version").get<int64_t>();
  if (version < kOldestCheckpointFormatVersion || version > kCheckpointFormatVersion) {
    Fail("an accepted manifest has an unsupported format_version");
  }
  if (!manifest->at("job_id").is_string()) Fail("an accepted manifest's job_id is no string");
  for (const nlohmann::json& file : manifest->at("files")) {
    const std::string name = file.at("name").get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      Fail("an accepted manifest lists a file outside its directory: " + name);
    }
  }
}

}  // namespace
}  // namespace moetrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using moetrain::fuzz::ScratchDir;
  moetrain::fuzz::WriteScratchFile("unnamed/manifest.json", data, size);
  moetrain::fuzz::Check(ScratchDir() + "/unnamed");
  moetrain::fuzz::WriteScratchFile("step-00000001/manifest.json", data, size);
  moetrain::fuzz::Check(ScratchDir() + "/step-00000001");
  return 0;
}
