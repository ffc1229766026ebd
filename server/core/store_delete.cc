// Store::DeleteJob: a final job leaves the store with everything recorded about it but its
// submission id, which stays taken for kDeletedSubmissionRetention (a tombstone).
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/core/status.h"
#include "server/core/sqlite.h"
#include "server/core/store.h"

namespace moetrain::server {

absl::Status Store::DeleteJob(absl::string_view job_id) {
  MOETRAIN_RETURN_IF_ERROR(ValidateJobId(job_id));
  return Write([&]() -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, ReadJob(*db_, job_id));
    if (!IsFinal(job.state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName(job.state),
                       "; only a SUCCEEDED, FAILED or CANCELLED job can be deleted"));
    }
    // The rows that reference the job first (foreign keys are on).
    for (const char* table : {"events", "checkpoints", "attempts"}) {
      MOETRAIN_RETURN_IF_ERROR(
          db_->Execute(absl::StrCat("DELETE FROM ", table, " WHERE job_id = ?"), job_id));
    }
    MOETRAIN_RETURN_IF_ERROR(db_->Execute("DELETE FROM jobs WHERE id = ?", job_id));
    if (job.submission_id.empty()) return absl::OkStatus();
    // A submit retried after the delete (its first answer lost) must not run the job again.
    return db_->Execute(
        "INSERT OR REPLACE INTO deleted_submissions (submission_id, job_id, deleted_us) "
        "VALUES (?, ?, ?)",
        job.submission_id, job_id, absl::ToUnixMicros(env_->Now()));
  });
}

absl::Status Store::RefuseDeletedSubmission(absl::string_view submission_id) {
  const absl::Time now = env_->Now();
  MOETRAIN_RETURN_IF_ERROR(db_->Execute("DELETE FROM deleted_submissions WHERE deleted_us < ?",
                                        absl::ToUnixMicros(now - kDeletedSubmissionRetention)));
  MOETRAIN_ASSIGN_OR_RETURN(
      sqlite::Statement tombstone,
      db_->Query("SELECT job_id, deleted_us FROM deleted_submissions WHERE submission_id = ?",
                 std::string(submission_id)));
  MOETRAIN_ASSIGN_OR_RETURN(bool found, tombstone.Step());
  if (!found) return absl::OkStatus();
  const absl::Time deleted_at = absl::FromUnixMicros(tombstone.Int(1));
  return absl::AlreadyExistsError(absl::StrCat(
      "submission_id '", submission_id, "' named job ", tombstone.Text(0), ", deleted at ",
      absl::FormatTime(absl::RFC3339_sec, deleted_at, absl::UTCTimeZone()),
      "; it stays taken until ",
      absl::FormatTime(absl::RFC3339_sec, deleted_at + kDeletedSubmissionRetention,
                       absl::UTCTimeZone()),
      ", so that a retried submit cannot run that job again: submit with another id"));
}

}  // namespace moetrain::server
