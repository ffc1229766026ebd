#include "worker/rank_runner.h"

#include <omp.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/comm/create_communicator.h"
#include "engine/comm/metered_communicator.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "engine/model/transformer.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/train/fp8_report.h"
#include "engine/train/memory_estimate.h"
#include "moetrain/v1/proto_time.h"
#include "worker/job_config.h"
#include "worker/job_paths.h"

namespace moetrain {
namespace {

// FLOP/s of a dense GEMM in `dtype` on ctx's device (this process's team on the CPU, cuBLAS on a
// GPU), measured once per rank process (a fraction of a second on the CPU). A GPU needs a large
// GEMM to reach its rate: 8192³ there, 1024³ on the CPU.
double PeakFlops(const ExecContext& ctx, DType dtype) {
  const int64_t n = ctx.device().is_cpu() ? 1024 : 8192;
  absl::StatusOr<double> measured = ops::MeasureGemmFlops(ctx, dtype, n);
  if (measured.ok()) return *measured;
  Log(absl::StrCat("cannot measure the GEMM peak on ", ctx.device().DebugString(), ": ",
                   measured.status().ToString()));
  return 0.0;
}

void SetFp8Operand(const Fp8OperandStats& stats, v1::Fp8OperandStats* out) {
  out->set_amax(stats.amax);
  out->set_scale_min(stats.scale_min);
  out->set_scale_max(stats.scale_max);
  out->set_saturated(stats.saturated);
}

void SetFp8Stats(int64_t layer, int64_t expert,
                 const std::array<Fp8OperandStats, kNumFp8Roles>& roles, v1::Fp8Stats* out) {
  out->set_layer(layer);
  out->set_expert(expert);
  SetFp8Operand(roles[static_cast<int>(Fp8Role::kInput)], out->mutable_input());
  SetFp8Operand(roles[static_cast<int>(Fp8Role::kWeight)], out->mutable_weight());
  SetFp8Operand(roles[static_cast<int>(Fp8Role::kGrad)], out->mutable_grad());
}

// Turns the trainer's reports into reports to the coordinator.
class ReportingObserver : public TrainObserver {
 public:
  ReportingObserver(const v1::Assignment& assignment, const RankEnvironment& environment,
                    RankAgent* agent, RankControl* control, double flops_per_token,
                    double peak_flops, std::optional<double> best_possible_loss,
                    const DeviceRuntime* device)
      : assignment_(assignment),
        environment_(environment),
        agent_(agent),
        control_(control),
        flops_per_token_(flops_per_token),
        peak_flops_(peak_flops),
        best_possible_loss_(best_possible_loss),
        device_(device) {}

  void OnStepPhases(const StepPhaseSeconds& phases) override {
    if (environment_.metrics) agent_->ObservePhases(phases, device_);
  }

  void OnStep(const StepReport& report) override {
    control_->step.store(report.step);
    agent_->Progress(report.step);
    if (assignment_.rank() != 0) return;  // rank 0 speaks for the job
    v1::ReportStepRequest request;
    Address(&request);
    v1::StepMetrics* m = request.mutable_metrics();
    m->set_step(report.step);
    m->set_loss(report.loss);
    if (report.eval_loss.has_value()) m->set_eval_loss(*report.eval_loss);
    m->set_lr(report.lr);
    m->set_grad_norm(report.grad_norm);
    m->set_tokens_per_s(report.tokens_per_s);
    m->set_expert_load_max_over_mean(report.expert_load_max_over_mean);
    m->set_tokens_seen(report.tokens_seen);
    m->set_aux_loss(report.aux_loss);
    if (report.mtp_loss.has_value()) m->set_mtp_loss(*report.mtp_loss);
    m->set_z_loss(report.z_loss);
    m->set_dropped_tokens(report.dropped_tokens);
    m->set_step_seconds(report.step_seconds);
    m->set_device_memory_bytes(report.device_memory_bytes);
    m->set_device_memory_peak_bytes(report.device_memory_peak_bytes);
    if (peak_flops_ > 0) {
      m->set_mfu(flops_per_token_ * report.tokens_per_s / (peak_flops_ * assignment_.world_size()));
    }
    for (double load : report.expert_load_per_layer) m->add_expert_load_per_layer(load);
    m->mutable_expert_tokens()->Add(report.expert_tokens.begin(), report.expert_tokens.end());
    for (const Fp8LayerStats& layer : report.fp8_layers) {
      SetFp8Stats(layer.layer, 0, layer.roles, m->add_fp8_layers());
    }
    for (const Fp8ExpertStats& expert : report.fp8_experts) {
      SetFp8Stats(expert.layer, expert.expert, expert.roles, m->add_fp8_experts());
    }
    if (best_possible_loss_.has_value()) m->set_best_possible_loss(*best_possible_loss_);
    agent_->Report(std::move(request));
  }

