#include "client/hf_commands.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/eval_command.h"
#include "client/terminal_text.h"
#include "engine/train/hf_checkpoint.h"
#include "engine/train/memory_estimate.h"

namespace moetrain {

int ExportCommand(const ExportOptions& options) {
  HfExportOptions export_options;
  export_options.force = options.force;
  if (options.dtype == "f32") {
    export_options.dtype = DType::kF32;
  } else if (options.dtype != "bf16") {
    return CommandFailed(
        "export", absl::InvalidArgumentError(absl::StrCat("--dtype = '", Abbreviate(options.dtype),
                                                          "' is not bf16 or f32")));
  }
  if (!options.max_shard_size.empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(options.max_shard_size, "--max-shard-size");
    if (!bytes.ok()) return CommandFailed("export", bytes.status());
    export_options.shard_bytes = *bytes;
  }
  absl::StatusOr<HfExportReport> report =
      ExportHuggingFace(options.checkpoint, options.to_hf, export_options);
  if (!report.ok()) return CommandFailed("export", report.status());
  for (const std::string& note : report->notes) {
    std::fprintf(stderr, "moetrain export: note: %s\n", TerminalSafe(note).c_str());
  }
  std::printf("exported %s to %s: %lld tensors (%s, %s) in %d shard%s; config.json names %s\n",
              TerminalSafe(options.checkpoint).c_str(), TerminalSafe(report->out_dir).c_str(),
              static_cast<long long>(report->num_tensors), options.dtype.c_str(),
              FormatBytes(static_cast<double>(report->total_bytes)).c_str(), report->num_shards,
              report->num_shards == 1 ? "" : "s", report->architecture.c_str());
  return 0;
}

int ImportCommand(const ImportOptions& options) {
  // As `moetrain run` limits a job: the flag, else this machine's memory.
  HfImportOptions import_options;
  if (!options.memory_limit.empty()) {
    absl::StatusOr<int64_t> limit = ParseByteSize(options.memory_limit, "--memory-limit");
    if (!limit.ok()) return CommandFailed("import", limit.status());
    import_options.memory_limit_bytes = *limit;
    import_options.memory_limit_name = "--memory-limit";
  } else if (absl::StatusOr<int64_t> machine = MachineMemoryBytes(); machine.ok()) {
    import_options.memory_limit_bytes = *machine;
    import_options.memory_limit_name = "this machine's memory; --memory-limit sets another limit";
  }
  absl::StatusOr<HfImportReport> report =
      ImportHuggingFace(options.from_hf, options.out, import_options);
  if (!report.ok()) {
    const int code = CommandFailed("import", report.status());
    // Too large for the memory is the input's fault here, as for `moetrain run`: exit 2.
    return report.status().code() == absl::StatusCode::kResourceExhausted ? 2 : code;
  }
  std::printf("imported %s (%s, %lld tensors", TerminalSafe(options.from_hf).c_str(),
              TerminalSafe(report->architecture).c_str(),
              static_cast<long long>(report->num_tensors));
  if (report->ignored_tensors > 0) {
    std::printf("; %lld MTP copies of the embedding and head ignored",
                static_cast<long long>(report->ignored_tensors));
  }
  std::printf(") into %s\n", TerminalSafe(report->step_dir).c_str());
  return 0;
}

}  // namespace moetrain
