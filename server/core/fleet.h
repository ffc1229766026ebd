// The coordinator's side of the workers: registration and liveness, the gang scheduler's passes,
// assignment delivery, progress reports, the per-attempt rendezvous, and fault handling. Every
// job that has workers goes through here; the job API (Coordinator) handles the rest.
//
// Life of an attempt:
//   scheduling pass   PENDING/RESTARTING job + enough IDLE workers → store.StartAttempt, job →
//                     SCHEDULED, one slot per worker (its rank), assignments wait for the polls
//   GetAssignment     delivers a worker's slot; Heartbeat and reports show the rank started; once
//                     every rank has, the job goes RUNNING
//   ReportStep/Log/Checkpoint   events, metrics; a checkpoint is good once every rank reported it
//   ReportAttemptEnd  SUCCEEDED from every rank, at train.steps with the final checkpoint
//                     recorded → job SUCCEEDED (without it, the attempt fails as a transient
//                     failure would). FAILED (transient) from one
//                     rank, a worker lost (no heartbeat for heartbeat_timeout) or a rank that
//                     never starts → the attempt fails: RESTARTING (from the latest good
//                     checkpoint, after the restart backoff) while restarts are left, else FAILED;
//                     the other ranks are told to stop. FAILED (permanent: the spec, its data or
//                     its checkpoint is wrong) → FAILED at once. STOPPED (the worker's SIGTERM) →
//                     RESTARTING at once, without counting a restart.
//   Cancel            job → CANCELLED, its ranks are told to stop.
// A worker stays BUSY until its rank reports its end (or the worker is lost), so a gang never
// shares a worker with a rank that is still winding down.
//
// Every change is written to the store before it is acted on or announced. On start, Create
// reloads the workers and the attempts in flight and waits reconcile_grace for their workers to
// report; ranks reported running continue, the other attempts restart from their checkpoints
// (without counting a restart), and nothing is scheduled until the grace period ends.
//
// Fencing: every report names (job, attempt, rank); one about an attempt that is not the job's
// current one, or a rank not given to the calling worker, is FailedPrecondition. A worker that is
// unknown or was declared lost gets NotFound and registers again.
//
// Thread-safe. Long polls (GetAssignment, KvWait) block on a condition variable; Stop wakes them.
#ifndef MOETRAIN_SERVER_CORE_FLEET_H_
#define MOETRAIN_SERVER_CORE_FLEET_H_

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "moetrain/v1/worker.pb.h"
#include "server/core/coordinator.h"
#include "server/core/fleet_metrics.h"
#include "server/core/fleet_rendezvous.h"
#include "server/core/job_state.h"
#include "server/core/service_metrics.h"
#include "server/core/store.h"

namespace moetrain::server {

// How a job's checkpoint directory is named under FleetOptions::checkpoint_dir.
enum class CheckpointNaming {
  kJobId,    // <dir>/<job id>: unique, the service's layout
  kJobName,  // <dir>/<spec.name>: `moetrain run`, where a person names and resumes jobs by name
};

struct FleetOptions {
  // Told to workers at registration.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A worker silent this long is LOST and its rank's attempt fails.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // After a start that found attempts in flight: how long their workers have to report them
  // before they are restarted; no scheduling meanwhile. Zero = heartbeat_timeout.
  absl::Duration reconcile_grace = absl::ZeroDuration();
  // Longest GetAssignment wait a worker may ask for.
  absl::Duration max_assignment_wait = absl::Seconds(60);
  // Longest KvWait a worker may ask for (a longer timeout is cut to it; none is refused).
  absl::Duration max_kv_wait = absl::Seconds(60);
  // How often the control loop looks for lost workers, ended grace and work to schedule (it
  // also runs at once after a submit or a freed worker).
  absl::Duration control_interval = absl::Milliseconds(250);
  // Lost workers are forgotten (dropped from ListWorkers and the store) after this long.
  absl::Duration forget_lost_after = absl::Hours(24);
  // ... and those that never sent a heartbeat after this long (they did no work to look back
  // on, and a burst of registrations must not stay listed for a day). Zero = heartbeat_timeout.
  absl::Duration forget_never_heartbeated_after = absl::ZeroDuration();
  // Registrations from one client (its address without the port) that have not sent a heartbeat
  // yet and are not lost: one more is ResourceExhausted. A worker heartbeats within
  // heartbeat_interval of registering, so only a burst of registrations meets it.
  int64_t max_unheartbeated_registrations_per_client = 16;
  // A job's metric series are removed this long after it ends (SUCCEEDED, FAILED, CANCELLED),
  // so that /metrics does not grow with every job ever run. An hour is many scrapes of the final
  // values, and as long as the longest window of the alert rules (restarts over 1h).
  absl::Duration metrics_retention = absl::Hours(1);
  // The restart backoff: a job whose attempt failed (and counted a restart) waits this long
  // before its next attempt after its first restart, twice as long after its second, and so on,
  // up to restart_backoff_max. Kept in the store, so a coordinator restart does not cut it short.
  absl::Duration restart_backoff_initial = absl::Seconds(1);
  absl::Duration restart_backoff_max = absl::Minutes(5);
  // Bounds of the rendezvous (FleetRendezvous, RendezvousLimits): keys and bytes (of keys and
  // values) per rank, which bound each worker (by the ranks it runs) and each attempt (by its
  // world size); keys and bytes of one attempt whatever its size; bytes of all attempts
  // together. KvSet past any is ResourceExhausted.
  int64_t kv_max_keys_per_rank = 64;
  int64_t kv_max_bytes_per_rank = int64_t{2} << 20;
  int64_t kv_max_keys_per_attempt = 1024;
  int64_t kv_max_bytes_per_attempt = int64_t{64} << 20;
  int64_t kv_max_bytes_total = int64_t{256} << 20;
  // Root of every job's checkpoint directory, as the workers see it.
  std::string checkpoint_dir = "checkpoints";
  CheckpointNaming checkpoint_naming = CheckpointNaming::kJobId;

