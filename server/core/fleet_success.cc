// Fleet::ReportSucceeded: a rank's word that it finished is taken only with the job's final
// checkpoint on record. A worker that says SUCCEEDED early, or without that checkpoint (its own
// bug, a checkpoint it skipped, or a token holder's worker speaking for another user's job), must
// not end the job SUCCEEDED with nothing to show for it.
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"

namespace moetrain::server {

absl::Status Fleet::ReportSucceeded(AttemptEntry& attempt, int32_t member, WorkerEntry& worker,
                                    int64_t step, const std::string& who) {
  MOETRAIN_RETURN_IF_ERROR(MarkStarted(attempt, member));
  ReleaseSlot(worker);
  const int64_t final_step = attempt.total_steps;
  MOETRAIN_ASSIGN_OR_RETURN(const JobRecord job, store_->GetJob(attempt.job_id));
  const bool recorded = job.latest_checkpoint_step == final_step;
  // The member's own report of it suffices until the others have ended: a checkpoint is recorded
  // once every member reported it, and each worker sends its reports in order.
  auto reported = attempt.checkpoint_members.find(final_step);
  const bool reported_here =
      reported != attempt.checkpoint_members.end() && reported->second.count(member) > 0;
  const bool last = std::count(attempt.succeeded.begin(), attempt.succeeded.end(), false) == 1 &&
                    !attempt.succeeded[member];
  if (step == final_step && (recorded || (reported_here && !last))) {
    attempt.succeeded[member] = true;
    if (!last) return absl::OkStatus();
    return FinishAttempt(attempt, step);
  }
  const std::string why = absl::StrCat(
      who, " reported SUCCEEDED at step ", step, ", but the job's final checkpoint (step ",
      final_step, ", train.steps) is not recorded",
      job.latest_checkpoint_step.has_value()
          ? absl::StrCat(" (the newest recorded is step ", *job.latest_checkpoint_step, ")")
          : " (none is recorded)",
      reported_here ? ": other workers of the gang did not report it" : "");
  MOETRAIN_RETURN_IF_ERROR(EndAttemptUnsuccessfully(attempt, "failed", why, Failure::kTransient));
  return absl::FailedPreconditionError(why);
}

}  // namespace moetrain::server
