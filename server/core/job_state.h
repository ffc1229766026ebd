// The job state machine and the worker states, with their stored names. Pure functions, no I/O:
// the store enforces the transition table, the scheduler drives it.
#ifndef MOETRAIN_SERVER_CORE_JOB_STATE_H_
#define MOETRAIN_SERVER_CORE_JOB_STATE_H_

#include <array>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moetrain::server {

// PENDING → SCHEDULED → RUNNING → (SUCCEEDED | FAILED | CANCELLED). A failed attempt goes
// RUNNING → RESTARTING → SCHEDULED → RUNNING again. CANCELLED is reachable from every non-final
// state. A gang can also fail while SCHEDULED (a worker lost before every rank reports running),
// so SCHEDULED → RESTARTING and SCHEDULED → FAILED are legal too, and a restart that cannot go on
// (no usable checkpoint, restarts exhausted) may end RESTARTING → FAILED.
enum class JobState {
  kPending,
  kScheduled,
  kRunning,
  kRestarting,
  kSucceeded,
  kFailed,
  kCancelled,
};

inline constexpr std::array<JobState, 7> kAllJobStates = {
    JobState::kPending,   JobState::kScheduled, JobState::kRunning,   JobState::kRestarting,
    JobState::kSucceeded, JobState::kFailed,    JobState::kCancelled,
};

// "PENDING", "SCHEDULED", ...: the names in the store, the wire enum and the metrics labels.
absl::string_view JobStateName(JobState state);
// The inverse of JobStateName; InvalidArgument names the unknown value.
absl::StatusOr<JobState> ParseJobState(absl::string_view name);

// SUCCEEDED, FAILED and CANCELLED: nothing leaves them.
bool IsFinal(JobState state);
bool IsLegalTransition(JobState from, JobState to);

// A state-change event, as TransitionJob appends it (kind kStateChangeEventKind). The payload is
// text, "FROM TO reason", so that it reads plainly in the sqlite3 shell too.
inline constexpr char kStateChangeEventKind[] = "state_change";
struct StateChange {
  JobState from = JobState::kPending;
  JobState to = JobState::kPending;
  std::string reason;
};
std::string EncodeStateChange(const StateChange& change);
absl::StatusOr<StateChange> DecodeStateChange(absl::string_view payload);

// A worker as the coordinator sees it: IDLE (registered, free), BUSY (runs a rank), DRAINING
// (finishes its rank, takes no new one), LOST (missed its heartbeats).
enum class WorkerState { kIdle, kBusy, kDraining, kLost };

inline constexpr std::array<WorkerState, 4> kAllWorkerStates = {
    WorkerState::kIdle, WorkerState::kBusy, WorkerState::kDraining, WorkerState::kLost};

absl::string_view WorkerStateName(WorkerState state);
absl::StatusOr<WorkerState> ParseWorkerState(absl::string_view name);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_JOB_STATE_H_