  // InvalidArgument naming the field: non-positive durations, heartbeat_interval not below
  // heartbeat_timeout, restart_backoff_initial above restart_backoff_max, an empty
  // checkpoint_dir.
  absl::Status Validate() const;
};

// What Fleet::Delete did with the job's files.
// A page of Fleet::ListWorkers, and what to list.
struct ListWorkersOptions {
  int page_size = 0;       // 0 = 100; above 1000 = 1000; negative is InvalidArgument
  std::string page_token;  // the last page's next_page_token; empty for the first page
};
struct WorkerPage {
  std::vector<v1::WorkerInfo> workers;  // by id
  std::string next_page_token;          // empty on the last page
};

struct DeletedJob {
  std::string checkpoint_dir;  // <checkpoint root>/<job id>, as the workers see it
  bool checkpoints_deleted = false;
};

class Fleet {
 public:
  // Reloads workers and attempts in flight from the store. `store`, `coordinator` and `metrics`
  // (may be null) are not owned and outlive the fleet.
  static absl::StatusOr<std::unique_ptr<Fleet>> Create(Store* store, Coordinator* coordinator,
                                                       ServiceMetrics* metrics,
                                                       FleetOptions options);
  ~Fleet();  // Stop()
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Starts the control loop. Stop ends it and every long poll; later calls fail Unavailable.
  void Start();
  void Stop();
  // Looks for work to schedule soon: a job was submitted.
  void Wake();

  // WorkerService. Requests are validated here (ids, ranges); errors as described above.
  // Register issues the worker's id and secret; the coordinator keeps the secret's SHA-256 only.
  // `client` names the caller as the transport sees it (its address without the port), for
  // max_unheartbeated_registrations_per_client; empty (an in-process caller) is not counted.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& request,
                                                      absl::string_view client = {});
  // Whether `secret` is the one issued to `worker_id`, compared in constant time: NotFound for a
  // worker that is unknown or lost (it registers again), Unauthenticated for a missing or wrong
  // secret. The transport asks this before every call of a worker but Register; the calls below
  // trust the worker_id they are given.
  absl::Status Authenticate(absl::string_view worker_id, absl::string_view secret);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Waits up to min(request.wait_timeout, max_assignment_wait); `is_cancelled` is asked at least
  // every 200 ms (the client went away). A worker has one long poll: a newer call of the same
  // worker makes a waiting one return at once, empty.
  absl::StatusOr<v1::GetAssignmentResponse> GetAssignment(
      const v1::GetAssignmentRequest& request, const std::function<bool()>& is_cancelled);
  absl::Status ReportStep(const v1::ReportStepRequest& request);
  absl::Status ReportLog(const v1::ReportLogRequest& request);
  absl::Status ReportCheckpoint(const v1::ReportCheckpointRequest& request);
  absl::Status ReportAttemptEnd(const v1::ReportAttemptEndRequest& request);

  // The rendezvous of the job's current attempt, for `worker_id`, which must hold a rank of it
  // (else PermissionDenied): FailedPrecondition for any other attempt, for an attempt of one rank
  // (it has no peers to meet), and for a waiter whose attempt ends. KvSet: ResourceExhausted past
  // the kv_max_* options. KvWait: InvalidArgument without a positive `timeout`, which is cut to
  // max_kv_wait; DeadlineExceeded after it; ResourceExhausted while the worker has one KvWait in
  // flight per rank it runs already. The keys go with their attempt, however it ends.
  absl::Status KvSet(absl::string_view worker_id, absl::string_view job_id, int64_t attempt,
                     absl::string_view key, absl::string_view value);
  absl::StatusOr<std::optional<std::string>> KvGet(absl::string_view worker_id,
                                                   absl::string_view job_id, int64_t attempt,
                                                   absl::string_view key);
  absl::StatusOr<std::string> KvWait(absl::string_view worker_id, absl::string_view job_id,
                                     int64_t attempt, absl::string_view key, absl::Duration timeout,
                                     const std::function<bool()>& is_cancelled);
  // Bytes of keys and values the rendezvous of all live attempts hold.
  int64_t KvBytes();

