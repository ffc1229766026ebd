// Paths as the file system resolves them, for the checks that keep a job's files under the roots
// an operator names (the worker's --data-root and checkpoint root, the coordinator's checkpoint
// root): relative paths against the working directory, the symbolic links of the components that
// exist followed, the rest normalized.
#ifndef MOETRAIN_ENGINE_CORE_RESOLVE_PATH_H_
#define MOETRAIN_ENGINE_CORE_RESOLVE_PATH_H_

#include <string>

#include "absl/status/statusor.h"

namespace moetrain {

// `path` made absolute (against the working directory), its existing components' symbolic links
// resolved and the rest normalized, without a trailing '/'; an error when the file system cannot
// tell (a component it may not search, say).
absl::StatusOr<std::string> ResolvePath(const std::string& path);

// Whether ResolvePath(path) is ResolvePath(root) or lies below it.
absl::StatusOr<bool> ResolvesUnder(const std::string& path, const std::string& root);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_RESOLVE_PATH_H_
