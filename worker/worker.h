// The worker daemon's logic: registers with the coordinator, heartbeats, takes assignments by
// long poll, runs one assignment at a time, and delivers its reports in order through a Reporter.
// An assignment is ranks [rank, rank + devices_per_worker) of one attempt: each rank runs in a
// process of its own (rank_process.h), on its own device of the worker (assignment_ranks.h), and
// the ranks are stopped together and done together. Used by `moetrain-worker` and, in-process, by
// `moetrain run`.
//
// Faults:
//   a rank's process dies    (a crash, SIGBUS, the kernel's OOM killer) its attempt fails,
//                             TRANSIENT, the message naming the signal; the worker lives on and
//                             takes its next assignment.
//   coordinator unreachable   training goes on; calls are retried with backoff. Checkpoints are
//                             written only while the lease holds: no heartbeat has reached the
//                             coordinator for heartbeat_timeout means the job may already run
//                             elsewhere, so the worker keeps out of its directory until it hears
//                             back.
//   stale attempt             a report answered FAILED_PRECONDITION, or a cancel order: the
//                             attempt's ranks stop at the next step boundary without a
//                             checkpoint.
//   worker unknown / lost     (NOT_FOUND) every rank stops without a checkpoint (they have been
//                             given away) and the worker registers again under a new id.
//   Shutdown (SIGTERM)        every running rank saves a checkpoint at the next step boundary and
//                             reports STOPPED with worker_draining; Run returns once its reports
//                             are delivered (or after shutdown_timeout) and a last heartbeat has
//                             said draining (best effort, 2 s). Before the first registration, or
//                             while the coordinator is unreachable, Run returns at once (a call in
//                             flight is cancelled).
#ifndef MOETRAIN_WORKER_WORKER_H_
#define MOETRAIN_WORKER_WORKER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "worker/rank_process.h"
#include "worker/reporter.h"
#include "worker/worker_metrics.h"

namespace moetrain {

struct WorkerOptions {
  std::string name;  // for people; the host name by default
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  int device_count = 1;  // ranks it can run at once (1 on CPU)
  // Memory of one device, the smallest of them (QueryDevices); 0 = unknown (CPU). Registered as
  // WorkerResources.device_memory_bytes.
  int64_t device_memory_bytes = 0;
  int threads = 1;  // OpenMP threads of a rank
  std::string version;
  // How long one GetAssignment waits at the coordinator (a cancel still arrives at once).
  absl::Duration poll_wait = absl::Seconds(10);
  // Deadline of every unary call.
  absl::Duration call_timeout = absl::Seconds(10);
  // Retries after a failed call wait from 100 ms, doubling up to this.
  absl::Duration max_backoff = absl::Seconds(5);
  // After Shutdown: how long to keep delivering the last reports to an unreachable coordinator.
  absl::Duration shutdown_timeout = absl::Seconds(30);
  // The address this worker's ranks listen on for the other ranks of their gang (Gloo over TCP);
  // empty = the local address of the route to the coordinator.
  std::string comm_host;
  // How long a rank waits for its gang: to meet at the rendezvous, and for any one collective.
  // A rank whose peer died fails within it, so the coordinator can restart the gang.
  absl::Duration comm_timeout = absl::Seconds(60);
  // Directories a job's data.path must resolve under (absolute, or relative to the working
  // directory); empty = any file the worker can read.
  std::vector<std::string> data_roots;
  // Host memory a rank may use: a job whose estimate (engine/train/memory_estimate.h) exceeds it
  // fails its attempt before allocating anything. 0 = no limit.
  int64_t memory_limit_bytes = 0;
  // `moetrain run --stop-at-step`: each rank trains through this step at most (the trainer's
  // stop_after_step), saves a checkpoint there and ends its attempt STOPPED and draining, and the
  // worker then winds down as after Shutdown. 0 = train every job to its train.steps.
  int64_t stop_after_step = 0;
  // Where the ranks' metrics go (moetrain-worker --metrics-listen); not owned, outlives the
  // Worker; null = none.
  WorkerMetrics* metrics = nullptr;
  // The program each rank runs in (rank_main.h): this process's own executable, which hands a
  // rank process's invocation to RankProcessMain first thing in main.
  std::string rank_executable = "/proc/self/exe";

  // InvalidArgument naming the option.
  absl::Status Validate() const;
};

class Worker {
 public:
  // `connection` (with its token) reaches the coordinator.
  Worker(Connection connection, WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until Shutdown, then winds down as described above. An error only when the
  // coordinator refuses the registration for good (UNAUTHENTICATED, INVALID_ARGUMENT, ...).
  absl::Status Run();
  // Makes Run wind down. Thread-safe, from any thread (not from a signal handler).
  void Shutdown();

  // The id of the current registration; empty before the first.
  std::string worker_id();

 private:
  // One rank of an assignment.
  struct RankEntry {
    bool finished = false;  // its process is gone: its end report is queued (or in rank_ends)
    // Last: destroyed first, killing and joining the rank while the entry is whole.
    std::unique_ptr<RankProcess> process;
  };
  // An assignment: its ranks, in order (rank first + i on device i), or none when it was refused.
  struct AssignmentEntry {
    v1::Assignment assignment;  // as delivered: rank() = the first rank
    std::string worker_id;      // the registration it was started under
    std::vector<std::unique_ptr<RankEntry>> ranks;
    int end_reports = 0;  // enqueued or to come: one (the ranks' combined, or the refusal's)
    int resolved = 0;     // end reports delivered or dropped; at end_reports the entry goes
    // Of several ranks: their end reports in the order they ended, combined once all are in.
    std::vector<v1::ReportAttemptEndRequest> rank_ends;

    // Every rank's RunRank has returned.
    bool finished() const;
  };
  using AttemptKey = std::pair<std::string, int64_t>;  // (job id, attempt)

  // One RegisterWorker call.
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // connection_ with the current registration's id and secret, which every call but
  // RegisterWorker carries.
  Connection RegisteredConnection() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One GetAssignment call and what it brings; the status of the call.
  grpc::Status Poll() ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop();
  // After the ranks' end reports: one heartbeat saying the worker is shutting down, so that the
  // coordinator gives it no new rank (an idle worker would else look IDLE until its heartbeats
  // time out). Best effort, within 2 s.
  void SendDrainingHeartbeat() ABSL_LOCKS_EXCLUDED(mu_);
  void StartAssignment(const v1::Assignment& assignment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops every rank of the assignment.
  void StopAssignment(const std::string& job_id, int64_t attempt, StopRequest request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnWorkerUnknown(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);
  void OnAttemptResolved(const std::string& job_id, int64_t attempt) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status MayWriteCheckpoints() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `delay` unless Shutdown comes first.
  void Sleep(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);

  const Connection connection_;
  const WorkerOptions options_;
  const std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::unique_ptr<Reporter> reporter_;

  absl::Mutex mu_;
  absl::CondVar changed_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string worker_secret_ ABSL_GUARDED_BY(mu_);  // issued with worker_id_
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Duration heartbeat_timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  // The send time of the last heartbeat the coordinator answered, plus its timeout (less one
  // interval of margin): until then no other worker can have been given our ranks.
  absl::Time lease_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<AttemptKey, std::unique_ptr<AssignmentEntry>> assignments_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool heartbeat_now_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_heartbeats_ ABSL_GUARDED_BY(mu_) = false;
  // The GetAssignment or RegisterWorker call in flight, which Shutdown cancels.
  grpc::ClientContext* call_context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_WORKER_H_