  // JobService: cancels through the Coordinator and tells the job's ranks to stop.
  absl::StatusOr<JobRecord> Cancel(absl::string_view job_id, absl::string_view reason);
  // JobService (fleet_delete.cc): removes a final job from the store (Store::DeleteJob) and its
  // metric series at once; with `delete_checkpoints`, also its checkpoint directory
  // <dir>/<job id>, where <dir> is resolved as the workers resolve it and must lie under the
  // checkpoint root, and the job's directory is no symbolic link (else FailedPrecondition,
  // nothing deleted): moved aside first, removed after the store rows, outside the fleet's lock.
  // Unavailable while a rank of the job is still stopping on a worker.
  absl::StatusOr<DeletedJob> Delete(absl::string_view job_id, bool delete_checkpoints);
  // JobService, at submit: FailedPrecondition when one rank of `spec` needs more device memory
  // (its resources.device_memory_bytes) than any registered worker of its kind offers
  // (JudgeDeviceMemory's rule and message, moetrain/v1/memory_admission.h); OK otherwise, and for
  // a spec that does not resolve (the coordinator's own checks say what is wrong with it).
  absl::Status CheckDeviceMemory(const v1::JobSpec& spec);
  // fleet_workers.cc: the known workers by id, a page at a time. A page ends after page_size
  // workers or before the one that would take it past kMaxListPageBytes (it holds one at least).
  absl::StatusOr<WorkerPage> ListWorkers(const ListWorkersOptions& options);
  // Known workers by state (zeros included), for metrics.
  std::map<WorkerState, int64_t> CountWorkersByState();

 private:
  struct Slot;
  struct WorkerEntry;
  struct AttemptEntry;
  // How an attempt that did not succeed bears on its job.
  enum class Failure {
    kNone,       // stopped by its worker, or cut short by a coordinator restart: restart at once,
                 // not counted against restart.max_restarts
    kTransient,  // the attempt broke: restart after the backoff, counted, while restarts are left
    kPermanent,  // no attempt of this spec can succeed: FAILED at once
  };

