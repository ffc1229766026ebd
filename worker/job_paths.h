// Where a job may write and read on a worker. A spec names paths (checkpoint.dir, data.path) that
// the worker resolves on its own file system: these checks keep a job's checkpoints under the
// coordinator's checkpoint root and, when the operator names data roots, its data under them.
// Paths are resolved as the worker sees them: relative ones against its working directory (its
// --work-dir), symbolic links of the existing components followed.
#ifndef MOETRAIN_WORKER_JOB_PATHS_H_
#define MOETRAIN_WORKER_JOB_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

struct JobPathPolicy {
  // The coordinator's checkpoint root (Assignment.checkpoint_root); empty = not checked.
  std::string checkpoint_root = {};
  // Directories a job's data.path must lie in (the worker's --data-root flags); empty = any file
  // the worker can read.
  std::vector<std::string> data_roots = {};
};

// `path` made absolute (against the working directory), its existing components' symbolic links
// resolved and the rest normalized; an error when the file system cannot tell.
absl::StatusOr<std::string> ResolvePath(const std::string& path);

// Whether ResolvePath(path) is ResolvePath(root) or lies below it.
absl::StatusOr<bool> ResolvesUnder(const std::string& path, const std::string& root);

// InvalidArgument (the job cannot run here, whichever attempt) naming the spec field, its value
// and the root, when the directory that holds the job's checkpoint directory `job_dir`
// (Assignment.checkpoint_dir, `<checkpoint.dir or root>/<job id>`) is not under
// policy.checkpoint_root, or when data.path or checkpoint.init_from is not under any of
// policy.data_roots.
absl::Status CheckJobPaths(const v1::JobSpec& spec, const std::string& job_dir,
                           const JobPathPolicy& policy);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_JOB_PATHS_H_
