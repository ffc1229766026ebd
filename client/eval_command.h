// `moetrain eval`: the mean next-token loss of a checkpoint over a token file, in this process.
#ifndef MOETRAIN_CLIENT_EVAL_COMMAND_H_
#define MOETRAIN_CLIENT_EVAL_COMMAND_H_

#include <cstdint>
#include <string>

namespace moetrain {

struct EvalOptions {
  std::string checkpoint;  // a step directory
  std::string data_path;
  std::string data_format;  // llmc | u16 | text
  int64_t batches = 0;      // 0 = every window of the file
  int64_t batch_size = 8;   // windows per forward
  bool json = false;
};

// Returns the process exit code: 0 on success; 2 for bad usage (a --data-format that is not one,
// a checkpoint or data file that is missing or does not fit the model); 1 when the evaluation
// failed (a damaged checkpoint, a read error). Prints the result to stdout and errors to stderr.
int EvalCheckpoint(const EvalOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_EVAL_COMMAND_H_
