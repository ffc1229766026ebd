// What the fleet tells ServiceMetrics, in one place: one call per event of the fleet, each a no-op
// without metrics, and the retirement of an ended job's series metrics_retention after it ended
// (FleetOptions). Fleet holds one and calls it under its lock; not thread-safe on its own.
#ifndef MOETRAIN_SERVER_CORE_FLEET_METRICS_H_
#define MOETRAIN_SERVER_CORE_FLEET_METRICS_H_

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "moetrain/v1/job.pb.h"
#include "moetrain/v1/worker.pb.h"
#include "server/core/job_state.h"
#include "server/core/service_metrics.h"
#include "server/core/store.h"

namespace moetrain::server {

class FleetMetrics {
 public:
  // `metrics` may be null (no metrics); not owned, it outlives this.
  FleetMetrics(ServiceMetrics* metrics, absl::Duration retention)
      : metrics_(metrics), retention_(retention) {}

  // The job moved to `state`, or was found in it at start. A final state starts the retention
  // clock of the job's series.
  void OnJobState(absl::string_view job_id, JobState state);
  // The job was cancelled: it may never have had an attempt, so its info series too.
  void OnCancel(const JobRecord& job);
  // The job entered RESTARTING, counted against restart.max_restarts.
  void OnRestart(absl::string_view job_id);
  // An attempt of the job starts (or was reloaded at start), from `resume` (null = from scratch).
  void OnAttemptStart(const JobRecord& job, const v1::JobSpec& spec,
                      const CheckpointRecord* resume);
  // Rank 0's step report; `new_tokens` are the tokens it adds.
  void OnStep(absl::string_view job_id, const v1::StepMetrics& step, int64_t new_tokens);
  // One rank wrote its part of a checkpoint.
  void OnCheckpointWritten(absl::string_view job_id, absl::Duration write_duration);
  // Every rank wrote checkpoint `step`: it is good, recorded at `when`.
  void OnCheckpointGood(absl::string_view job_id, int64_t step, absl::Time when);
  void OnWorkerLost();

  // Removes the series of the jobs that ended `retention` before `now` or earlier.
  void RetireEnded(absl::Time now);
  // Removes the job's series now (it was deleted).
  void Retire(absl::string_view job_id);

 private:
  ServiceMetrics* const metrics_;
  const absl::Duration retention_;
  // (when it ended, job id) of the jobs whose series are still to be retired, oldest first. Only
  // jobs that end in this process: after a restart, Fleet::Reload makes series for live jobs
  // only. A final job gets no reports (they need its attempt, gone with its end), so nothing
  // makes its series again once retired.
  std::deque<std::pair<absl::Time, std::string>> ended_jobs_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_FLEET_METRICS_H_
