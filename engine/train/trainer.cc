#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/train/checkpoint.h"
#include "engine/train/model_config_json.h"

namespace moetrain {
namespace {

absl::Status Invalid(const char* field, int64_t value, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " ", why));
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status CopyCheckpointTensor(const std::string& path,
                                  const std::map<std::string, Tensor>& tensors,
                                  const std::string& name, TensorView dst) {
  auto it = tensors.find(name);
  if (it == tensors.end()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is missing"));
  }
  const Tensor& src = it->second;
  if (src.dtype() != DType::kF32 || src.view().shape() != dst.shape()) {
    return absl::DataLossError(absl::StrCat(path, ": tensor ", name, " is ",
                                            src.view().DebugString(), ", expected ",
                                            dst.DebugString()));
  }
  std::memcpy(dst.raw(), src.view().raw(), dst.numel() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace

absl::Status RestoreModelParameters(const LoadedCheckpoint& loaded, Transformer* model) {
  for (const NamedParameter& p : model->parameters()) {
    MOETRAIN_RETURN_IF_ERROR(
        CopyCheckpointTensor(loaded.path, loaded.model_tensors, p.name, p.value));
  }
  model->SyncComputeWeights();
  return absl::OkStatus();
}

absl::Status TrainerConfig::Validate() const {
  MOETRAIN_RETURN_IF_ERROR(model.Validate());
  MOETRAIN_RETURN_IF_ERROR(data.Validate());
  MOETRAIN_RETURN_IF_ERROR(optimizer.Validate());
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.precision = ", std::string(DTypeName(compute_dtype)),
                     " is not supported on the CPU (f32, bf16)"));
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
  if (log_every < 1) return Invalid("train.log_every", log_every, "must be at least 1");
  if (eval_every < 0) return Invalid("train.eval_every", eval_every, "must not be negative");
  if (eval_batches < 0) return Invalid("train.eval_batches", eval_batches, "must not be negative");
  if (checkpoint_every < 0) {
    return Invalid("checkpoint.every_steps", checkpoint_every, "must not be negative");
  }
  if (keep_last < 0) return Invalid("checkpoint.keep_last", keep_last, "must not be negative");
  if (!std::isfinite(grad_clip)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.optimizer.grad_clip = ", grad_clip, " must be finite"));
  }
  LrScheduleConfig resolved = schedule;
  if (resolved.total_steps == 0) resolved.total_steps = steps;
  return resolved.Validate();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerConfig& config, int rank,
                                                         int world_size) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Trainer> trainer(new Trainer());
  trainer->config_ = config;
  if (trainer->config_.schedule.total_steps == 0)
    trainer->config_.schedule.total_steps = config.steps;
  trainer->rank_ = rank;
  trainer->world_size_ = world_size;

  MOETRAIN_ASSIGN_OR_RETURN(Transformer model,
                            Transformer::Create(config.model, config.compute_dtype));
  trainer->model_ = std::make_unique<Transformer>(std::move(model));
  MOETRAIN_RETURN_IF_ERROR(trainer->model_->Initialize(config.seed));
  for (const NamedParameter& p : trainer->model_->parameters()) {
    if (p.trainable) trainer->trainable_.push_back({p.name, p.value, p.grad, p.weight_decay});
  }
  MOETRAIN_ASSIGN_OR_RETURN(AdamW optimizer, AdamW::Create(config.optimizer, trainer->trainable_));
  trainer->optimizer_ = std::make_unique<AdamW>(std::move(optimizer));
  MOETRAIN_ASSIGN_OR_RETURN(DataLoader data, DataLoader::Create(config.data, rank, world_size));
  trainer->data_ = std::make_unique<DataLoader>(std::move(data));
  trainer->model_->ZeroGrads();
  return trainer;
}

std::optional<double> Trainer::best_possible_loss() const {
  if (data_->synthetic() == nullptr) return std::nullopt;
  return data_->synthetic()->entropy_rate();
}

