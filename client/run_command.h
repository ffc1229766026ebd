// `moetrain run`: the embedded default. Trains a job in this process through the same code paths
// as the service: an in-process coordinator (its store in a temporary file), an in-process worker
// on an in-process channel, and the job followed through WatchJob and printed like `moetrain logs`.
#ifndef MOETRAIN_CLIENT_RUN_COMMAND_H_
#define MOETRAIN_CLIENT_RUN_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>

namespace moetrain {

struct RunOptions {
  std::string spec_path;
  std::string checkpoint_dir;  // overrides spec.checkpoint.dir; default ./checkpoints
  int64_t steps = 0;           // overrides spec.train.steps when > 0
  // --stop-at-step: train through this step (1-based, as the step lines count), checkpoint it and
  // exit, the schedule and data order staying those of train.steps (so that --resume continues as
  // if never stopped). Given: 1 ≤ N ≤ train.steps, and beyond the step --resume starts from.
  std::optional<int64_t> stop_at_step;
  bool resume = false;
  bool json = false;
  // Host memory the job may use ("8GiB", "512MiB", bytes); empty = the machine's memory (or its
  // cgroup's limit when lower). A job whose estimate exceeds it is refused before it starts.
  std::string memory_limit;
  // "cpu" or "cuda" overrides spec.resources.device; empty = the spec's. A CUDA run trains on
  // this machine's first GPU (one rank), and fails at once, exit 2, where there is none.
  std::string device;
};

// Returns the process exit code: 0 when the job succeeded or was stopped (after a checkpoint) by
// --stop-at-step or SIGINT/SIGTERM, 1 when it failed, 2 for a bad spec or flag, a refusal to
// overwrite checkpoints, a model whose memory estimate exceeds the memory limit, or a CUDA job on
// a machine without a usable GPU. Progress goes to stdout, errors to stderr.
int RunJob(const RunOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_RUN_COMMAND_H_
