#include "worker/job_paths.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;

// Long values stay readable in an error message.
std::string Shown(const std::string& value) {
  constexpr size_t kMaxShown = 256;
  return value.size() <= kMaxShown ? value : absl::StrCat(value.substr(0, kMaxShown), "...");
}

// Whether `resolved` lies under one of `roots`.
bool UnderOneOf(const std::string& resolved, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    absl::StatusOr<bool> inside = ResolvesUnder(resolved, root);
    if (inside.ok() && *inside) return true;
  }
  return false;
}

std::string DataRootsShown(const JobPathPolicy& policy) {
  return absl::StrCat("every --data-root of this worker ('",
                      absl::StrJoin(policy.data_roots, "', '"), "')");
}

// The files a checkpoint reader opens in the init_from directory `dir` (resolved) are its
// entries: each must resolve under a data root too, or a link among them would read a file the
// roots keep out (another job's weights). A directory that cannot be listed is left to the
// reader, which says what is wrong with it.
absl::Status CheckInitFromEntries(const std::string& value, const std::string& dir,
                                  const JobPathPolicy& policy) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    absl::StatusOr<std::string> resolved = ResolvePath(it->path().string());
    if (resolved.ok() && UnderOneOf(*resolved, policy.data_roots)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.init_from = '", Shown(value), "': its file '",
        Shown(it->path().filename().string()), "'",
        resolved.ok() ? absl::StrCat(" resolves to '", Shown(*resolved), "', which") : "",
        " is outside ", DataRootsShown(policy)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResolvedJobPaths> CheckJobPaths(const v1::JobSpec& spec, const std::string& job_dir,
                                               const JobPathPolicy& policy) {
  ResolvedJobPaths paths;
  // The directory the job's own one is made in (<dir> of <dir>/<job id>) is what a spec names;
  // the job's directory itself, when someone made it a link, is the operator's (or, under
  // `moetrain run`, the user's) choice.
  const fs::path parent = fs::path(job_dir).parent_path();
  const std::string field =
      spec.checkpoint().dir().empty()
          ? "the job's checkpoint directory"
          : absl::StrCat("checkpoint.dir = '", Shown(spec.checkpoint().dir()), "'");
  absl::StatusOr<std::string> checkpoint_dir = ResolvePath(parent.empty() ? "." : parent.string());
  absl::StatusOr<bool> inside = true;
  if (!checkpoint_dir.ok()) {
    inside = checkpoint_dir.status();
  } else if (!policy.checkpoint_root.empty()) {
    inside = ResolvesUnder(*checkpoint_dir, policy.checkpoint_root);
  }
  if (!inside.ok() || !*inside) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", Shown(job_dir), "'",
                     policy.checkpoint_root.empty()
                         ? " cannot be resolved on this worker"
                         : absl::StrCat(" is outside the checkpoint root '",
                                        Shown(policy.checkpoint_root), "' on this worker"),
                     inside.ok() ? "" : absl::StrCat(" (", inside.status().message(), ")")));
  }
  paths.checkpoint_dir = *std::move(checkpoint_dir);
  // What the job reads: under one of the data roots, when the operator names any.
  struct Read {
    const char* field;
    const std::string& path;
    std::string* resolved;
  };
  const Read reads[] = {{"data.path", spec.data().path(), &paths.data_path},
                        {"checkpoint.init_from", spec.checkpoint().init_from(), &paths.init_from}};
  for (const Read& read : reads) {
    if (read.path.empty()) continue;
    absl::StatusOr<std::string> resolved = ResolvePath(read.path);
    if (!resolved.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(read.field, " = '", Shown(read.path),
                                                     "' cannot be resolved on this worker (",
                                                     resolved.status().message(), ")"));
    }
    if (!policy.data_roots.empty() && !UnderOneOf(*resolved, policy.data_roots)) {
      return absl::InvalidArgumentError(absl::StrCat(
          read.field, " = '", Shown(read.path), "'",
          *resolved != read.path ? absl::StrCat(" (resolved: '", Shown(*resolved), "')") : "",
          " is outside ", DataRootsShown(policy)));
    }
    *read.resolved = *std::move(resolved);
  }
  if (!policy.data_roots.empty() && !paths.init_from.empty()) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckInitFromEntries(spec.checkpoint().init_from(), paths.init_from, policy));
  }
  return paths;
}

}  // namespace moetrain
