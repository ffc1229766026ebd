// The trainer: configuration, the step loop and evaluation. Checkpoints and resume are in
// trainer_checkpoint.cc.
#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

absl::Status Invalid(const char* field, int64_t value, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " ", why));
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::Status TrainerConfig::Validate() const {
  MOETRAIN_RETURN_IF_ERROR(model.Validate());
  MOETRAIN_RETURN_IF_ERROR(data.Validate());
  MOETRAIN_RETURN_IF_ERROR(optimizer.Validate());
  MOETRAIN_RETURN_IF_ERROR(CheckComputeDType(compute_dtype, "train.precision"));
  MOETRAIN_RETURN_IF_ERROR(ExecContext::ForDevice(device).status());
  if (fp8.has_value()) MOETRAIN_RETURN_IF_ERROR(fp8->Validate());
  if (fp8.has_value() && fp8->has_state()) {
    // The product bound that the recipe alone cannot check: its slots come from the model.
    const double slots = Fp8SlotCount(model);
    if (slots * static_cast<double>(fp8->amax_history_len) > kMaxFp8HistoryFloats) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "train.fp8.amax_history_len = %d over the model's %.0f FP8 scaling slots is %.0f "
          "floats of amax history, more than 2^28 (1 GiB on every rank and in every "
          "checkpoint): at most %.0f for this model",
          fp8->amax_history_len, slots, slots * static_cast<double>(fp8->amax_history_len),
          std::floor(kMaxFp8HistoryFloats / slots)));
    }
  }
  if (steps < 1) return Invalid("train.steps", steps, "must be at least 1");
  if (data.seq_len > model.max_seq_len) {
    return Invalid("train.seq_len", data.seq_len,
                   absl::StrCat("exceeds model.max_seq_len = ", model.max_seq_len).c_str());
  }
  const int64_t micro = micro_batch_size > 0 ? micro_batch_size : data.batch_size;
  if (micro_batch_size < 0 || data.batch_size % micro != 0) {
    return Invalid("train.micro_batch_size", micro_batch_size,
                   absl::StrCat("must divide train.batch_size = ", data.batch_size).c_str());
  }
  MOETRAIN_RETURN_IF_ERROR(parallel.Validate(model, data.batch_size, micro_batch_size));
  if (log_every < 1) return Invalid("train.log_every", log_every, "must be at least 1");
  if (eval_every < 0) return Invalid("train.eval_every", eval_every, "must not be negative");
  if (eval_batches < 0) return Invalid("train.eval_batches", eval_batches, "must not be negative");
  if (checkpoint_every < 0) {
    return Invalid("checkpoint.every_steps", checkpoint_every, "must not be negative");
  }
  if (keep_last < 0) return Invalid("checkpoint.keep_last", keep_last, "must not be negative");
  if (stop_after_step < 0 || stop_after_step > steps) {
    return Invalid("stop_after_step", stop_after_step,
                   absl::StrCat("is not in [0, train.steps = ", steps, "]").c_str());
  }
  if (!std::isfinite(grad_clip)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.optimizer.grad_clip = ", grad_clip, " must be finite"));
  }
  LrScheduleConfig resolved = schedule;
  if (resolved.total_steps == 0) resolved.total_steps = steps;
  return resolved.Validate();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& config,
                                                         std::shared_ptr<Communicator> world) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_ASSIGN_OR_RETURN(const ExecContext ctx, ExecContext::ForDevice(config.device));
  // The steps report the peak since the trainer started (StepReport).
  if (ctx.runtime() != nullptr) ctx.runtime()->ResetPeakMemory();
  std::unique_ptr<Trainer> trainer(new Trainer(ctx));
  trainer->config_ = config;
  if (trainer->config_.schedule.total_steps == 0)
    trainer->config_.schedule.total_steps = config.steps;
  MOETRAIN_ASSIGN_OR_RETURN(trainer->groups_,
                            ParallelGroups::Create(config.parallel, std::move(world)));
  const ParallelGroups& groups = *trainer->groups_;

  MOETRAIN_ASSIGN_OR_RETURN(
      Transformer model,
      Transformer::Create(config.model, config.compute_dtype, groups.moe_parallel(), ctx,
                          config.fp8, config.recompute));
  trainer->model_ = std::make_unique<Transformer>(std::move(model));
  MOETRAIN_RETURN_IF_ERROR(trainer->model_->Initialize(config.seed));
  for (const NamedParameter& p : trainer->model_->parameters()) {
    if (!p.trainable) continue;
    const Parameter param = {p.name, p.value, p.grad, p.weight_decay};
    trainer->trainable_.push_back(param);
    (p.expert ? trainer->trainable_experts_ : trainer->trainable_dense_).push_back(param);
  }
  trainer->grad_sync_ = std::make_unique<GradSync>(groups, *trainer->model_, ctx);
  // Unsharded, the one range is the whole buffer: a piece per parameter, whole.
  MOETRAIN_ASSIGN_OR_RETURN(
      trainer->pieces_,
      SliceParameters(trainer->trainable_, trainer->model_->master_buffer(),
                      trainer->model_->grad_buffer(), trainer->grad_sync_->OwnedRanges()));
  trainer->updated_ = trainer->trainable_;
  if (trainer->sharded()) {
    trainer->updated_.clear();
    for (const ParameterPiece& piece : trainer->pieces_) trainer->updated_.push_back(piece.part);
  }
  MOETRAIN_ASSIGN_OR_RETURN(AdamW optimizer,
                            AdamW::Create(ctx, config.optimizer, trainer->updated_));
  trainer->optimizer_ = std::make_unique<AdamW>(std::move(optimizer));
  DataConfig data_config = config.data;
  data_config.extra_tokens = config.model.mtp_depth;  // the MTP modules' tokens ahead
  MOETRAIN_ASSIGN_OR_RETURN(DataLoader data,
                            DataLoader::Create(data_config, groups.rank(), groups.world_size()));
  trainer->data_ = std::make_unique<DataLoader>(std::move(data));
  MOETRAIN_RETURN_IF_ERROR(trainer->grad_sync_->ZeroGrads());
  return trainer;
}

