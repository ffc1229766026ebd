// The coordinator's training and fleet metrics (names in ARCHITECTURE.md): per job, labelled
// `job_id` (not `job`, which Prometheus itself sets on every scraped series):
//   moetrain_job_info{job_id,job_name}                    1 for every job seen since start
//   moetrain_train_step                                   last reported optimizer step
//   moetrain_train_tokens_total                           tokens trained (counts re-done work after
//                                                         a restart from a checkpoint)
//   moetrain_train_loss, _eval_loss, _aux_loss            of the last reported step
//   moetrain_train_learning_rate, _grad_norm
//   moetrain_train_tokens_per_second, moetrain_train_mfu_ratio
//   moetrain_job_device_memory_bytes, _peak_bytes     rank 0's device memory at the last reported
//                                                         step and at its peak (0 on the CPU)
//   moetrain_train_step_duration_seconds                  histogram, one sample per reported step
//   moetrain_train_expert_load_max_over_mean_ratio{layer} per MoE layer
//   moetrain_train_dropped_tokens_total                   capacity drops (sampled at reported
//                                                         steps)
//   moetrain_job_fp8_amax{layer,role}                     FP8 jobs: the layer's largest amax
//   moetrain_job_fp8_scale{layer,role}                    its smallest per-tensor scale (none
//                                                         under block scalings)
//   moetrain_job_fp8_saturated_values_total{layer,role}   values clamped (at reported steps)
//   moetrain_job_fp8_expert_{amax,scale,saturated_values_total}{layer,expert,role}
//                                                         the same per routed expert, only with
//                                                         ServiceMetricsOptions::per_expert
//   moetrain_job_restarts_total                           restarts after failed attempts
//   moetrain_job_state{state}                             1 for the job's current state, 0 for
//                                                         the states it was in before
//   moetrain_job_last_progress_timestamp_seconds          its last step report, or when it last
//                                                         went RUNNING, whichever is later
//   moetrain_checkpoint_duration_seconds                  histogram of rank write times
//   moetrain_checkpoint_last_success_timestamp_seconds    when the newest good checkpoint landed
//   moetrain_checkpoint_last_step                         its step (0 = none yet)
//   moetrain_checkpoint_interval_steps                    spec.checkpoint.every_steps
// and for the fleet: moetrain_jobs{state}, moetrain_workers{state}, moetrain_workers_lost_total.
// The per-job state and progress series exist for the jobs the fleet has scheduled or cancelled
// since start (not for a job still PENDING), one series per state a job has been in: the alert
// rules in deploy/prometheus/rules.yml need to know which jobs are RUNNING now. RetireJob removes
// all of a job's series (the fleet calls it a while after the job ends), so that /metrics does
// not grow with every job a long-lived coordinator has run.
#ifndef MOETRAIN_SERVER_CORE_SERVICE_METRICS_H_
#define MOETRAIN_SERVER_CORE_SERVICE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.pb.h"
#include "server/core/job_state.h"
#include "server/http/metrics.h"

namespace moetrain::server {

struct ServiceMetricsOptions {
  // Series per routed expert (moetrain_job_fp8_expert_*): layers × experts × 3 per job and
  // metric, too many for most Prometheus servers (DeepSeek-V3: 58 × 256 × 3), so off unless the
  // coordinator's --metrics-per-expert asks. Without it those families are not registered at all.
  bool per_expert = false;
};

class ServiceMetrics {
 public:
  // Adds the families to `registry` (not owned, outlives this); AlreadyExists when they are
  // there already.
  static absl::StatusOr<std::unique_ptr<ServiceMetrics>> Create(
      MetricsRegistry* registry, const ServiceMetricsOptions& options = {});

