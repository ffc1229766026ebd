// `moetrain eval`: the mean next-token loss of a checkpoint over a token file, in this process.
#ifndef MOETRAIN_CLIENT_EVAL_COMMAND_H_
#define MOETRAIN_CLIENT_EVAL_COMMAND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace moetrain {

struct EvalOptions {
  std::string checkpoint;  // a step directory
  std::string data_path;
  std::string data_format;  // llmc | u16 | u32 | text
  int64_t batches = 0;      // 0 = every window of the file
  int64_t batch_size = 8;   // windows per forward
  bool json = false;
};

// Returns the process exit code: 0 on success; 2 for bad usage (a --data-format that is not one,
// a checkpoint or data file that is missing or does not fit the model); 1 when the evaluation
// failed (a damaged checkpoint, a read error). Prints the result to stdout and errors to stderr.
int EvalCheckpoint(const EvalOptions& options);

// What the commands that run the engine in this process (eval, export, import) do with an error:
// print "moetrain COMMAND: message" to stderr and return the exit code: 2 when the flags or the
// input are what must change (InvalidArgument, NotFound, FailedPrecondition, AlreadyExists,
// OutOfRange), 1 otherwise (a damaged checkpoint, a read error).
int CommandFailed(const char* command, const absl::Status& status);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_EVAL_COMMAND_H_
