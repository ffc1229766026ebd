// Where a job may write and read on a worker. A spec names paths (checkpoint.dir, data.path,
// checkpoint.init_from) that the worker resolves on its own file system: these checks keep a
// job's checkpoints under the coordinator's checkpoint root and, when the operator names data
// roots, what it reads under them. Paths are resolved as the worker sees them (ResolvePath:
// relative ones against its working directory, its --work-dir; symbolic links of the existing
// components followed), once: the rank then reads and writes the resolved paths, so that what
// was checked is what is used.
#ifndef MOETRAIN_WORKER_JOB_PATHS_H_
#define MOETRAIN_WORKER_JOB_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/resolve_path.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

struct JobPathPolicy {
  // The coordinator's checkpoint root (Assignment.checkpoint_root); empty = not checked.
  std::string checkpoint_root = {};
  // Directories a job's data.path and checkpoint.init_from must lie in (the worker's --data-root
  // flags); empty = any file the worker can read.
  std::vector<std::string> data_roots = {};
};

// A job's paths, resolved (ResolvePath) and checked.
struct ResolvedJobPaths {
  // The directory the job's own directory is made in (<dir> of `<dir>/<job id>`): the trainer's
  // checkpoint_dir. The job's directory itself is not resolved: a link there is the operator's
  // choice, not a spec's.
  std::string checkpoint_dir;
  // data.path and checkpoint.init_from; empty when the spec names none.
  std::string data_path;
  std::string init_from;
};

// Resolves the job's paths and checks them. InvalidArgument (the job cannot run here, whichever
// attempt) naming the spec field, its value and the root, when the directory that holds the
// job's checkpoint directory `job_dir` (Assignment.checkpoint_dir, `<checkpoint.dir or
// root>/<job id>`) is not under policy.checkpoint_root, or when data.path, checkpoint.init_from or
// any entry of the init_from directory (the files a checkpoint's reader opens: a link inside it
// leading out of the roots would read what they keep out) is not under any of policy.data_roots.
// An error naming the path when the file system cannot resolve one.
absl::StatusOr<ResolvedJobPaths> CheckJobPaths(const v1::JobSpec& spec, const std::string& job_dir,
                                               const JobPathPolicy& policy);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_JOB_PATHS_H_