std::string Trainer::CheckpointRoot() const {
  return absl::StrCat(config_.checkpoint_dir, "/", config_.job_id);
}

absl::StatusOr<StepReport> Trainer::TrainStep() {
  const double start = Seconds();
  const int64_t micro =
      config_.micro_batch_size > 0 ? config_.micro_batch_size : config_.data.batch_size;
  const int64_t local_batch = data_->local_batch_size();
  const int64_t micro_batches = std::max<int64_t>(1, local_batch / micro);
  Tensor batch = data_->Next();  // (local B, S + 1) i32

  StepReport report;
  std::vector<std::vector<int64_t>> tokens_per_expert(model_->num_moe_layers());
  int64_t tokens = 0;
  double loss_sum = 0, aux_sum = 0, z_sum = 0;
  std::string non_finite_detail;
  for (int64_t m = 0; m < micro_batches; ++m) {
    TensorView rows =
        batch.view().Slice(m * local_batch / micro_batches, (m + 1) * local_batch / micro_batches);
    absl::StatusOr<StepResult> step_result = model_->ForwardBackward(rows, 1.0f / micro_batches);
    if (!step_result.ok()) {
      if (!IsNonFiniteError(step_result.status())) return step_result.status();
      // NaN/Inf activations: the step is non-finite, whatever its remaining micro-batches hold.
      report.loss = std::nan("");
      non_finite_detail = std::string(step_result.status().message());
      loss_sum = std::nan("");
      break;
    }
    const StepResult& result = *step_result;
    loss_sum += result.loss;
    aux_sum += result.aux_loss;
    z_sum += result.z_loss;
    tokens += result.tokens;
    for (size_t l = 0; l < result.moe_layers.size(); ++l) {
      const MoeStats& stats = result.moe_layers[l];
      auto& counts = tokens_per_expert[l];
      counts.resize(stats.tokens_per_expert.size(), 0);
      for (size_t e = 0; e < counts.size(); ++e) counts[e] += stats.tokens_per_expert[e];
      report.dropped_tokens += stats.dropped_tokens;
    }
  }
  report.loss = loss_sum / micro_batches;
  report.aux_loss = aux_sum / micro_batches;
  report.z_loss = z_sum / micro_batches;
  for (const auto& counts : tokens_per_expert) {
    int64_t total = 0, max = 0;
    for (int64_t c : counts) {
      total += c;
      max = std::max(max, c);
    }
    const double load =
        total > 0 ? static_cast<double>(max) * counts.size() / static_cast<double>(total) : 0.0;
    report.expert_load_per_layer.push_back(load);
    report.expert_load_max_over_mean = std::max(report.expert_load_max_over_mean, load);
  }

  const int64_t step = step_;  // 0-based index of this optimizer step
  const bool finite = std::isfinite(report.loss) && AllFinite(trainable_);
  if (!finite) {
    if (!config_.skip_nonfinite_steps) {
      return absl::DataLossError(absl::StrCat(
          "step ", step + 1, ": the ", std::isfinite(report.loss) ? "gradient" : "loss",
          " is not finite (loss = ", report.loss,
          non_finite_detail.empty() ? "" : absl::StrCat(": ", non_finite_detail),
          "); stopping without a checkpoint of this state (set train.skip_nonfinite_steps to "
          "skip such steps)"));
    }
    report.skipped = true;
    report.grad_norm = std::nan("");
  } else {
    MOETRAIN_RETURN_IF_ERROR(ClipGradNorm(trainable_, config_.grad_clip, &report.grad_norm));
    report.lr = LearningRate(config_.schedule, step);
    MOETRAIN_RETURN_IF_ERROR(optimizer_->Step(static_cast<float>(report.lr)));
    MOETRAIN_RETURN_IF_ERROR(model_->UpdateExpertBiases(tokens_per_expert));
    model_->SyncComputeWeights();
  }
  model_->ZeroGrads();
  ++step_;
  tokens_seen_ += tokens * world_size_;
  report.step = step_;
  report.tokens_seen = tokens_seen_;
  report.step_seconds = std::max(Seconds() - start, 1e-9);
  report.tokens_per_s = tokens * world_size_ / report.step_seconds;
  return report;
}

