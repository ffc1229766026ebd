// Checkpoint directories: written atomically, verified on load, pruned to the newest few.
//
//   <checkpoint dir>/<job id>/step-00000100/
//     manifest.json                 {"format_version": 1, "job_id", "step", "tokens_seen",
//                                    the trainer's sections ("model_config", "world_layout",
//                                    "data_position", "rng_state", ...),
//                                    "files": [{"name", "bytes", "sha256"}, ...]}
//     model-rank00000.safetensors   parameters, HF names; metadata {"format": "pt"}
//     optim-rank00000.safetensors   optimizer moments and master weights
//     config.json                   the HF architecture description
//
// A step is written into `<root>/.tmp-step-00000100-<random>`, every file and the directory
// fsynced, then renamed to `step-00000100` and the root fsynced: after a crash there is either
// no step directory or a complete one (plus a .tmp-* leftover, which readers ignore and
// PruneCheckpoints removes). One writer per root: a step directory holds the files of the ranks
// one WriteCheckpoint call wrote (today: one rank per call).
#ifndef MOETRAIN_ENGINE_TRAIN_CHECKPOINT_H_
#define MOETRAIN_ENGINE_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/tensor.h"
#include "nlohmann/json.hpp"

namespace moetrain {

inline constexpr int kCheckpointFormatVersion = 1;

// "step-00000100" (at least 8 digits).
std::string CheckpointStepDirName(int64_t step);
// "model-rank00000.safetensors", "optim-rank00000.safetensors".
std::string ModelFileName(int rank);
std::string OptimFileName(int rank);

struct CheckpointContents {
  int64_t step = 0;         // optimizer steps taken; names the directory
  int64_t tokens_seen = 0;  // training tokens consumed, all ranks together
  // Copied into the manifest's top level: "model_config", "world_layout", "data_position",
  // "rng_state", ... An object; its keys must not be the manifest's own (format_version, job_id,
  // step, tokens_seen, files).
  nlohmann::json sections = nlohmann::json::object();
  std::vector<std::pair<std::string, TensorView>> model_tensors;  // HF parameter names
  std::vector<std::pair<std::string, TensorView>> optim_tensors;
  nlohmann::json hf_config = nlohmann::json::object();  // written as config.json
  int rank = 0;                                         // names the tensor files
};

// Writes `contents` as `<root>/step-XXXXXXXX` and returns that path. `root` is
// `<checkpoint dir>/<job id>` (created when missing); the manifest's job_id is its last
// component. AlreadyExists when the step is already there; on any error nothing is left behind
// but possibly a .tmp-* directory.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& root,
                                            const CheckpointContents& contents);

// The steps of the step directories under `root`, ascending; empty when `root` does not exist.
// Lists by name only: LoadCheckpoint says whether one is good.
absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(const std::string& root);

// Keeps the newest `keep_last` (>= 1) step directories that look complete (manifest readable,
// every listed file present with its listed size; checksums are left to loading), removes every
// other step directory and every .tmp-* leftover. Not to be run while a write is in flight.
absl::Status PruneCheckpoints(const std::string& root, int keep_last);

struct LoadedCheckpoint {
  std::string path;  // the step directory
  int64_t step = 0;
  int64_t tokens_seen = 0;
  nlohmann::json manifest;  // the whole manifest: the trainer's sections are manifest["rng_state"]…
  nlohmann::json hf_config;  // config.json
  std::map<std::string, Tensor> model_tensors;
  std::map<std::string, Tensor> optim_tensors;
  // LoadLatestCheckpoint: why newer steps were passed over, newest first, e.g.
  // "step-00000200: model-rank00000.safetensors sha256 mismatch (manifest 3f09..., file 9a4c...)".
  std::vector<std::string> warnings;
};

// Loads `rank`'s tensors from one step directory after verifying it: the manifest parses and has
// format_version 1 and the directory's step; every listed file exists with its listed size; the
// files this rank reads (its two tensor files, config.json) match their sha256 and parse.
// NotFound when there is no such directory; DataLoss when it is damaged (the message names the
// directory, the file and the problem); FailedPrecondition for another format version.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& step_dir, int rank = 0);

// Loads the newest step under `root` that passes LoadCheckpoint, recording in `warnings` each
// newer one skipped and each .tmp-* leftover. NotFound when there is no step directory at all;
// DataLoss (listing every problem) when there are some but none is good, so that a caller does
// not silently restart from scratch.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root, int rank = 0);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_CHECKPOINT_H_