  void OnCheckpoint(const CheckpointReport& report) override { ReportCheckpoint(report); }

  void OnMessage(const std::string& message) override {
    if (assignment_.rank() != 0) return;
    v1::ReportLogRequest request;
    Address(&request);
    request.add_lines(message);
    agent_->Report(std::move(request));
  }

  absl::Status BeforeCheckpoint(int64_t step) override { return agent_->MayWriteCheckpoints(); }

  void ReportCheckpoint(const CheckpointReport& report) {
    if (!environment_.reports_checkpoints) return;
    v1::ReportCheckpointRequest request;
    Address(&request);
    request.set_step(report.step);
    // The coordinator knows the job's directory as it assigned it; the trainer wrote to its
    // resolved form (CheckJobPaths).
    request.set_path(
        absl::StrCat(assignment_.checkpoint_dir(), "/", CheckpointStepDirName(report.step)));
    request.set_tokens_seen(report.tokens_seen);
    ToProtoDuration(absl::Seconds(report.write_seconds), request.mutable_write_duration());
    agent_->Report(std::move(request));
  }

  template <typename Request>
  void Address(Request* request) const {
    request->set_worker_id(environment_.worker_id);
    request->set_job_id(assignment_.job_id());
    request->set_attempt(assignment_.attempt());
    request->set_rank(assignment_.rank());
  }

 private:
  const v1::Assignment& assignment_;
  const RankEnvironment& environment_;
  RankAgent* const agent_;
  RankControl* const control_;
  const double flops_per_token_;
  const double peak_flops_;
  const std::optional<double> best_possible_loss_;
  const DeviceRuntime* const device_;  // the rank's GPU; null on the CPU
};

// The attempt's rendezvous, reached through the agent: the Gloo store and the NCCL id exchange.
class AgentKeyValueStore final : public KeyValueStore {
 public:
  explicit AgentKeyValueStore(RankAgent* agent) : agent_(agent) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return agent_->KvSet(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return agent_->KvGet(key, timeout);
  }

