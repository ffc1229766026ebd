// `moetrain export` and `moetrain import`: a checkpoint step as a Hugging Face model directory,
// and back (engine/train/hf_checkpoint.h, docs/checkpoints.md), in this process.
#ifndef MOETRAIN_CLIENT_HF_COMMANDS_H_
#define MOETRAIN_CLIENT_HF_COMMANDS_H_

#include <string>

namespace moetrain {

struct ExportOptions {
  std::string checkpoint;  // a step directory
  std::string to_hf;       // the Hugging Face directory to write; absent or empty
  std::string dtype = "bf16";
  std::string max_shard_size;  // ParseByteSize text; empty = Hugging Face's 5 GB
  bool force = false;
};

struct ImportOptions {
  std::string from_hf;       // a Hugging Face directory
  std::string out;           // a checkpoint root, <dir>/<job id>
  std::string memory_limit;  // ParseByteSize text; empty = this machine's memory
};

// Each returns the process exit code: 0 on success; 2 for bad usage or input that cannot be
// exported or imported (a missing checkpoint or directory, an unsupported config.json or tensor,
// an export that needs --force, an output that already exists, an import larger than the memory
// limit); 1 when it failed otherwise (a damaged checkpoint, a write error). The result goes to
// stdout, notes and errors to stderr.
int ExportCommand(const ExportOptions& options);
int ImportCommand(const ImportOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_HF_COMMANDS_H_