absl::StatusOr<double> Trainer::Evaluate() {
  EvalIterator eval = data_->Eval();
  double loss_sum = 0;
  int64_t batches = 0;
  while (config_.eval_batches == 0 || batches < config_.eval_batches) {
    std::optional<Tensor> batch = eval.Next();
    if (!batch.has_value()) break;
    if (batch->dim(0) == 0) continue;
    MOETRAIN_ASSIGN_OR_RETURN(float loss, model_->Evaluate(*batch));
    loss_sum += loss;
    ++batches;
  }
  if (batches == 0) return absl::FailedPreconditionError("the data has no held-out windows");
  return loss_sum / batches;
}

absl::StatusOr<bool> Trainer::MaybeSaveCheckpoint(TrainObserver* observer) {
  if (absl::Status allowed = observer->BeforeCheckpoint(step_); !allowed.ok()) {
    observer->OnMessage(absl::StrCat("checkpoint of step ", step_,
                                     " skipped: ", allowed.message()));
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
  while (step_ < config_.steps) {
    const StopRequest request = stop != nullptr ? stop->load() : StopRequest::kNone;
    if (request == StopRequest::kStop) {
      observer->OnMessage(absl::StrCat("stopping at step ", step_, " without a checkpoint"));
      return absl::OkStatus();
    }
    if (request == StopRequest::kCheckpointAndStop) {
      observer->OnMessage(absl::StrCat("stopping at step ", step_, " as asked"));
      break;
    }
    MOETRAIN_ASSIGN_OR_RETURN(StepReport report, TrainStep());
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
    if (step_ == 1 || last || step_ % config_.log_every == 0 || report.eval_loss.has_value()) {
      observer->OnStep(report);
    }
    if (checkpoints && config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0 &&
        !last) {
      MOETRAIN_ASSIGN_OR_RETURN(bool saved, MaybeSaveCheckpoint(observer));
      if (saved) last_saved = step_;
    }
  }
  if (checkpoints && last_saved != step_ && step_ > 0) {
    MOETRAIN_RETURN_IF_ERROR(MaybeSaveCheckpoint(observer).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointReport> Trainer::SaveCheckpoint() {
  const double start = Seconds();
  CheckpointContents contents;
  contents.step = step_;
  contents.tokens_seen = tokens_seen_;
  contents.rank = rank_;
  contents.sections = {
      {"model_config", ModelConfigToJson(config_.model)},
      {"world_layout", {{"world_size", world_size_}, {"rank", rank_}}},
      {"data_position", data_->position().ToJson()},
      // The RNG is counter-based: (seed, step, rank, stream) is its whole state.
      {"rng_state", {{"seed", config_.seed}, {"data_seed", config_.data.seed}, {"step", step_}}},
      {"optimizer", {{"step", optimizer_->step()}}},
      {"compute_dtype", std::string(DTypeName(config_.compute_dtype))},
  };
  // The model file holds the f32 master weights themselves, so the optimizer file needs only
  // the moments.
  for (const NamedParameter& p : model_->parameters())
    contents.model_tensors.push_back({p.name, p.value});
  for (int64_t i = 0; i < optimizer_->num_params(); ++i) {
    const std::string& name = optimizer_->param(i).name;
    contents.optim_tensors.push_back({name + kExpAvgSuffix, optimizer_->exp_avg(i)});
    contents.optim_tensors.push_back({name + kExpAvgSqSuffix, optimizer_->exp_avg_sq(i)});
  }
  contents.hf_config = HuggingFaceConfig(config_.model, config_.data.seq_len);
  CheckpointReport report;
  report.step = step_;
  report.tokens_seen = tokens_seen_;
  MOETRAIN_ASSIGN_OR_RETURN(report.path, WriteCheckpoint(CheckpointRoot(), contents));
  if (config_.keep_last > 0) {
    MOETRAIN_RETURN_IF_ERROR(PruneCheckpoints(CheckpointRoot(), config_.keep_last));
  }
  report.write_seconds = Seconds() - start;
  return report;
}

absl::Status Trainer::Resume(TrainObserver* observer) {
  if (config_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("resume needs a checkpoint directory (checkpoint.dir)");
  }
  MOETRAIN_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadLatestCheckpoint(CheckpointRoot(), rank_));
  if (observer != nullptr) {
    for (const std::string& warning : loaded.warnings) observer->OnMessage(warning);
  }
  if (loaded.manifest.value("model_config", nlohmann::json()) != ModelConfigToJson(config_.model)) {
    return absl::FailedPreconditionError(
        absl::StrCat(loaded.path, " holds a different model than this job's spec"));
  }
  auto copy = [&](const std::map<std::string, Tensor>& tensors, const std::string& name,
                  TensorView dst) { return CopyCheckpointTensor(loaded.path, tensors, name, dst); };
  MOETRAIN_RETURN_IF_ERROR(RestoreModelParameters(loaded, model_.get()));
  for (int64_t i = 0; i < optimizer_->num_params(); ++i) {
    const std::string& name = optimizer_->param(i).name;
    MOETRAIN_RETURN_IF_ERROR(
        copy(loaded.optim_tensors, name + kExpAvgSuffix, optimizer_->exp_avg(i)));
    MOETRAIN_RETURN_IF_ERROR(
        copy(loaded.optim_tensors, name + kExpAvgSqSuffix, optimizer_->exp_avg_sq(i)));
  }
  const nlohmann::json& manifest = loaded.manifest;
  int64_t optimizer_step = 0;
  try {
    optimizer_step = manifest.at("optimizer").at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(loaded.path, ": manifest optimizer.step: ", e.what()));
  }
  MOETRAIN_RETURN_IF_ERROR(optimizer_->SetStep(optimizer_step));
  MOETRAIN_ASSIGN_OR_RETURN(DataPosition position, DataPosition::FromJson(manifest.value(
                                                       "data_position", nlohmann::json())));
  MOETRAIN_RETURN_IF_ERROR(data_->Restore(position));
  model_->ZeroGrads();
  step_ = loaded.step;
  tokens_seen_ = loaded.tokens_seen;
  if (observer != nullptr) {
    observer->OnMessage(absl::StrCat("resumed from ", loaded.path, " (step ", step_, ")"));
  }
  return absl::OkStatus();
}

nlohmann::json HuggingFaceConfig(const ModelConfig& c, int64_t seq_len) {
  const MoeConfig& m = c.moe;
  return {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.resolved_head_dim()},
      {"intermediate_size", c.ffn_dim},
      {"moe_intermediate_size", m.expert_ffn_dim},
      {"n_routed_experts", m.num_experts},
      {"num_experts_per_tok", m.top_k},
      {"n_shared_experts", m.num_shared_experts},
      {"first_k_dense_replace", c.first_dense_layers},
      {"scoring_func", m.score_function == ScoreFunction::kSigmoid ? "sigmoid" : "softmax"},
      {"norm_topk_prob", m.normalize_topk_weights},
      {"routed_scaling_factor", m.routed_scaling_factor},
      {"n_group", m.num_groups},
      {"topk_group", m.group_top_k},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"max_position_embeddings", seq_len},
      {"tie_word_embeddings", c.tie_embeddings},
      {"hidden_act", "silu"},
      {"moetrain_softmax_before_topk", m.softmax_before_topk},
      {"moetrain_expert_bias", m.expert_bias},
      {"moetrain_capacity_factor", m.capacity_factor},
  };
}

}  // namespace moetrain
