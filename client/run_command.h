// `moetrain run` and `moetrain eval`: the embedded default, training and evaluating in this
// process on the CPU.
#ifndef MOETRAIN_CLIENT_RUN_COMMAND_H_
#define MOETRAIN_CLIENT_RUN_COMMAND_H_

#include <cstdint>
#include <string>

namespace moetrain {

struct RunOptions {
  std::string spec_path;
  std::string checkpoint_dir;  // overrides spec.checkpoint.dir; default ./checkpoints
  int64_t steps = 0;           // overrides spec.train.steps when > 0
  bool resume = false;
  bool json = false;
};

// Returns the process exit code; prints progress to stdout and errors to stderr.
int RunJob(const RunOptions& options);

struct EvalOptions {
  std::string checkpoint;  // a step directory
  std::string data_path;
  std::string data_format;  // llmc | u16 | text
  int64_t batches = 0;      // 0 = every window of the file
  int64_t batch_size = 8;   // windows per forward
  bool json = false;
};

int EvalCheckpoint(const EvalOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_RUN_COMMAND_H_