 private:
  RankAgent* const agent_;
};

v1::ReportAttemptEndRequest EndReport(const v1::Assignment& assignment,
                                      const RankEnvironment& environment,
                                      v1::AttemptOutcome outcome, const std::string& message,
                                      int64_t step, bool worker_draining,
                                      v1::FailureKind failure_kind = v1::FAILURE_KIND_UNSPECIFIED) {
  v1::ReportAttemptEndRequest request;
  request.set_worker_id(environment.worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  request.set_outcome(outcome);
  request.set_message(message);
  request.set_step(step);
  request.set_failure_kind(failure_kind);
  request.set_worker_draining(worker_draining);
  return request;
}

// Logs the job's memory estimate (rank 0 also reports it as a log line of the job) and refuses
// it, ResourceExhausted naming both figures, when it exceeds the worker's --memory-limit: before
// anything is allocated, so that a model too large for this worker fails the attempt, not the
// worker.
absl::Status CheckMemory(const v1::Assignment& assignment, const RankEnvironment& environment,
                         RankAgent* agent, const TrainerConfig& config) {
  const MemoryEstimate estimate = EstimateTrainingMemory(config);
  const int64_t limit = environment.memory_limit_bytes;
  const std::string line =
      absl::StrCat("memory estimate: ", estimate.DebugString(),
                   limit > 0 ? absl::StrCat(" of limit ", FormatBytes(static_cast<double>(limit)))
                             : std::string());
  Log(absl::StrCat("job ", assignment.job_id(), " rank ", assignment.rank(), ": ", line));
  if (assignment.rank() == 0) {
    v1::ReportLogRequest request;
    request.set_worker_id(environment.worker_id);
    request.set_job_id(assignment.job_id());
    request.set_attempt(assignment.attempt());
    request.set_rank(assignment.rank());
    request.add_lines(line);
    agent->Report(std::move(request));
  }
  // On a GPU the device part goes against the GPU's memory, the checkpoint's host copy against
  // the limit.
  return CheckTrainingMemory(config, estimate, limit, "the worker's --memory-limit");
}

// The gang's world: the ranks meet through the coordinator's rendezvous of this attempt, so a
// restarted gang never meets the ranks of an earlier attempt.
// On a GPU (`device`) it is NCCL, on the device's communication stream, its collectives ordered
// after the compute stream's ops by events (a world of one included, without a store). With
// environment.metrics, it and its subgroups account their traffic to the agent.
absl::StatusOr<std::shared_ptr<Communicator>> WorldCommunicator(const v1::Assignment& assignment,
                                                                const RankEnvironment& environment,
                                                                RankAgent* agent, Device device) {
  CommOptions options;
  options.group.rank = assignment.rank();
  options.group.size = assignment.world_size();
  options.group.timeout = environment.comm_timeout;
  if (assignment.world_size() > 1) {
    options.group.store = std::make_shared<AgentKeyValueStore>(agent);
    options.listen_host = environment.comm_host.empty() ? "127.0.0.1" : environment.comm_host;
  }
  if (device.type == DeviceType::kCuda) {
    MOETRAIN_ASSIGN_OR_RETURN(const ExecContext ctx, ExecContext::ForDevice(device));
    options.cuda = true;
    options.cuda_device = device.index;
    options.cuda_stream = ctx.runtime()->comm_stream_handle();
    options.order_after_stream = ctx.runtime()->compute_stream_handle();
  }
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, CreateCommunicator(options));
  if (environment.metrics) {
    // The agent outlives the rank's communicators: no ownership to share.
    std::shared_ptr<CommMeter> meter(agent, [](CommMeter*) {});
    return std::make_shared<MeteredCommunicator>(std::move(world), std::move(meter));
  }
  return std::shared_ptr<Communicator>(std::move(world));
}

// Builds, resumes and runs the trainer; returns how the rank ended (error = FAILED).
absl::StatusOr<v1::AttemptOutcome> Train(const v1::Assignment& assignment,
                                         const RankEnvironment& environment, RankAgent* agent,
                                         RankControl* control, int64_t* step) {
  // The trainer writes to <checkpoint_dir>/<job_id>: split the job's directory accordingly.
  const std::filesystem::path root(assignment.checkpoint_dir());
  const std::filesystem::path parent = root.has_parent_path() ? root.parent_path() : ".";
  // The spec says CPU or CUDA; the worker says which of its GPUs this rank has (so that the
  // config's validation opens that GPU, not GPU 0 from every rank's thread).
  MOETRAIN_ASSIGN_OR_RETURN(
      TrainerConfig config,
      TrainerConfigFromSpec(assignment.spec(), parent.string(),
                            environment.device.is_cpu() ? 0 : environment.device.index));
  config.job_id = root.filename().string();
  config.stop_after_step = environment.stop_after_step;
  // Before anything is read or written: the spec's paths stay where the operator allows, and the
  // trainer uses them as they were checked (resolved once).
  MOETRAIN_ASSIGN_OR_RETURN(
      const ResolvedJobPaths paths,
      CheckJobPaths(assignment.spec(), assignment.checkpoint_dir(),
                    JobPathPolicy{.checkpoint_root = assignment.checkpoint_root(),
                                  .data_roots = environment.data_roots}));
  config.checkpoint_dir = paths.checkpoint_dir;
  config.data.path = paths.data_path;
  config.init_from = paths.init_from;
  if (assignment.world_size() != config.parallel.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the assignment has ", assignment.world_size(), " ranks but the spec's layout ",
        config.parallel.DebugString(), " has ", config.parallel.world_size()));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckMemory(assignment, environment, agent, config));
  // A GPU this rank cannot use is said as such, not as a gang that could not meet.
  MOETRAIN_ASSIGN_OR_RETURN(const ExecContext device_ctx, ExecContext::ForDevice(config.device));
  absl::StatusOr<std::shared_ptr<Communicator>> world =
      WorldCommunicator(assignment, environment, agent, config.device);
  if (!world.ok()) {
    // The gang could not meet (a peer that never came, a fenced rendezvous, this worker's network
    // setup): another attempt, on other workers maybe, may well meet.
    return absl::UnavailableError(
        absl::StrCat("the ranks could not meet: ", world.status().ToString()));
  }
  // Measured on the rank's device before the trainer exists, so that the measurement's matrices
  // are not in the peak device memory the trainer reports.
  // A GPU's MFU is against its dense bf16 rate (cuBLASLt), whatever the job's precision; the CPU
  // measures the job's own dtype.
  const double peak_flops =
      PeakFlops(device_ctx, config.device.is_cpu() ? config.compute_dtype : DType::kBF16);
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, *world));
  ReportingObserver observer(assignment, environment, agent, control,
                             TrainingFlopsPerToken(config.model, config.data.seq_len), peak_flops,
                             trainer->best_possible_loss(), device_ctx.runtime());
  const absl::Status resumed = trainer->Resume(&observer);
  if (absl::IsNotFound(resumed)) {
    if (!assignment.resume_checkpoint().empty()) {
      return absl::DataLossError(absl::StrCat("the coordinator recorded checkpoint ",
                                              assignment.resume_checkpoint(),
                                              ", but there is no checkpoint in ", root.string()));
    }
    if (!config.init_from.empty()) {
      const absl::Status initialized = trainer->InitializeFrom(config.init_from);
      // The spec names that checkpoint: missing or damaged, it is so for every attempt.
      if (absl::IsNotFound(initialized) || absl::IsDataLoss(initialized)) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint.init_from = ", config.init_from, ": ", initialized.message()));
      }
      MOETRAIN_RETURN_IF_ERROR(initialized);
      observer.OnMessage(
          absl::StrCat("model weights from checkpoint.init_from = ", config.init_from));
    }
  } else if (!resumed.ok()) {
    return resumed;
  } else {
    // Newer than what the coordinator knows (its report was lost), or unknown to it altogether
    // (`moetrain run --resume`): tell it, so that its record and the job's progress agree.
    const std::string path = (root / CheckpointStepDirName(trainer->step())).string();
    if (path != assignment.resume_checkpoint()) {
      observer.ReportCheckpoint({trainer->step(), path, trainer->tokens_seen(), 0.0});
    }
  }
  control->step.store(trainer->step());
  agent->Progress(trainer->step());
  const absl::Status ran = trainer->Run(&observer, &control->stop);
  *step = trainer->step();
  if (!ran.ok()) return ran;
  if (trainer->step() >= config.steps) return v1::ATTEMPT_OUTCOME_SUCCEEDED;
  if (config.stop_after_step > 0 && trainer->step() >= config.stop_after_step) {
    // The worker winds down after this attempt (WorkerOptions::stop_after_step): the coordinator
    // must not give the job back to it.
    control->worker_draining.store(true);
    return v1::ATTEMPT_OUTCOME_STOPPED;
  }
  return control->stop.load() == StopRequest::kStop ? v1::ATTEMPT_OUTCOME_CANCELLED
                                                    : v1::ATTEMPT_OUTCOME_STOPPED;
}

}  // namespace

