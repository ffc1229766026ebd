// The training loop of one rank: micro-batches, gradient accumulation, clipping, AdamW, the
// learning-rate schedule, the expert-bias update, evaluation and checkpoints, with exact resume.
//
// One optimizer step s (0-based):
//   for each of batch_size / micro_batch_size micro-batches: ForwardBackward, grads scaled by
//     1 / micro-batches, MoE token counts summed;
//   a NaN/Inf loss or grad fails the job with an error naming the step, or skips the update when
//     skip_nonfinite_steps (the step still counts and its data is consumed);
//   clip to grad_clip (global norm), AdamW at LearningRate(schedule, s), expert-bias update,
//   refresh the compute weights, zero the grads.
// Every step depends only on the parameters, the optimizer state and the data position, all in
// the checkpoint, so N steps straight and N/2 + resume + N/2 give bit-identical losses and weights.
#ifndef MOETRAIN_ENGINE_TRAIN_TRAINER_H_
#define MOETRAIN_ENGINE_TRAIN_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "engine/train/checkpoint.h"
#include "engine/train/data.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/optimizer.h"

namespace moetrain {

struct TrainerConfig {
  std::string job_id = "job";  // names the checkpoint folder <checkpoint_dir>/<job_id>
  ModelConfig model;
  DataConfig data;  // data.batch_size: sequences per optimizer step; data.seq_len: S
  DType compute_dtype = DType::kF32;
  int64_t steps = 100;           // optimizer steps in all (a resumed job continues to it)
  int64_t micro_batch_size = 0;  // sequences per forward/backward; 0 = data.batch_size
  AdamWConfig optimizer;
  LrScheduleConfig schedule;  // total_steps is taken from `steps` when 0
  double grad_clip = 1.0;     // global-norm clip; ≤ 0 disables
  uint64_t seed = 0;          // parameter initialisation
  int64_t log_every = 10;     // report every N steps (and the first and last); ≥ 1
  int64_t eval_every = 0;     // evaluate every N steps (and after the last); 0 = never
  int64_t eval_batches = 0;   // eval batches per evaluation; 0 = the whole held-out set
  bool skip_nonfinite_steps = false;
  std::string checkpoint_dir;    // empty = no checkpoints
  int64_t checkpoint_every = 0;  // steps between checkpoints (and after the last); 0 = only last
  int keep_last = 3;             // complete checkpoints kept; 0 = every one

  // OK, or InvalidArgument naming the field (and validates model, data, optimizer, schedule).
  absl::Status Validate() const;
};

// What one logged step reports.
struct StepReport {
  int64_t step = 0;  // optimizer steps done, after this one
  double loss = 0;   // mean next-token cross-entropy over the step's tokens
  double aux_loss = 0, z_loss = 0;
  std::optional<double> eval_loss;
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_s = 0;
  double step_seconds = 0;               // wall time of the step on this rank
  double expert_load_max_over_mean = 0;  // the worst MoE layer this step
  std::vector<double> expert_load_per_layer;  // busiest expert over the mean, per MoE layer
  int64_t dropped_tokens = 0;
  int64_t tokens_seen = 0;
  bool skipped = false;  // a non-finite step whose update was skipped
};

// A checkpoint the trainer wrote.
struct CheckpointReport {
  int64_t step = 0;
  std::string path;  // the step directory
  int64_t tokens_seen = 0;
  double write_seconds = 0;  // writing it, pruning older ones included
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void OnStep(const StepReport& report) {}
  virtual void OnCheckpoint(const CheckpointReport& report) {}
  // Notes worth showing a person: a resume, a skipped corrupt checkpoint, a skipped step.
  virtual void OnMessage(const std::string& message) {}
  // Asked before each checkpoint is written; an error skips that one checkpoint (its message is
  // passed to OnMessage) and training goes on. A worker whose hold on the job may have lapsed
  // must not write into the job's directory.
  virtual absl::Status BeforeCheckpoint(int64_t step) { return absl::OkStatus(); }
};

// What Run does when asked to stop between two steps.
enum class StopRequest {
  kNone,
  kCheckpointAndStop,  // save a checkpoint of the current step, then return (SIGTERM, Ctrl-C)
  kStop,               // return at once, without a checkpoint (the job was cancelled)
};

class Trainer {
 public:
  // Builds the model (initialised from config.seed), the optimizer and the data loader.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainerConfig& config, int rank = 0,
                                                         int world_size = 1);

  // Continues from the newest good checkpoint of the job. NotFound when there is none; each
  // newer damaged checkpoint passed over is reported through `observer` (may be null).
  absl::Status Resume(TrainObserver* observer);

  // Trains until config.steps, or until *stop asks otherwise (checked between steps). Saves a
  // checkpoint every checkpoint_every steps and at the end (with a checkpoint dir), including
  // the end that kCheckpointAndStop asks for, but not the one kStop asks for.
  absl::Status Run(TrainObserver* observer, const std::atomic<StopRequest>* stop = nullptr);

  int64_t step() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  const TrainerConfig& config() const { return config_; }
  Transformer& model() { return *model_; }
  // The best possible loss of synthetic data (its entropy rate), if the data is synthetic.
  std::optional<double> best_possible_loss() const;

  // Mean next-token loss over the held-out data (at most config.eval_batches batches).
  absl::StatusOr<double> Evaluate();
  // Writes a checkpoint of the current state.
  absl::StatusOr<CheckpointReport> SaveCheckpoint();

 private:
  Trainer() = default;
  absl::StatusOr<StepReport> TrainStep();
  // SaveCheckpoint when the observer allows it; true when one was written.
  absl::StatusOr<bool> MaybeSaveCheckpoint(TrainObserver* observer);
  std::string CheckpointRoot() const;

  TrainerConfig config_;
  int rank_ = 0;
  int world_size_ = 1;
  std::unique_ptr<Transformer> model_;
  std::vector<Parameter> trainable_;  // the optimizer's view of the model's trainable tensors
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DataLoader> data_;
  int64_t step_ = 0;
  int64_t tokens_seen_ = 0;
};

// Copies a checkpoint's model tensors into `model`'s masters (by parameter name, f32, exact
// shapes) and refreshes its compute weights; DataLoss naming the checkpoint and the tensor when
// one is missing or mis-shaped.
absl::Status RestoreModelParameters(const LoadedCheckpoint& loaded, Transformer* model);

// The Hugging Face config.json of a model (DeepSeek-V3 key names, plus moetrain_* keys for what
// they do not cover).
nlohmann::json HuggingFaceConfig(const ModelConfig& config, int64_t seq_len);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_TRAINER_H_