std::optional<double> Trainer::best_possible_loss() const {
  if (data_->synthetic() == nullptr) return std::nullopt;
  return data_->synthetic()->entropy_rate();
}

std::string Trainer::CheckpointRoot() const {
  return absl::StrCat(config_.checkpoint_dir, "/", config_.job_id);
}

absl::Status Trainer::ForwardBackward(const Tensor& batch, StepStats* stats,
                                      StepPhaseSeconds* phases) {
  const int world = groups_->world_size();
  const int64_t micro_batches = config_.micro_batches();
  const int64_t local_batch = data_->local_batch_size();
  BackwardOptions options;
  // 1/W: the ranks' grads are summed, and their mean is the single-process gradient.
  options.loss_scale = 1.0f / static_cast<float>(micro_batches * world);
  // A rank that stopped early would leave the others' collectives unanswered.
  options.backward_through_nonfinite_loss = world > 1;
  double phase_start = 0;
  bool in_forward = true;
  for (int64_t m = 0; m < micro_batches; ++m) {
    // Stage 0 ends the forward phase (StepPhaseSeconds::forward says what it holds). During the
    // last micro-batch's backward (every one's with sharded gradients) the grads are summed over
    // the ranks (grad_sync.h).
    grad_sync_->BeginMicroBatch(m, micro_batches);
    options.on_stage_done = [&](int64_t stage) {
      if (stage == 0) {
        const double now = Seconds();
        phases->forward += now - phase_start;
        phase_start = now;
        in_forward = false;
      }
      return grad_sync_->StageDone(stage);
    };
    TensorView rows =
        batch.view().Slice(m * local_batch / micro_batches, (m + 1) * local_batch / micro_batches);
    phase_start = Seconds();
    in_forward = true;
    absl::StatusOr<StepResult> result = model_->ForwardBackward(rows, options);
    (in_forward ? phases->forward : phases->backward) += Seconds() - phase_start;
    if (!result.ok()) {
      if (!IsNonFiniteError(result.status())) return result.status();
      // NaN/Inf activations: the step is non-finite, whatever its remaining micro-batches hold.
      stats->AddNonFinite(std::string(result.status().message()));
      break;
    }
    stats->Add(*result);
    // With sharded gradients, what is left of this micro-batch's sums (grad_sync.h).
    if (m < micro_batches - 1) {
      const double end_start = Seconds();
      MOETRAIN_RETURN_IF_ERROR(grad_sync_->EndMicroBatch());
      phases->communication += Seconds() - end_start;
    }
  }
  const double sync_start = Seconds();
  const absl::Status synced = grad_sync_->Finish();
  phases->communication += Seconds() - sync_start;
  return synced;
}

