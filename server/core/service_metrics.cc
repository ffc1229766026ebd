#include "server/core/service_metrics.h"

#include <array>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain::server {
namespace {

// Label values here are ids and state names, always valid: a failed lookup (which would mean a
// bug) drops the sample rather than the report that carried it.
template <typename T>
T* Child(Family<T>* family, std::initializer_list<absl::string_view> labels) {
  absl::StatusOr<T*> child = family->WithLabels(std::vector<absl::string_view>(labels));
  return child.ok() ? *child : nullptr;
}

void SetGauge(Family<Gauge>* family, absl::string_view job_id, double value) {
  if (Gauge* gauge = Child(family, {job_id}); gauge != nullptr) gauge->Set(value);
}

// The role label of each operand of an FP8 statistics entry (Fp8Role's order).
std::array<std::pair<absl::string_view, const v1::Fp8OperandStats*>, 3> Fp8Roles(
    const v1::Fp8Stats& stats) {
  return {{{"input", &stats.input()}, {"weight", &stats.weight()}, {"grad", &stats.grad()}}};
}

struct Fp8Families {
  Family<Gauge>* amax;
  Family<Gauge>* scale;
  Family<Counter>* saturated;
};

// One operand's series. A scale of 0 means block scalings, whose scales are not kept: no scale
// series then, rather than a 0 that reads as "every value overflows".
void SetFp8(const Fp8Families& families, std::initializer_list<absl::string_view> labels,
            const v1::Fp8OperandStats& stats) {
  if (Gauge* amax = Child(families.amax, labels); amax != nullptr) amax->Set(stats.amax());
  if (stats.scale_min() > 0) {
    if (Gauge* scale = Child(families.scale, labels); scale != nullptr) {
      scale->Set(stats.scale_min());
    }
  }
  if (Counter* saturated = Child(families.saturated, labels); saturated != nullptr) {
    saturated->Increment(static_cast<double>(stats.saturated()));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceMetrics>> ServiceMetrics::Create(
    MetricsRegistry* registry, const ServiceMetricsOptions& options) {
  std::unique_ptr<ServiceMetrics> m(new ServiceMetrics());
  const std::vector<std::string> job = {"job_id"};
  MOETRAIN_ASSIGN_OR_RETURN(
      m->job_info_,
      registry->AddGauge("moetrain_job_info", "Always 1: the name of each job, to join on job_id.",
                         {"job_id", "job_name"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->step_, registry->AddGauge("moetrain_train_step", "Last optimizer step reported.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->tokens_,
      registry->AddCounter("moetrain_train_tokens_total",
                           "Training tokens processed, over all ranks (work redone after a "
                           "restart from a checkpoint counts again).",
                           job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->loss_,
      registry->AddGauge("moetrain_train_loss",
                         "Training loss of the last reported step (with aux losses).", job));
  MOETRAIN_ASSIGN_OR_RETURN(m->eval_loss_,
                            registry->AddGauge("moetrain_train_eval_loss",
                                               "Loss on held-out data, last evaluation.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->aux_loss_, registry->AddGauge("moetrain_train_aux_loss",
                                       "Load-balancing aux loss of the last reported step.", job));
  MOETRAIN_ASSIGN_OR_RETURN(m->learning_rate_,
                            registry->AddGauge("moetrain_train_learning_rate",
                                               "Learning rate of the last reported step.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->grad_norm_,
      registry->AddGauge("moetrain_train_grad_norm",
                         "Global gradient norm before clipping, last reported step.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->tokens_per_second_,
      registry->AddGauge("moetrain_train_tokens_per_second",
                         "Training throughput over all ranks, last reported step.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->mfu_,
      registry->AddGauge("moetrain_train_mfu_ratio",
                         "Model FLOPs utilisation of the last reported step (0 to 1).", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->device_memory_,
      registry->AddGauge("moetrain_job_device_memory_bytes",
                         "Device memory rank 0 held in tensors at the end of the last reported "
                         "step (0 on the CPU).",
                         job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->device_memory_peak_,
      registry->AddGauge("moetrain_job_device_memory_peak_bytes",
                         "Most device memory rank 0 held in tensors at once since its attempt "
                         "started (0 on the CPU).",
                         job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->step_duration_,
      registry->AddHistogram("moetrain_train_step_duration_seconds",
                             "Wall time of a training step (one sample per reported step).", job,
                             ExponentialBuckets(0.005, 2, 16)));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->expert_load_,
      registry->AddGauge("moetrain_train_expert_load_max_over_mean_ratio",
                         "Busiest expert's routed tokens over the mean, per MoE layer.",
                         {"job_id", "layer"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->dropped_tokens_,
      registry->AddCounter("moetrain_train_dropped_tokens_total",
                           "Routed tokens dropped by expert capacity, at reported steps.", job));
  const std::vector<std::string> fp8_labels = {"job_id", "layer", "role"};
  MOETRAIN_ASSIGN_OR_RETURN(
      m->fp8_amax_,
      registry->AddGauge("moetrain_job_fp8_amax",
                         "FP8 jobs: the largest |value| quantised in the last reported step, per "
                         "transformer layer and operand role (input, weight, grad).",
                         fp8_labels));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->fp8_scale_,
      registry->AddGauge("moetrain_job_fp8_scale",
                         "FP8 jobs with per-tensor scaling: the smallest scale the layer's "
                         "tensors of the role were quantised with in the last reported step.",
                         fp8_labels));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->fp8_saturated_,
      registry->AddCounter("moetrain_job_fp8_saturated_values_total",
                           "FP8 jobs: values clamped to the format's largest finite value, per "
                           "layer and role, at reported steps.",
                           fp8_labels));
  if (options.per_expert) {
    const std::vector<std::string> expert_labels = {"job_id", "layer", "expert", "role"};
    MOETRAIN_ASSIGN_OR_RETURN(
        m->fp8_expert_amax_,
        registry->AddGauge("moetrain_job_fp8_expert_amax",
                           "FP8 jobs: moetrain_job_fp8_amax of each routed expert.",
                           expert_labels));
    MOETRAIN_ASSIGN_OR_RETURN(
        m->fp8_expert_scale_,
        registry->AddGauge("moetrain_job_fp8_expert_scale",
                           "FP8 jobs: moetrain_job_fp8_scale of each routed expert.",
                           expert_labels));
    MOETRAIN_ASSIGN_OR_RETURN(
        m->fp8_expert_saturated_,
        registry->AddCounter("moetrain_job_fp8_expert_saturated_values_total",
                             "FP8 jobs: moetrain_job_fp8_saturated_values_total of each routed "
                             "expert.",
                             expert_labels));
  }
  MOETRAIN_ASSIGN_OR_RETURN(m->restarts_,
                            registry->AddCounter("moetrain_job_restarts_total",
                                                 "Restarts of a job after a failed attempt.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->checkpoint_duration_,
      registry->AddHistogram("moetrain_checkpoint_duration_seconds",
                             "Time a rank took to write its part of a checkpoint.", job,
                             ExponentialBuckets(0.01, 2, 14)));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->checkpoint_last_success_,
      registry->AddGauge("moetrain_checkpoint_last_success_timestamp_seconds",
                         "Unix time at which the job's newest good checkpoint was recorded.", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->checkpoint_last_step_,
      registry->AddGauge("moetrain_checkpoint_last_step",
                         "Step of the job's newest good checkpoint (0 = none yet).", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->checkpoint_interval_,
      registry->AddGauge("moetrain_checkpoint_interval_steps",
                         "The job's checkpoint.every_steps (0 = only after the last step).", job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->job_state_,
      registry->AddGauge("moetrain_job_state",
                         "1 for the job's current state, 0 for the states it was in before.",
                         {"job_id", "state"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->last_progress_,
      registry->AddGauge("moetrain_job_last_progress_timestamp_seconds",
                         "Unix time of the job's last step report, or of its last move to "
                         "RUNNING if that came later.",
                         job));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->jobs_, registry->AddGauge("moetrain_jobs", "Jobs in the store, by state.", {"state"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      m->workers_, registry->AddGauge("moetrain_workers", "Known workers, by state.", {"state"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      Family<Counter> * workers_lost,
      registry->AddCounter("moetrain_workers_lost_total",
                           "Workers declared lost after missing their heartbeats."));
  MOETRAIN_ASSIGN_OR_RETURN(m->workers_lost_, workers_lost->WithLabels({}));
  m->job_families_ = {m->job_info_,
                      m->step_,
                      m->tokens_,
                      m->loss_,
                      m->eval_loss_,
                      m->aux_loss_,
                      m->learning_rate_,
                      m->grad_norm_,
                      m->tokens_per_second_,
                      m->mfu_,
                      m->device_memory_,
                      m->device_memory_peak_,
                      m->step_duration_,
                      m->expert_load_,
                      m->dropped_tokens_,
                      m->restarts_,
                      m->job_state_,
                      m->last_progress_,
                      m->checkpoint_duration_,
                      m->checkpoint_last_success_,
                      m->checkpoint_last_step_,
                      m->checkpoint_interval_,
                      m->fp8_amax_,
                      m->fp8_scale_,
                      m->fp8_saturated_};
  if (options.per_expert) {
    m->job_families_.insert(m->job_families_.end(),
                            {m->fp8_expert_amax_, m->fp8_expert_scale_, m->fp8_expert_saturated_});
  }
  return m;
}

void ServiceMetrics::OnJob(absl::string_view job_id, absl::string_view job_name) {
  absl::ReaderMutexLock lock(&mu_);
  if (Gauge* info = Child(job_info_, {job_id, job_name}); info != nullptr) info->Set(1);
  // Counters exist from the start, so that rate() and increase() see their first rise.
  Child(tokens_, {job_id});
  Child(dropped_tokens_, {job_id});
  Child(restarts_, {job_id});
}

void ServiceMetrics::OnAttemptStart(absl::string_view job_id, int64_t checkpoint_every_steps,
                                    int64_t latest_checkpoint_step) {
  absl::ReaderMutexLock lock(&mu_);
  SetGauge(checkpoint_interval_, job_id, static_cast<double>(checkpoint_every_steps));
  SetGauge(checkpoint_last_step_, job_id, static_cast<double>(latest_checkpoint_step));
}

void ServiceMetrics::OnJobState(absl::string_view job_id, JobState state) {
  absl::MutexLock lock(&mu_);
  auto it = job_states_.find(job_id);
  if (it != job_states_.end()) {
    if (it->second == state) return;
    if (Gauge* before = Child(job_state_, {job_id, JobStateName(it->second)}); before != nullptr) {
      before->Set(0);
    }
    it->second = state;
  } else {
    job_states_.emplace(std::string(job_id), state);
  }
  if (Gauge* now = Child(job_state_, {job_id, JobStateName(state)}); now != nullptr) now->Set(1);
  if (state == JobState::kRunning) {
    SetGauge(last_progress_, job_id, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  }
}

void ServiceMetrics::OnStep(absl::string_view job_id, const v1::StepMetrics& metrics,
                            int64_t new_tokens) {
  absl::ReaderMutexLock lock(&mu_);
  SetGauge(last_progress_, job_id, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  SetGauge(step_, job_id, static_cast<double>(metrics.step()));
  if (Counter* tokens = Child(tokens_, {job_id}); tokens != nullptr) {
    tokens->Increment(static_cast<double>(new_tokens));
  }
  SetGauge(loss_, job_id, metrics.loss());
  if (metrics.has_eval_loss()) SetGauge(eval_loss_, job_id, metrics.eval_loss());
  SetGauge(aux_loss_, job_id, metrics.aux_loss());
  SetGauge(learning_rate_, job_id, metrics.lr());
  SetGauge(grad_norm_, job_id, metrics.grad_norm());
  SetGauge(tokens_per_second_, job_id, metrics.tokens_per_s());
  SetGauge(mfu_, job_id, metrics.mfu());
  // 0 on the CPU, as the worker reports it: every job has the series, as it has the others.
  SetGauge(device_memory_, job_id, static_cast<double>(metrics.device_memory_bytes()));
  SetGauge(device_memory_peak_, job_id, static_cast<double>(metrics.device_memory_peak_bytes()));
  if (metrics.step_seconds() > 0) {
    if (Histogram* duration = Child(step_duration_, {job_id}); duration != nullptr) {
      duration->Observe(metrics.step_seconds());
    }
  }
  for (int layer = 0; layer < metrics.expert_load_per_layer_size(); ++layer) {
    const std::string label = absl::StrCat(layer);
    if (Gauge* load = Child(expert_load_, {job_id, label}); load != nullptr) {
      load->Set(metrics.expert_load_per_layer(layer));
    }
  }
  if (Counter* dropped = Child(dropped_tokens_, {job_id}); dropped != nullptr) {
    dropped->Increment(static_cast<double>(metrics.dropped_tokens()));
  }
  for (const v1::Fp8Stats& layer : metrics.fp8_layers()) {
    const std::string label = absl::StrCat(layer.layer());
    for (const auto& [role, stats] : Fp8Roles(layer)) {
      SetFp8({fp8_amax_, fp8_scale_, fp8_saturated_}, {job_id, label, role}, *stats);
    }
  }
  if (fp8_expert_amax_ != nullptr) {
    for (const v1::Fp8Stats& expert : metrics.fp8_experts()) {
      const std::string layer = absl::StrCat(expert.layer());
      const std::string index = absl::StrCat(expert.expert());
      for (const auto& [role, stats] : Fp8Roles(expert)) {
        SetFp8({fp8_expert_amax_, fp8_expert_scale_, fp8_expert_saturated_},
               {job_id, layer, index, role}, *stats);
      }
    }
  }
}

void ServiceMetrics::OnCheckpointWritten(absl::string_view job_id, absl::Duration write_duration) {
  absl::ReaderMutexLock lock(&mu_);
  if (Histogram* duration = Child(checkpoint_duration_, {job_id}); duration != nullptr) {
    duration->Observe(absl::ToDoubleSeconds(write_duration));
  }
}

void ServiceMetrics::OnCheckpointGood(absl::string_view job_id, int64_t step, absl::Time when) {
  absl::ReaderMutexLock lock(&mu_);
  SetGauge(checkpoint_last_success_, job_id, absl::ToDoubleSeconds(when - absl::UnixEpoch()));
  SetGauge(checkpoint_last_step_, job_id, static_cast<double>(step));
}

void ServiceMetrics::OnRestart(absl::string_view job_id) {
  absl::ReaderMutexLock lock(&mu_);
  if (Counter* restarts = Child(restarts_, {job_id}); restarts != nullptr) restarts->Increment();
}

void ServiceMetrics::RetireJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  for (FamilyBase* family : job_families_) family->RemoveWhere("job_id", job_id);
  auto it = job_states_.find(job_id);
  if (it != job_states_.end()) job_states_.erase(it);
}

void ServiceMetrics::OnWorkerLost() { workers_lost_->Increment(); }

void ServiceMetrics::SetJobsByState(const std::map<JobState, int64_t>& counts) {
  for (const auto& [state, count] : counts) {
    if (Gauge* gauge = Child(jobs_, {JobStateName(state)}); gauge != nullptr) gauge->Set(count);
  }
}

void ServiceMetrics::SetWorkersByState(const std::map<WorkerState, int64_t>& counts) {
  for (const auto& [state, count] : counts) {
    if (Gauge* gauge = Child(workers_, {WorkerStateName(state)}); gauge != nullptr) {
      gauge->Set(count);
    }
  }
}

}  // namespace moetrain::server