v1::FailureKind FailureKindOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return v1::FAILURE_KIND_PERMANENT;
    default:
      return v1::FAILURE_KIND_TRANSIENT;
  }
}

v1::ReportAttemptEndRequest RunRank(const v1::Assignment& assignment,
                                    const RankEnvironment& environment, RankAgent* agent,
                                    RankControl* control) {
  omp_set_num_threads(environment.threads);
  int64_t step = 0;
  absl::StatusOr<v1::AttemptOutcome> outcome = absl::UnknownError("not run");
  // An allocation that fails (std::bad_alloc), or any other exception from below, ends this
  // attempt with its reason; what no exception catches (a crash) ends the process, and the
  // worker reports how.
  try {
    outcome = Train(assignment, environment, agent, control, &step);
  } catch (const std::bad_alloc&) {
    outcome = absl::ResourceExhaustedError(
        "out of memory: an allocation failed (std::bad_alloc); the model does not fit in this "
        "worker's memory");
  } catch (const std::exception& error) {
    outcome = absl::InternalError(absl::StrCat("unexpected exception: ", error.what()));
  }
  step = std::max(step, control->step.load());
  const std::string who = absl::StrCat("job ", assignment.job_id(), " attempt ",
                                       assignment.attempt(), " rank ", assignment.rank());
  if (!outcome.ok()) {
    Log(absl::StrCat(who, " failed at step ", step, ": ", outcome.status().message()));
    return EndReport(assignment, environment, v1::ATTEMPT_OUTCOME_FAILED,
                     std::string(outcome.status().message()), step, control->worker_draining.load(),
                     FailureKindOf(outcome.status()));
  }
  Log(absl::StrCat(who, " ended at step ", step, ": ", v1::AttemptOutcome_Name(*outcome)));
  return EndReport(assignment, environment, *outcome, "", step, control->worker_draining.load());
}

}  // namespace moetrain
