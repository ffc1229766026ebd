// Delivers a worker's reports to the coordinator in the order they were made, on a thread of its
// own, so that training never waits for the network: step metrics, log lines, checkpoints, and
// the end of each rank's attempt.
//
// A report that cannot be delivered now (UNAVAILABLE, DEADLINE_EXCEEDED: the coordinator is
// restarting or unreachable) is retried with exponential backoff, and the ones behind it wait, so
// the coordinator sees them in order. A report the coordinator refuses for good is dropped:
//   FAILED_PRECONDITION  the attempt is no longer current (fenced): every queued report of that
//                        attempt is dropped and the attempt's owner is told (on_fenced);
//   NOT_FOUND            the worker id is unknown or was declared lost: every report made under
//                        that id is dropped and the owner is told (on_worker_unknown);
//   anything else        logged and dropped.
// Either way, once an attempt's end report is delivered or dropped, on_attempt_resolved runs.
#ifndef MOETRAIN_WORKER_REPORTER_H_
#define MOETRAIN_WORKER_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"

namespace moetrain {

struct ReporterOptions {
  absl::Duration call_timeout = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Queued reports beyond this drop the oldest step and log reports (never checkpoints or ends).
  size_t max_queued = 10000;
  // Told (on the reporter's thread) when a report of (job, attempt) was refused as stale.
  std::function<void(const std::string& job_id, int64_t attempt)> on_fenced;
  // Told when the coordinator does not know `worker_id` (any more).
  std::function<void(const std::string& worker_id)> on_worker_unknown;
  // Told when the end report of (job, attempt) was delivered or dropped.
  std::function<void(const std::string& job_id, int64_t attempt)> on_attempt_resolved;
};

class Reporter {
 public:
  using Report = std::variant<v1::ReportStepRequest, v1::ReportLogRequest,
                              v1::ReportCheckpointRequest, v1::ReportAttemptEndRequest>;

  // `connection` outlives the reporter. Starts the sending thread.
  Reporter(const Connection* connection, ReporterOptions options);
  ~Reporter();  // Stop()
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  void Enqueue(Report report);
  // The secret RegisterWorker issued to `worker_id`: reports made under that id carry it (as do
  // those made under the connection's own worker_id, with its secret). Reports of an earlier
  // registration go without one (the coordinator answers NOT_FOUND for such ids).
  void SetWorkerSecret(const std::string& worker_id, const std::string& secret);
  // Waits until the queue is empty or `deadline`; true when empty.
  bool Flush(absl::Time deadline);
  // Stops sending; reports still queued are lost.
  void Stop();

 private:
  void SendLoop();
  // One attempt at delivering `report`.
  grpc::Status Send(const Report& report);
  // Drops queued reports matching `drop`; tells on_attempt_resolved for dropped end reports.
  void DropQueued(const std::function<bool(const Report&)>& drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Connection* const connection_;
  const ReporterOptions options_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::deque<Report> queue_ ABSL_GUARDED_BY(mu_);
  std::string worker_id_ ABSL_GUARDED_BY(mu_);  // of the latest SetWorkerSecret
  std::string worker_secret_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // the front report is being sent
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The job, attempt and worker id every report carries.
const std::string& ReportJobId(const Reporter::Report& report);
int64_t ReportAttempt(const Reporter::Report& report);
const std::string& ReportWorkerId(const Reporter::Report& report);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_REPORTER_H_