  Fleet(Store* store, Coordinator* coordinator, ServiceMetrics* metrics, FleetOptions options);
  absl::Status Reload();
  // Delete's part under the lock; sets `aside` to where the checkpoint directory was moved.
  absl::StatusOr<DeletedJob> DeleteLocked(absl::string_view job_id, bool delete_checkpoints,
                                          std::optional<std::filesystem::path>* aside)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ControlLoop();
  // One pass of the control loop: lost workers, then the end of the grace period (while
  // reconciling) or stuck ranks (after), then a scheduling pass when one is due.
  void ControlPass() ABSL_LOCKS_EXCLUDED(mu_);
  void ControlPassLocked(std::vector<NewEvent>* announcements) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Declares lost the workers silent past their heartbeat timeout (failing their attempts), and
  // forgets those lost for forget_lost_after.
  void LostWorkersPass(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a start: ends the grace period early once every worker and reloaded rank is back, and
  // when it ends restarts the attempts with a rank that did not report.
  void ReconcilePass(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the attempts with a rank handed out heartbeat_timeout ago that never started.
  void StuckRanksPass(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts what can start; appends to `announcements` why each job that cannot start waits (when
  // that changed), for the caller to record once the lock is released.
  absl::Status SchedulePass(std::vector<NewEvent>* announcements)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartAttempt(const JobRecord& job, const std::vector<std::string>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt is over without success: records it, moves the job on (RESTARTING or FAILED, as
  // `failure` says), tells its other ranks to stop and forgets it.
  absl::Status EndAttemptUnsuccessfully(AttemptEntry& attempt, absl::string_view outcome,
                                        const std::string& reason, Failure failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The wait before the next attempt of a job that has counted `restarts` restarts (>= 1).
  absl::Duration RestartBackoff(int64_t restarts) const;
  // `member` (on `worker`, `who` in messages) reported SUCCEEDED at `step` (fleet_success.cc).
  // Taken only when `step` is train.steps and the final checkpoint, of that step, is recorded or
  // reported by the member (a checkpoint is recorded once every member reported it); otherwise
  // the attempt fails (transient: it restarts from the newest recorded checkpoint) and the answer
  // is FailedPrecondition naming the step and the newest recorded checkpoint. Once every member
  // has succeeded, FinishAttempt.
  absl::Status ReportSucceeded(AttemptEntry& attempt, int32_t member, WorkerEntry& worker,
                               int64_t step, const std::string& who)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every member reported success: the job SUCCEEDED at `step`.
  absl::Status FinishAttempt(AttemptEntry& attempt, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The member's rank is running; once all are, the job goes RUNNING.
  absl::Status MarkStarted(AttemptEntry& attempt, int member) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MarkLost(WorkerEntry& worker, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's rank ended (reported, or gone): the worker is free.
  void ReleaseSlot(WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every worker still running a rank of `attempt` to stop.
  void OrderStop(const AttemptEntry& attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the job's live attempt, and its rendezvous with it.
  void ForgetAttempt(absl::string_view job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistWorker(const WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // fleet_workers.cc: ResourceExhausted when `client` has
  // max_unheartbeated_registrations_per_client registrations that have not heartbeated yet.
  absl::Status CheckRegistrationQuota(absl::string_view client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's first heartbeat: recorded, in the store too.
  absl::Status MarkHeartbeated(WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long after it was declared lost the worker is forgotten.
  absl::Duration ForgetAfter(const WorkerEntry& worker) const;

  absl::StatusOr<WorkerEntry*> FindWorker(absl::string_view worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt a report is about: it must be the job's current one, with `rank` given to
  // `worker_id`.
  absl::StatusOr<AttemptEntry*> FindAttempt(absl::string_view worker_id, absl::string_view job_id,
                                            int64_t attempt, int32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<AttemptEntry*> FindCurrentAttempt(absl::string_view job_id, int64_t attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt a rendezvous call is about: the job's current one, of more than one rank, with a
  // rank on `worker_id`.
  absl::StatusOr<AttemptEntry*> FindKvAttempt(absl::string_view worker_id, absl::string_view job_id,
                                              int64_t attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // KvWait's wait, once admitted: until the key is set, `deadline`, the attempt's end, the
  // caller's going away or the fleet's stop.
  absl::StatusOr<std::string> AwaitKey(absl::string_view worker_id, absl::string_view job_id,
                                       int64_t attempt, absl::string_view key, absl::Time deadline,
                                       absl::Duration wait,
                                       const std::function<bool()>& is_cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);
  WorkerState StateOf(const WorkerEntry& worker) const;
  std::string CheckpointRoot(const JobRecord& job, const v1::JobSpec& spec) const;
  // Wakes the control loop for a scheduling pass soon.
  void RequestSchedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every state change the fleet makes but Cancel goes through here: Coordinator::Transition,
  // then the job's state (and a counted restart) in the metrics.
  absl::StatusOr<JobRecord> TransitionJob(absl::string_view job_id, JobState from, JobState to,
                                          absl::string_view reason,
                                          const TransitionOptions& options = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store* const store_;
  Coordinator* const coordinator_;
  const FleetOptions options_;
  // The maps of the live attempts in attempts_, opened and closed with them; its own lock.
  FleetRendezvous kv_;

  absl::Mutex mu_;
  FleetMetrics metrics_ ABSL_GUARDED_BY(mu_);
  // Signalled on every change a long poll or the control loop may wait for.
  absl::CondVar changed_;
  std::map<std::string, std::unique_ptr<WorkerEntry>, std::less<>> workers_ ABSL_GUARDED_BY(mu_);
  // The live attempt of every SCHEDULED or RUNNING job, by job id.
  std::map<std::string, std::unique_ptr<AttemptEntry>, std::less<>> attempts_ ABSL_GUARDED_BY(mu_);
  // Why each job that cannot start waits, as last announced (announced again only on change).
  std::map<std::string, std::string, std::less<>> waiting_reasons_ ABSL_GUARDED_BY(mu_);
  // Why each waiting job waits, as in its job row's waiting_reason (written only on change).
  // Every transition of a job empties that column, and so drops the job from here.
  std::map<std::string, std::string, std::less<>> stored_waiting_ ABSL_GUARDED_BY(mu_);
  // Reasons decided under the lock, for ControlPass to write once it is released.
  std::vector<std::pair<std::string, std::string>> unwritten_waiting_ ABSL_GUARDED_BY(mu_);
  // The earliest end of a restart backoff the last scheduling pass saw: a pass is due then.
  absl::Time backoff_ends_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time grace_until_ ABSL_GUARDED_BY(mu_);
  // Attempts reloaded at start whose ranks must show up before grace_until_.
  bool reconciling_ ABSL_GUARDED_BY(mu_) = false;
  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = true;
  // Set by Wake without the lock: a submit must not wait for a scheduling pass in progress.
  std::atomic<bool> wake_{false};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread control_thread_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_FLEET_H_
