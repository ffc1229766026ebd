// Fleet::Delete: a final job leaves the store, the metrics and (when asked) the checkpoint root,
// never anything outside that root.
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/core/log.h"
#include "engine/core/resolve_path.h"
#include "engine/core/status.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"

namespace moetrain::server {
namespace {

namespace fs = std::filesystem;

// Moves `dir`, the checkpoint directory of job `job_id`, to a hidden name beside it, so that the
// slow removal can run outside the fleet's lock. Never leaves the root: `dir` itself must be a
// real directory named after the job (remove_all then removes the symbolic links it meets
// inside rather than what they point to). The new name, or nullopt when there was no directory.
absl::StatusOr<std::optional<fs::path>> SetCheckpointDirAside(const fs::path& dir,
                                                              absl::string_view job_id) {
  if (dir.filename() != fs::path(std::string(job_id))) {
    return absl::InternalError(
        absl::StrCat("checkpoint directory ", dir.string(), " is not named after job ", job_id));
  }
  std::error_code error;
  const fs::file_status status = fs::symlink_status(dir, error);
  if (status.type() == fs::file_type::not_found) return std::nullopt;
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot inspect ", dir.string(), ": ", error.message()));
  }
  if (status.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", dir.string(), " is ",
        status.type() == fs::file_type::symlink ? "a symbolic link" : "not a directory",
        "; not following it, nothing deleted"));
  }
  const fs::path aside = dir.parent_path() / absl::StrCat(".deleting-", job_id);
  fs::rename(dir, aside, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot move ", dir.string(), " aside: ",
                                            error.message(), " (the job was not deleted; retry)"));
  }
  return aside;
}

// The job's checkpoint directory `dir` (`<checkpoint.dir or root>/<job id>`) with the directory
// that holds it resolved as the workers resolved it when they wrote there (CheckJobPaths): its
// links followed, a `..` after a directory that does not exist dropped. That directory must lie
// under the checkpoint root `root`, resolved too: a link among its components that leads out of
// the root is not followed (FailedPrecondition, nothing deleted).
absl::StatusOr<fs::path> ResolvedJobDir(const std::string& dir, const std::string& root) {
  const fs::path job_dir(dir);
  const std::string parent = job_dir.parent_path().empty() ? "." : job_dir.parent_path().string();
  absl::StatusOr<std::string> resolved = ResolvePath(parent);
  absl::StatusOr<bool> inside =
      resolved.ok() ? ResolvesUnder(*resolved, root) : absl::StatusOr<bool>(resolved.status());
  if (!inside.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot resolve checkpoint directory ", dir,
                                                      ": ", inside.status().message(),
                                                      "; nothing deleted"));
  }
  if (!*inside) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", dir, " lies in ", *resolved, ", outside the checkpoint root ",
        root, " (a symbolic link leads there); not following it, nothing deleted"));
  }
  return fs::path(*resolved) / job_dir.filename();
}

}  // namespace

absl::StatusOr<DeletedJob> Fleet::Delete(absl::string_view job_id, bool delete_checkpoints) {
  std::optional<fs::path> aside;
  MOETRAIN_ASSIGN_OR_RETURN(DeletedJob deleted, DeleteLocked(job_id, delete_checkpoints, &aside));
  if (!aside.has_value()) return deleted;
  // Outside the lock: removing a large directory (on a network file system, say) must not hold
  // up heartbeats and reports.
  std::error_code error;
  fs::remove_all(*aside, error);
  if (error) {
    Log(absl::StrCat("job ", job_id, " deleted, but removing its checkpoints at ", aside->string(),
                     " failed: ", error.message(), "; remove that directory by hand"));
    deleted.checkpoint_dir = aside->string();
    return deleted;
  }
  deleted.checkpoints_deleted = true;
  return deleted;
}

absl::StatusOr<DeletedJob> Fleet::DeleteLocked(absl::string_view job_id, bool delete_checkpoints,
                                               std::optional<std::filesystem::path>* aside) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
  if (!IsFinal(job.state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.id, " is ", JobStateName(job.state),
        "; only a SUCCEEDED, FAILED or CANCELLED job can be deleted (cancel it first)"));
  }
  // A cancelled job's ranks may still be writing their last checkpoint.
  for (const auto& [worker_id, worker] : workers_) {
    if (worker->slot.has_value() && worker->slot->assignment.job_id() == job.id) {
      return absl::UnavailableError(
          absl::StrCat("job ", job.id, ": rank ", worker->slot->assignment.rank(),
                       " is still stopping on worker ", worker_id, "; retry in a few seconds"));
    }
  }
  v1::JobSpec spec;
  if (!spec.ParseFromString(job.spec)) {
    return absl::DataLossError(absl::StrCat("job ", job.id, ": stored spec does not parse"));
  }
  DeletedJob deleted;
  deleted.checkpoint_dir = CheckpointRoot(job, spec);
  fs::path job_dir;
  if (delete_checkpoints) {
    if (options_.checkpoint_naming != CheckpointNaming::kJobId) {
      return absl::FailedPreconditionError(
          "checkpoint directories are named after job names here, not ids; not deleting them");
    }
    MOETRAIN_ASSIGN_OR_RETURN(job_dir,
                              ResolvedJobDir(deleted.checkpoint_dir, options_.checkpoint_dir));
    // Files first: when moving them aside fails, the job is still there to retry with.
    MOETRAIN_ASSIGN_OR_RETURN(*aside, SetCheckpointDirAside(job_dir, job.id));
  }
  if (absl::Status status = store_->DeleteJob(job.id); !status.ok()) {
    if (aside->has_value()) {  // put the files back: the job stays, whole
      std::error_code error;
      fs::rename(**aside, job_dir, error);
      aside->reset();
    }
    return status;
  }
  metrics_.Retire(job.id);
  waiting_reasons_.erase(job.id);
  Log(absl::StrCat("job ", job.id, " deleted; its checkpoint directory ", deleted.checkpoint_dir,
                   aside->has_value()   ? " is being removed"
                   : delete_checkpoints ? " was not there"
                                        : " was kept"));
  return deleted;
}

}  // namespace moetrain::server
