#include "engine/core/resolve_path.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ResolvePath(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return IoError(ec.value(), absl::StrCat("resolve '", path, "'"));
  // weakly_canonical follows the links of the components that exist and normalizes the rest, so
  // a directory still to be created resolves too.
  const fs::path resolved = fs::weakly_canonical(absolute, ec);
  if (ec) return IoError(ec.value(), absl::StrCat("resolve '", path, "'"));
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

}  // namespace moetrain
