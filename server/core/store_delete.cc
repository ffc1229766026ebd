// Store::DeleteJob: a final job leaves the store with everything recorded about it.
#include "absl/strings/str_cat.h"
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
    return db_->Execute("DELETE FROM jobs WHERE id = ?", job_id);
  });
}

}  // namespace moetrain::server
