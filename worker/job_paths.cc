#include "worker/job_paths.h"

#include <filesystem>
#include <system_error>

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

}  // namespace

absl::StatusOr<std::string> ResolvePath(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return IoError(ec.value(), absl::StrCat("resolve '", Shown(path), "'"));
  // weakly_canonical follows the links of the components that exist and normalizes the rest, so
  // a directory still to be created resolves too.
  const fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) return IoError(ec.value(), absl::StrCat("resolve '", Shown(path), "'"));
  fs::path normal = resolved.lexically_normal();
  if (!normal.has_filename() && normal.has_relative_path()) normal = normal.parent_path();
  return normal.string();
}

absl::StatusOr<bool> ResolvesUnder(const std::string& path, const std::string& root) {
  MOETRAIN_ASSIGN_OR_RETURN(const std::string resolved_path, ResolvePath(path));
  MOETRAIN_ASSIGN_OR_RETURN(const std::string resolved_root, ResolvePath(root));
  const fs::path relative = fs::path(resolved_path).lexically_relative(resolved_root);
  return !relative.empty() && *relative.begin() != "..";
}

absl::Status CheckJobPaths(const v1::JobSpec& spec, const std::string& job_dir,
                           const JobPathPolicy& policy) {
  if (!policy.checkpoint_root.empty()) {
    // The directory the job's own one is made in (<dir> of <dir>/<job id>) is what a spec names;
    // the job's directory itself, when someone made it a link, is the operator's (or, under
    // `moetrain run`, the user's) choice.
    const fs::path parent = fs::path(job_dir).lexically_normal().parent_path();
    absl::StatusOr<bool> inside =
        ResolvesUnder(parent.empty() ? "." : parent.string(), policy.checkpoint_root);
    if (!inside.ok() || !*inside) {
      const std::string field =
          spec.checkpoint().dir().empty()
              ? "the job's checkpoint directory"
              : absl::StrCat("checkpoint.dir = '", Shown(spec.checkpoint().dir()), "'");
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", Shown(job_dir), "' is outside the checkpoint root '",
                       Shown(policy.checkpoint_root), "' on this worker",
                       inside.ok() ? "" : absl::StrCat(" (", inside.status().message(), ")")));
    }
  }
  // What the job reads: under one of the data roots, when the operator names any.
  const std::pair<const char*, const std::string&> reads[] = {
      {"data.path", spec.data().path()}, {"checkpoint.init_from", spec.checkpoint().init_from()}};
  for (const auto& [field, path] : reads) {
    if (policy.data_roots.empty() || path.empty()) continue;
    bool inside_one = false;
    for (const std::string& root : policy.data_roots) {
      absl::StatusOr<bool> inside = ResolvesUnder(path, root);
      inside_one |= inside.ok() && *inside;
    }
    if (inside_one) continue;
    absl::StatusOr<std::string> resolved = ResolvePath(path);
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = '", Shown(path), "'",
        resolved.ok() && *resolved != path ? absl::StrCat(" (resolved: '", Shown(*resolved), "')")
                                           : "",
        " is outside every --data-root of this worker ('", absl::StrJoin(policy.data_roots, "', '"),
        "')"));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
