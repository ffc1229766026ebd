// FleetMetrics (fleet_metrics.h): the fleet's events as ServiceMetrics updates.
#include "server/core/fleet_metrics.h"

#include <algorithm>

namespace moetrain::server {

void FleetMetrics::OnJobState(absl::string_view job_id, JobState state) {
  if (metrics_ == nullptr) return;
  metrics_->OnJobState(job_id, state);
  if (IsFinal(state)) ended_jobs_.emplace_back(absl::Now(), std::string(job_id));
}

void FleetMetrics::OnCancel(const JobRecord& job) {
  if (metrics_ == nullptr) return;
  metrics_->OnJob(job.id, job.name);
  OnJobState(job.id, job.state);
}

void FleetMetrics::OnRestart(absl::string_view job_id) {
  if (metrics_ != nullptr) metrics_->OnRestart(job_id);
}

void FleetMetrics::OnAttemptStart(const JobRecord& job, const v1::JobSpec& spec,
                                  const CheckpointRecord* resume) {
  if (metrics_ == nullptr) return;
  metrics_->OnJob(job.id, job.name);
  metrics_->OnAttemptStart(job.id, spec.checkpoint().every_steps(),
                           resume != nullptr ? resume->step : 0);
  if (resume != nullptr) metrics_->OnCheckpointGood(job.id, resume->step, resume->time);
}

void FleetMetrics::OnStep(absl::string_view job_id, const v1::StepMetrics& step,
                          int64_t new_tokens) {
  if (metrics_ != nullptr) metrics_->OnStep(job_id, step, new_tokens);
}

void FleetMetrics::OnCheckpointWritten(absl::string_view job_id, absl::Duration write_duration) {
  if (metrics_ != nullptr) metrics_->OnCheckpointWritten(job_id, write_duration);
}

void FleetMetrics::OnCheckpointGood(absl::string_view job_id, int64_t step, absl::Time when) {
  if (metrics_ != nullptr) metrics_->OnCheckpointGood(job_id, step, when);
}

void FleetMetrics::OnWorkerLost() {
  if (metrics_ != nullptr) metrics_->OnWorkerLost();
}

void FleetMetrics::RetireEnded(absl::Time now) {
  // Oldest first, so that a pass with nothing due looks at one entry.
  while (!ended_jobs_.empty() && now - ended_jobs_.front().first >= retention_) {
    metrics_->RetireJob(ended_jobs_.front().second);
    ended_jobs_.pop_front();
  }
}

void FleetMetrics::Retire(absl::string_view job_id) {
  if (metrics_ == nullptr) return;
  metrics_->RetireJob(job_id);
  ended_jobs_.erase(std::remove_if(ended_jobs_.begin(), ended_jobs_.end(),
                                   [&](const auto& ended) { return ended.second == job_id; }),
                    ended_jobs_.end());
}

}  // namespace moetrain::server