  void OnJob(absl::string_view job_id, absl::string_view job_name);
  // An attempt of the job starts (or was reloaded at start): its checkpoint interval
  // (spec.checkpoint.every_steps, 0 = only after the last step) and the step of the newest good
  // checkpoint it resumes from (0 = none).
  void OnAttemptStart(absl::string_view job_id, int64_t checkpoint_every_steps,
                      int64_t latest_checkpoint_step);
  // The job is now in `state` (moved there, or found there at start). Entering RUNNING counts as
  // progress: a job's clock for "no progress" starts when it runs, not when it was submitted.
  void OnJobState(absl::string_view job_id, JobState state);
  // A step report, which is progress; `new_tokens` is how many tokens it adds to
  // moetrain_train_tokens_total.
  void OnStep(absl::string_view job_id, const v1::StepMetrics& metrics, int64_t new_tokens);
  // One rank wrote its part of a checkpoint.
  void OnCheckpointWritten(absl::string_view job_id, absl::Duration write_duration);
  // Every rank wrote checkpoint `step`: it is good, recorded at `when`.
  void OnCheckpointGood(absl::string_view job_id, int64_t step, absl::Time when);
  void OnRestart(absl::string_view job_id);
  // Removes every series labelled with the job's id, waiting for updates of it in flight; the
  // other jobs' series stay. A later On* call about the job makes its series again (counters
  // from 0), so the caller retires only jobs it will not report on any more: the fleet retires
  // final jobs, and reports about them are refused before they reach here.
  void RetireJob(absl::string_view job_id);
  // A worker missed its heartbeats and was declared lost.
  void OnWorkerLost();
  void SetJobsByState(const std::map<JobState, int64_t>& counts);
  void SetWorkersByState(const std::map<WorkerState, int64_t>& counts);

 private:
  ServiceMetrics() = default;

  Family<Gauge>* job_info_ = nullptr;
  Family<Gauge>* step_ = nullptr;
  Family<Counter>* tokens_ = nullptr;
  Family<Gauge>* loss_ = nullptr;
  Family<Gauge>* eval_loss_ = nullptr;
  Family<Gauge>* aux_loss_ = nullptr;
  Family<Gauge>* learning_rate_ = nullptr;
  Family<Gauge>* grad_norm_ = nullptr;
  Family<Gauge>* tokens_per_second_ = nullptr;
  Family<Gauge>* mfu_ = nullptr;
  Family<Gauge>* device_memory_ = nullptr;
  Family<Gauge>* device_memory_peak_ = nullptr;
  Family<Histogram>* step_duration_ = nullptr;
  Family<Gauge>* expert_load_ = nullptr;
  Family<Counter>* dropped_tokens_ = nullptr;
  Family<Gauge>* fp8_amax_ = nullptr;
  Family<Gauge>* fp8_scale_ = nullptr;
  Family<Counter>* fp8_saturated_ = nullptr;
  // Null without ServiceMetricsOptions::per_expert.
  Family<Gauge>* fp8_expert_amax_ = nullptr;
  Family<Gauge>* fp8_expert_scale_ = nullptr;
  Family<Counter>* fp8_expert_saturated_ = nullptr;
  Family<Counter>* restarts_ = nullptr;
  Family<Gauge>* job_state_ = nullptr;
  Family<Gauge>* last_progress_ = nullptr;
  Family<Histogram>* checkpoint_duration_ = nullptr;
  Family<Gauge>* checkpoint_last_success_ = nullptr;
  Family<Gauge>* checkpoint_last_step_ = nullptr;
  Family<Gauge>* checkpoint_interval_ = nullptr;
  Family<Gauge>* jobs_ = nullptr;
  Family<Gauge>* workers_ = nullptr;
  Counter* workers_lost_ = nullptr;

  // Every family labelled job_id, for RetireJob.
  std::vector<FamilyBase*> job_families_;

  // Held shared by the per-job updates, which use the children they look up, and exclusive by
  // RetireJob, which frees them, and by OnJobState, which also keeps job_states_.
  absl::Mutex mu_;
  // The state each job's moetrain_job_state is 1 for.
  std::map<std::string, JobState, std::less<>> job_states_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_SERVICE_METRICS_H_
