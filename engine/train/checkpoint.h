// Checkpoint directories: written atomically, verified on load, pruned to the newest few.
//
//   <checkpoint dir>/<job id>/step-00000100/
//     manifest.json                 {"format_version": 2, "job_id", "step", "tokens_seen",
//                                    the trainer's sections ("model_config", "world_layout",
//                                    "data_position", "rng_state", ...),
//                                    "files": [{"name", "bytes", "sha256"}, ...]}
//     model-rank00000.safetensors   parameters, HF names; metadata {"format": "pt"}
//     optim-rank00000.safetensors   optimizer moments
//     model-rank00001.safetensors … the tensors other ranks wrote (sharded checkpoints)
//     config.json                   the HF architecture description
//
// A step is written into `<root>/.tmp-step-00000100-<nonce>`, every file and the directory
// fsynced, then renamed to `step-00000100` and the root fsynced: after a crash there is either
// no step directory or a complete one (plus a .tmp-* leftover, which readers ignore and
// PruneCheckpoints removes). A step directory that fails verification when its step is written
// again (resume passed over it) is renamed to `.damaged-step-00000100-<nonce>`, another leftover
// that readers ignore and PruneCheckpoints removes, so that the new write takes its place.
// WriteCheckpoint does it all for one writer; the ranks of a sharded checkpoint share the steps:
// BeginCheckpoint (one rank), WriteCheckpointShard (each rank that holds tensors, into the same
// temporary directory), CommitCheckpoint (one rank, with every rank's file entries).
//
// Format versions: 2 (this build) adds sharded steps; 1 (single-rank) still loads.
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

inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr int kOldestCheckpointFormatVersion = 1;

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

// --- Sharded writing: WriteCheckpoint in the pieces the ranks of one step share. -------------

// A file of a step directory as the manifest lists it.
struct CheckpointFile {
  std::string name;
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

// A random number that makes a temporary directory's name unique.
uint64_t NewCheckpointNonce();
// `<root>/.tmp-step-XXXXXXXX-<nonce as 16 hex digits>`: where every rank writes step `step`.
std::string CheckpointTempDir(const std::string& root, int64_t step, uint64_t nonce);
// One rank, first: creates `root` when missing and CheckpointTempDir(root, step, nonce); returns
// the latter. A step directory already there is verified (every file hashed): a damaged one
// (DataLoss) is moved aside as `.damaged-<step dir>-<random>` (and `moved_aside`, when given, says
// so and why); a good one, or one of another format version, is AlreadyExists, as is an existing
// temporary directory of that name.
absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, int64_t step, uint64_t nonce,
                                            std::string* moved_aside = nullptr);
// Each rank that holds tensors: writes ModelFileName(contents.rank) and
// OptimFileName(contents.rank) into `tmp_dir`, fsynced, and returns their entries. Reads only
// contents.rank and the tensors.
absl::StatusOr<std::vector<CheckpointFile>> WriteCheckpointShard(
    const std::string& tmp_dir, const CheckpointContents& contents);
// One rank, last, once every shard is written: writes config.json and the manifest (listing
// `files`, every rank's, and config.json) into `tmp_dir`, fsyncs it, renames it to the step
// directory and fsyncs `root`; returns the step directory. Reads everything in `contents` but
// the tensors. On error the temporary directory is removed.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& root, const std::string& tmp_dir,
                                             const CheckpointContents& contents,
                                             std::vector<CheckpointFile> files);
// Removes a temporary directory whose step will not be committed (best effort).
void AbandonCheckpoint(const std::string& tmp_dir);

// The steps of the step directories under `root`, ascending; empty when `root` does not exist.
// Lists by name only: LoadCheckpoint says whether one is good.
absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(const std::string& root);

// Keeps the newest `keep_last` (>= 1) step directories that are good (manifest readable, every
// listed file present with its listed size and sha256: this reads the kept steps' files), removes
// every other step directory and every .tmp-* and .damaged-* leftover. Among the newest, only a
// step that verification finds damaged (DataLoss) is removed; one it cannot judge (a manifest
// from a newer build, a failed read) is kept, logged, and not counted. `committed_step`, the step
// just committed by this process, counts as good unverified and is never removed. A step this
// process verified good is not hashed again while none of its files changed (each file's name,
// size and modification time as they were before it was hashed).
// Not to be run while a write is in flight.
absl::Status PruneCheckpoints(const std::string& root, int keep_last, int64_t committed_step = -1);

struct LoadedCheckpoint {
  std::string path;  // the step directory
  int64_t step = 0;
  int64_t tokens_seen = 0;
  nlohmann::json manifest;  // the whole manifest: the trainer's sections are manifest["rng_state"]…
  nlohmann::json hf_config;                     // config.json
  std::vector<int> ranks;                       // the rank files read
  std::map<std::string, Tensor> model_tensors;  // of those files together
  std::map<std::string, Tensor> optim_tensors;
  // LoadLatestCheckpoint: why newer steps were passed over, newest first, e.g.
  // "step-00000200: model-rank00000.safetensors sha256 mismatch (manifest 3f09..., file 9a4c...)".
  std::vector<std::string> warnings;
};

// Which files of a step directory LoadCheckpoint reads.
struct CheckpointReadOptions {
  std::vector<int> ranks = {0};  // model-rankR (and optim-rankR) for each R, merged
  bool optimizer = true;         // false: the model files only
};

// Loads the tensors of the rank files `options.ranks` from one step directory after verifying
// it: the manifest parses and has a readable format_version and the directory's step; every
// listed file exists with its listed size; the files read (tensor files, config.json) match
// their sha256 and parse, and no tensor is in two of them. NotFound when there is no such
// directory; DataLoss when it is damaged (the message names the directory, the file and the
// problem); FailedPrecondition for another format version; InvalidArgument for a bad rank.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& step_dir,
                                                const CheckpointReadOptions& options);
// The files of one rank: LoadCheckpoint(step_dir, {.ranks = {rank}}).
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& step_dir, int rank = 0);

// The manifest of a step directory, verified as LoadCheckpoint does but without hashing or
// reading any file: to learn what a step holds (its world layout) before loading it.
absl::StatusOr<nlohmann::json> LoadCheckpointManifest(const std::string& step_dir);

// Loads the newest step under `root` that passes LoadCheckpoint, recording in `warnings` each
// newer one skipped and each .tmp-* or .damaged-* leftover. NotFound when there is no step
// directory at all; DataLoss (listing every problem) when there are some but none is good, so that
// a caller does not silently restart from scratch.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& root, int rank = 0);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_CHECKPOINT_H_