absl::StatusOr<double> Trainer::GlobalGradNorm() {
  if (sharded()) {
    // Each summed grad element lies in exactly one rank's pieces.
    MOETRAIN_ASSIGN_OR_RETURN(double squares, GradSquaredSum(ctx_, updated_));
    MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&groups_->world(), absl::MakeSpan(&squares, 1)));
    return std::sqrt(squares);
  }
  MOETRAIN_ASSIGN_OR_RETURN(const double dense_squares, GradSquaredSum(ctx_, trainable_dense_));
  MOETRAIN_ASSIGN_OR_RETURN(double expert_squares, GradSquaredSum(ctx_, trainable_experts_));
  MOETRAIN_RETURN_IF_ERROR(
      SumOverRanks(groups_->expert_group(), absl::MakeSpan(&expert_squares, 1)));
  return std::sqrt(dense_squares + expert_squares);
}

absl::Status Trainer::UpdateWeights(double grad_norm, const StepStats& stats, StepReport* report) {
  MOETRAIN_RETURN_IF_ERROR(ClipGradsToNorm(ctx_, updated_, config_.grad_clip, grad_norm));
  report->lr = LearningRate(config_.schedule, step_);
  MOETRAIN_RETURN_IF_ERROR(optimizer_->Step(static_cast<float>(report->lr)));
  // A sharded optimizer updated this rank's pieces only: the others' come from their ranks.
  MOETRAIN_RETURN_IF_ERROR(
      grad_sync_->GatherOwned(static_cast<float*>(model_->master_buffer().raw())));
  std::vector<std::vector<int64_t>> tokens_per_expert;
  for (int64_t l = 0; l < model_->num_moe_layers(); ++l) {
    tokens_per_expert.push_back(stats.tokens_per_expert(l));
  }
  MOETRAIN_RETURN_IF_ERROR(model_->UpdateExpertBiases(tokens_per_expert));
  return model_->SyncComputeWeights();
}

