// The coordinator's job API, transport-free: submit, inspect, list, cancel and watch jobs over a
// Store. The gRPC and HTTP endpoints convert their messages to these calls and back; every
// decision (validation, idempotency, which states may be cancelled) is made here.
//
// Every event of a job is appended through the coordinator (state changes by TransitionJob inside
// Transition), so that watchers blocked in Watch wake on a condition variable when one arrives
// instead of polling the store.
#ifndef MOETRAIN_SERVER_CORE_COORDINATOR_H_
#define MOETRAIN_SERVER_CORE_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.pb.h"
#include "moetrain/v1/job.pb.h"
#include "server/core/job_state.h"
#include "server/core/store.h"

namespace moetrain::server {

// Event kinds beside the store's own (kSubmittedEventKind, kStateChangeEventKind,
// kStepMetricsEventKind, whose payload is a serialized moetrain.v1.StepMetrics):
// a log line of a rank or of the coordinator, as plain text;
inline constexpr char kLogEventKind[] = "log";
// a checkpoint that became good, as a serialized moetrain.v1.CheckpointSaved.
inline constexpr char kCheckpointSavedEventKind[] = "checkpoint_saved";

// Longest submission id a client may choose.
inline constexpr size_t kMaxSubmissionIdLength = 128;

struct ListOptions {
  // Jobs in any of these states; empty = every state.
  std::vector<JobState> states;
  int page_size = 0;  // 0 = the default (100); capped at 1000
  std::string page_token;
  // A filter that was given but named no real state (the wire's UNSPECIFIED): matches nothing.
  bool match_nothing = false;
};

struct WatchOptions {
  // First store sequence to deliver (store sequences start at 1).
  int64_t from_sequence = 1;
  // Asked between waits; true ends the watch with OK. A watcher blocked on the condition variable
  // wakes at once for a new event and at least every cancel_check_interval for this question,
  // because some callers (a synchronous gRPC handler) cannot be notified of a cancellation.
  std::function<bool()> is_cancelled;
  absl::Duration cancel_check_interval = absl::Milliseconds(200);
  // Deliver the events recorded so far and return, instead of waiting for the job to finish.
  bool no_wait = false;
};

// Called once per event, in sequence order; returning false ends the watch with OK (the
// receiver went away).
using EventCallback = std::function<bool(const EventRecord& event)>;

class Coordinator {
 public:
  // `store` is not owned and must outlive the coordinator.
  explicit Coordinator(Store* store);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Resolves (defaults + validation) and stores the spec as a PENDING job. InvalidArgument naming
  // the field for a bad spec or submission id, or a path over kMaxPathBytes; nothing is stored
  // then. The same submission id with the same resolved spec and priority returns the first job;
  // with another spec or priority, AlreadyExists.
  // Then calls the submitted listener (SetSubmittedListener).
  absl::StatusOr<JobRecord> Submit(absl::string_view submission_id, const v1::JobSpec& spec,
                                   int32_t priority);
  // The same for a serialized moetrain.v1.JobSpec.
  absl::StatusOr<JobRecord> SubmitSerialized(absl::string_view submission_id,
                                             absl::string_view spec_bytes, int32_t priority);

  // Whether Submit has created a job with this submission_id (a repeat returns that job).
  absl::StatusOr<bool> HasSubmission(absl::string_view submission_id);
  absl::StatusOr<JobRecord> Get(absl::string_view job_id);
  absl::StatusOr<JobPage> List(const ListOptions& options);

  // PENDING, SCHEDULED, RUNNING or RESTARTING → CANCELLED, recording `reason` ("cancelled" when
  // empty). FailedPrecondition for a job already in a final state; InvalidArgument for a reason
  // over kMaxReasonBytes (limits.h).
  absl::StatusOr<JobRecord> Cancel(absl::string_view job_id, absl::string_view reason);

  // Delivers the job's events with sequence >= from_sequence, the recorded ones first, then new
  // ones as they are appended, without gaps or duplicates. Returns OK after the event that moves
  // the job to a final state (or at once when the job is final and no events are left), when the
  // callback returns false, or when options.is_cancelled says so. Unavailable after Shutdown (the
  // watch did not see the end: resume it elsewhere). NotFound for an unknown job.
  absl::Status Watch(absl::string_view job_id, const WatchOptions& options,
                     const EventCallback& callback);

  // For the components that drive jobs (scheduler, worker reports): they append through here so
  // that watchers wake.
  absl::StatusOr<JobRecord> Transition(absl::string_view job_id, JobState from, JobState to,
                                       absl::string_view reason,
                                       const TransitionOptions& options = {});
  // Log lines (kLogEventKind) over kMaxLogLineBytes are cut and marked (limits.h).
  absl::StatusOr<int64_t> AppendEvent(absl::string_view job_id, absl::string_view kind,
                                      absl::string_view payload);
  absl::Status AppendEvents(const std::vector<NewEvent>& events);
  absl::StatusOr<int64_t> RecordStepMetrics(absl::string_view job_id, int32_t attempt,
                                            const v1::StepMetrics& metrics);

  // The job's checkpoints whose directories are still there, oldest first (workers prune old
  // ones). When this process cannot see the directory of a checkpoint's job at all (the workers
  // mount storage the coordinator does not), every recorded one is listed.
  absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(absl::string_view job_id);

  // Reads of the event log that never wait, for views of it (the dashboard's JSON API): the job's
  // newest event (nullopt when it has none), and up to `limit` (1..10000) events with sequence >=
  // from_sequence, in order. NotFound for an unknown job.
  absl::StatusOr<std::optional<EventRecord>> LastEvent(absl::string_view job_id);
  absl::StatusOr<std::vector<EventRecord>> ReadEvents(absl::string_view job_id,
                                                      int64_t from_sequence, int limit);

  // Ends every Watch in progress (with Unavailable) and makes new ones return so at once.
  void Shutdown();

  // Told the id of the job after every successful Submit (repeats included); the scheduler uses
  // it to look for work. Set once, before serving.
  void SetSubmittedListener(std::function<void(const std::string& job_id)> listener);

 private:
  // Wakes every watcher: something was appended.
  void NotifyAppended();

  Store* const store_;
  std::function<void(const std::string& job_id)> submitted_listener_;
  absl::Mutex mu_;
  absl::CondVar appended_;
  // Bumped on every append; a watcher waits until it moves.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

// Names a job spec may have without being able to leave the directory it is joined to: OK, or
// InvalidArgument naming spec name and value.
absl::Status ValidateJobNameForPath(absl::string_view name);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_COORDINATOR_H_
