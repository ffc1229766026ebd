#include "server/core/job_state.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moetrain::server {

absl::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "PENDING";
    case JobState::kScheduled:
      return "SCHEDULED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kRestarting:
      return "RESTARTING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

absl::StatusOr<JobState> ParseJobState(absl::string_view name) {
  for (JobState state : kAllJobStates) {
    if (JobStateName(state) == name) return state;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown job state '", name, "'"));
}

bool IsFinal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

bool IsLegalTransition(JobState from, JobState to) {
  if (IsFinal(from)) return false;
  if (to == JobState::kCancelled) return true;
  switch (from) {
    case JobState::kPending:
      return to == JobState::kScheduled;
    case JobState::kScheduled:
      return to == JobState::kRunning || to == JobState::kRestarting || to == JobState::kFailed;
    case JobState::kRunning:
      return to == JobState::kSucceeded || to == JobState::kFailed || to == JobState::kRestarting;
    case JobState::kRestarting:
      return to == JobState::kScheduled || to == JobState::kFailed;
    default:
      return false;
  }
}

std::string EncodeStateChange(const StateChange& change) {
  return absl::StrCat(JobStateName(change.from), " ", JobStateName(change.to), " ", change.reason);
}

absl::StatusOr<StateChange> DecodeStateChange(absl::string_view payload) {
  std::vector<absl::string_view> parts = absl::StrSplit(payload, absl::MaxSplits(' ', 2));
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("state-change payload '", payload, "' is not 'FROM TO reason'"));
  }
  StateChange change;
  auto from = ParseJobState(parts[0]);
  if (!from.ok()) return from.status();
  auto to = ParseJobState(parts[1]);
  if (!to.ok()) return to.status();
  change.from = *from;
  change.to = *to;
  change.reason = std::string(parts[2]);
  return change;
}

absl::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return "IDLE";
    case WorkerState::kBusy:
      return "BUSY";
    case WorkerState::kDraining:
      return "DRAINING";
    case WorkerState::kLost:
      return "LOST";
  }
  return "UNKNOWN";
}

absl::StatusOr<WorkerState> ParseWorkerState(absl::string_view name) {
  for (WorkerState state : kAllWorkerStates) {
    if (WorkerStateName(state) == name) return state;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown worker state '", name, "'"));
}

}  // namespace moetrain::server