absl::StatusOr<StepReport> Trainer::TrainStep(StepPhaseSeconds* phases) {
  const double start = Seconds();
  // Each micro-batch of each rank is one share of the step's mean losses.
  const int64_t shares = config_.micro_batches() * groups_->world_size();
  StepStats stats(model_->num_moe_layers(), config_.model.moe.num_experts,
                  config_.model.mtp_depth > 0);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor batch, data_->Next());
  MOETRAIN_RETURN_IF_ERROR(ForwardBackward(batch, &stats, phases));
  // Every rank reports the global step: the sums reach every rank with the same bits, so every
  // rank takes the same branch below.
  const double sums_start = Seconds();
  MOETRAIN_RETURN_IF_ERROR(stats.SumOverRanks(&groups_->world()));
  const double optimizer_start = Seconds();
  phases->communication += optimizer_start - sums_start;
  MOETRAIN_ASSIGN_OR_RETURN(const double grad_norm, GlobalGradNorm());
  StepReport report;
  stats.Report(shares, &report);

  if (!stats.finite_losses() || !std::isfinite(grad_norm)) {
    if (!config_.skip_nonfinite_steps) {
      const std::string& detail = stats.non_finite_detail();
      const std::string message = absl::StrCat(
          "step ", step_ + 1, ": the ", stats.finite_losses() ? "gradient" : "loss",
          " is not finite (loss = ", report.loss, detail.empty() ? "" : absl::StrCat(": ", detail),
          "); stopping without a checkpoint of this state (set train.skip_nonfinite_steps to "
          "skip such steps)");
      // The job's first step computes from its initial weights and first batch alone, which
      // every attempt recomputes the same: the spec (its scales, its data) makes the NaN, and no
      // restart can get past it. A later one resumes from a checkpoint and may.
      if (step_ == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(message, "; at the job's first step no restart can help"));
      }
      return absl::DataLossError(message);
    }
    report.skipped = true;
    report.grad_norm = std::nan("");
  } else {
    report.grad_norm = grad_norm;
    MOETRAIN_RETURN_IF_ERROR(UpdateWeights(grad_norm, stats, &report));
  }
  MOETRAIN_RETURN_IF_ERROR(grad_sync_->ZeroGrads());
  // The FP8 amaxes of the step, over every rank, give the next step's delayed scales.
  if (Fp8State* fp8 = model_->fp8_state(); fp8 != nullptr) {
    MOETRAIN_RETURN_IF_ERROR(fp8->EndStep(&groups_->world()));
    FillFp8Report(*fp8, &report);
  }
  // On a device the update and the zeroing above are only queued: the step's time (and its
  // memory) includes them once they are done. The next step's token copy would wait for them
  // anyway, so this costs no overlap.
  MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
  if (const DeviceRuntime* runtime = ctx_.runtime(); runtime != nullptr) {
    const DeviceMemoryStats memory = runtime->memory_stats();
    report.device_memory_bytes = memory.in_use_bytes;
    report.device_memory_peak_bytes = memory.peak_bytes;
  }
  ++step_;
  tokens_seen_ += stats.tokens();
  report.step = step_;
  report.tokens_seen = tokens_seen_;
  const double end = Seconds();
  phases->optimizer = end - optimizer_start;
  report.step_seconds = std::max(end - start, 1e-9);
  report.tokens_per_s = stats.tokens() / report.step_seconds;
  return report;
}

absl::StatusOr<double> Trainer::Evaluate() {
  const int world = groups_->world_size();
  EvalIterator eval = data_->Eval();
  const int64_t windows = data_->num_eval_windows(), batch_size = config_.data.batch_size;
  // Σ over batches of this rank's part of the batch's mean loss (its mean × its share of rows).
  double loss_sum = 0;
  int64_t batches = 0;
  std::string non_finite;
  // One row of token 0, for a rank whose share of a short batch is empty.
  std::optional<Tensor> placeholder;
  while (config_.eval_batches == 0 || batches < config_.eval_batches) {
    MOETRAIN_ASSIGN_OR_RETURN(std::optional<Tensor> batch, eval.Next());
    if (!batch.has_value()) break;
    const int64_t rows = batch->dim(0);
    const int64_t batch_rows = std::min(batch_size, windows - batches * batch_size);
    ++batches;
    // Every rank runs every batch, since the MoE layers exchange tokens: an empty share runs a
    // placeholder row whose loss is not counted.
    TensorView tokens = batch->view();
    if (rows == 0) {
      if (!placeholder.has_value()) {
        placeholder =
            Tensor::Zeros(DType::kI32, {1, config_.data.seq_len + 1 + config_.model.mtp_depth});
      }
      tokens = placeholder->view();
    }
    absl::StatusOr<float> loss = model_->Evaluate(tokens);
    if (!loss.ok()) {
      // With several ranks the others still need this one in the remaining batches' collectives.
      if (world == 1 || !IsNonFiniteError(loss.status())) return loss.status();
      non_finite = std::string(loss.status().message());
      loss_sum = std::nan("");
      continue;
    }
    if (rows > 0) loss_sum += *loss * (static_cast<double>(rows) / batch_rows);
  }
  if (batches == 0) return absl::FailedPreconditionError("the data has no held-out windows");
  MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&groups_->world(), absl::MakeSpan(&loss_sum, 1)));
  if (!std::isfinite(loss_sum)) {
    return NonFiniteError(non_finite.empty() ? "evaluation loss = nan on another rank"
                                             : non_finite);
  }
  return loss_sum / batches;
}

absl::StatusOr<StopRequest> Trainer::AgreeOnStop(const std::atomic<StopRequest>* stop) {
  const StopRequest local = stop != nullptr ? stop->load() : StopRequest::kNone;
  if (groups_->world_size() == 1) return local;
  int64_t votes[2] = {local == StopRequest::kCheckpointAndStop, local == StopRequest::kStop};
  MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&groups_->world(), absl::MakeSpan(votes)));
  // Saving what the ranks have done is never wrong; stopping without it only when none asks.
  if (votes[0] > 0) return StopRequest::kCheckpointAndStop;
  if (votes[1] > 0) return StopRequest::kStop;
  return StopRequest::kNone;
}

absl::StatusOr<bool> Trainer::MaybeSaveCheckpoint(TrainObserver* observer) {
  const absl::Status allowed = observer->BeforeCheckpoint(step_);
  int64_t refusals = allowed.ok() ? 0 : 1;
  // A checkpoint some ranks wrote and others did not would be no checkpoint at all.
  MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&groups_->world(), absl::MakeSpan(&refusals, 1)));
  if (refusals > 0) {
    observer->OnMessage(
        absl::StrCat("checkpoint of step ", step_, " skipped: ",
                     !allowed.ok() ? std::string(allowed.message())
                                   : absl::StrCat(refusals, " other rank(s) may not write it")));
    return false;
  }
  MOETRAIN_ASSIGN_OR_RETURN(CheckpointReport report, SaveCheckpoint());
  observer->OnCheckpoint(report);
  return true;
}

absl::Status Trainer::Run(TrainObserver* observer, const std::atomic<StopRequest>* stop) {
  TrainObserver quiet;
  if (observer == nullptr) observer = &quiet;
  const bool checkpoints = !config_.checkpoint_dir.empty();
  // The state Run starts from is on disk already (resumed from it, or saved by an earlier Run):
  // saving it again would collide with its step directory.
  int64_t last_saved = step_;
  const int64_t end = config_.stop_after_step > 0 ? config_.stop_after_step : config_.steps;
  while (step_ < end) {
    MOETRAIN_ASSIGN_OR_RETURN(const StopRequest request, AgreeOnStop(stop));
    if (request == StopRequest::kStop) {
      observer->OnMessage(absl::StrCat("stopping at step ", step_, " without a checkpoint"));
      return absl::OkStatus();
    }
    if (request == StopRequest::kCheckpointAndStop) {
      observer->OnMessage(absl::StrCat("stopping at step ", step_, " as asked"));
      break;
    }
    StepPhaseSeconds phases;
    MOETRAIN_ASSIGN_OR_RETURN(StepReport report, TrainStep(&phases));
    observer->OnStepPhases(phases);
    if (report.skipped) {
      observer->OnMessage(absl::StrCat("step ", report.step,
                                       ": non-finite loss or gradient, "
                                       "update skipped"));
    }
    const bool last = step_ == config_.steps;
    if (config_.eval_every > 0 && (step_ % config_.eval_every == 0 || last)) {
      MOETRAIN_ASSIGN_OR_RETURN(double eval_loss, Evaluate());
      report.eval_loss = eval_loss;
    }
    // The step a stop_after_step ends at is shown, but not evaluated: an evaluation there would
    // be one the uninterrupted run does not make.
    if (step_ == 1 || step_ == end || step_ % config_.log_every == 0 ||
        report.eval_loss.has_value()) {
      observer->OnStep(report);
    }
    if (checkpoints && config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0 &&
        step_ != end) {
      MOETRAIN_ASSIGN_OR_RETURN(bool saved, MaybeSaveCheckpoint(observer));
      if (saved) last_saved = step_;
    }
  }
  if (checkpoints && last_saved != step_ && step_ > 0) {
    MOETRAIN_RETURN_IF_ERROR(MaybeSaveCheckpoint(observer).status());
  }
  return absl::OkStatus();
}

}  // namespace moetrain
