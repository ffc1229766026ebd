// The training loop of one rank: micro-batches, gradient accumulation, clipping, AdamW, the
// learning-rate schedule, the expert-bias update, evaluation and checkpoints, with exact resume.
// Every rank of a job runs it, in lock-step (parallel.h: W = dp × ep ranks).
//
// One optimizer step s (0-based), M = batch_size / micro_batch_size micro-batches:
//   for each micro-batch: this rank's micro_batch_size / W sequences of it, ForwardBackward with
//     grads scaled by 1 / (M·W), MoE token counts summed; during the last one's backward (every
//     one's with sharded gradients) the grads are summed over the ranks (grad_sync.h), giving the
//     single-process mean gradient;
//   losses, token counts and the expert load are summed over the ranks, so that every rank
//     reports the global step;
//   a NaN/Inf loss or grad on any rank fails the job with an error naming the step on every rank,
//     or skips the update everywhere when skip_nonfinite_steps (the step still counts and its
//     data is consumed);
//   clip to grad_clip (the global norm: dense grads once plus every expert shard), AdamW at
//     LearningRate(schedule, s), expert-bias update from the global token counts, refresh the
//     compute weights, zero the grads.
// Every step depends only on the parameters, the optimizer state and the data position, all in
// the checkpoint, so N steps straight and N/2 + resume + N/2 give bit-identical losses and weights
// (for a fixed world layout; resumed on another, the steps after differ by float rounding). With
// one micro-batch per step, any layout of the same job computes the single-process step up to
// float rounding; with several, rank r's share of micro-batch m is not the single process's
// micro-batch m, which changes only the aux loss (its token counts are per micro-batch).
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
#include "engine/backend/exec_context.h"
#include "engine/comm/communicator.h"
#include "engine/core/device.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "engine/train/checkpoint.h"
#include "engine/train/data.h"
#include "engine/train/fp8_report.h"
#include "engine/train/grad_sync.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/optimizer.h"
#include "engine/train/parallel.h"
#include "engine/train/step_stats.h"

namespace moetrain {

struct TrainerConfig {
  std::string job_id = "job";  // names the checkpoint folder <checkpoint_dir>/<job_id>
  ModelConfig model;
  DataConfig data;  // data.batch_size: sequences per optimizer step, all ranks; data.seq_len: S
  ParallelConfig parallel;
  // The device this rank computes on: parameters, grads, optimizer state and activations live
  // there. A CUDA device needs a build with CUDA and a usable GPU (else Validate refuses it).
  // Checkpoints do not record it: a job's checkpoint resumes on any device.
  Device device = Device::Cpu();
  DType compute_dtype = DType::kF32;
  // FP8 GEMMs by this recipe (compute_dtype must be bf16); nullopt = none.
  std::optional<Fp8RecipeConfig> fp8;
  // What the blocks keep for backward (train.recompute; engine/model/transformer.h).
  Recompute recompute = Recompute::kNone;
  int64_t steps = 100;  // optimizer steps in all (a resumed job continues to it)
  // Sequences per forward/backward over all ranks (each rank takes 1/W of them); 0 =
  // data.batch_size.
  int64_t micro_batch_size = 0;
  AdamWConfig optimizer;
  LrScheduleConfig schedule;  // total_steps is taken from `steps` when 0
  double grad_clip = 1.0;     // global-norm clip; ≤ 0 disables
  uint64_t seed = 0;          // parameter initialisation
  int64_t log_every = 10;     // report every N steps (and the first and last); ≥ 1
  int64_t eval_every = 0;     // evaluate every N steps (and after the last); 0 = never
  int64_t eval_batches = 0;   // eval batches per evaluation; 0 = the whole held-out set
  bool skip_nonfinite_steps = false;
  std::string checkpoint_dir;    // empty = no checkpoints
  std::string init_from;         // a step directory whose model starts the job (InitializeFrom)
  int64_t checkpoint_every = 0;  // steps between checkpoints (and after the last); 0 = only last
  int keep_last = 3;             // complete checkpoints kept; 0 = every one
  // Run returns after this step (the steps done, as StepReport::step counts them), with a
  // checkpoint of it, as a stop does; everything else (the schedule, the data order) stays that
  // of `steps`, so that a resume continues as if there had been no stop. 0 = train to `steps`.
  int64_t stop_after_step = 0;

  // OK, or InvalidArgument naming the field (and validates model, data, parallel, optimizer,
  // schedule).
  absl::Status Validate() const;

  // The micro-batches of one optimizer step (of a valid config).
  int64_t micro_batches() const {
    return data.batch_size / (micro_batch_size > 0 ? micro_batch_size : data.batch_size);
  }
};

// What one logged step reports. Global values: every rank reports the same numbers (but
// step_seconds), those the single-process run of the job would.
struct StepReport {
  int64_t step = 0;  // optimizer steps done, after this one
  double loss = 0;   // mean next-token cross-entropy over the step's tokens
  double aux_loss = 0, z_loss = 0;
  std::optional<double> mtp_loss;  // mean MTP cross-entropy, unweighted; only with MTP
  std::optional<double> eval_loss;
  double lr = 0;
  double grad_norm = 0;                       // before clipping
  double tokens_per_s = 0;                    // the step's tokens, all ranks, over step_seconds
  double step_seconds = 0;                    // wall time of the step on this rank
  double expert_load_max_over_mean = 0;       // the worst MoE layer this step
  std::vector<double> expert_load_per_layer;  // busiest expert over the mean, per MoE layer
  // (MoE layers, E) row-major: tokens routed to each expert, all ranks, before capacity drops.
  std::vector<int64_t> expert_tokens;
  int64_t dropped_tokens = 0;
  int64_t tokens_seen = 0;
  bool skipped = false;  // a non-finite step whose update was skipped
  // This rank's device memory held by tensors at the end of the step, and the most held at once
  // since the trainer started (the caching allocator's view); 0 on the CPU.
  int64_t device_memory_bytes = 0;
  int64_t device_memory_peak_bytes = 0;
  // FP8 statistics of the step (fp8_report.h), empty unless the model trains in FP8.
  std::vector<Fp8LayerStats> fp8_layers;
  std::vector<Fp8ExpertStats> fp8_experts;  // the routed experts, (layer, expert) ascending
};

// Wall time of one optimizer step's phases on this rank, by the host's steady clock (on a GPU,
// device work queued in one phase may still run during the next; the step's end waits for all of
// it, in `optimizer`).
struct StepPhaseSeconds {
  // Every micro-batch's forward, the loss and its gradient at the LM head (one fused op), the
  // multi-token prediction modules' forward and backward, and the final norm's backward: all
  // that comes before the gradient enters the last block.
  double forward = 0;
  // The rest of the backward pass, gradient sums of the last micro-batch started as their
  // buckets fill (grad_sync.h) and the expert-parallel all-to-alls included.
  double backward = 0;
  // Waiting for the gradient sums to finish, and summing the step's losses and token counts over
  // the ranks.
  double communication = 0;
  // The gradient norm, clipping, AdamW, the expert-bias update, the compute weights, zeroing the
  // grads, FP8 scales, and waiting for the device to finish the step.
  double optimizer = 0;
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
  // After every step, logged or not (OnStep comes after it on logged steps).
  virtual void OnStepPhases(const StepPhaseSeconds& phases) {}
  virtual void OnCheckpoint(const CheckpointReport& report) {}
  // Notes worth showing a person: a resume, a skipped corrupt checkpoint, a skipped step.
  virtual void OnMessage(const std::string& message) {}
  // Asked before each checkpoint is written; an error skips that one checkpoint (its message is
  // passed to OnMessage) and training goes on. A worker whose hold on the job may have lapsed
  // must not write into the job's directory. Asked on every rank; when any rank refuses, every
  // rank skips the checkpoint.
  virtual absl::Status BeforeCheckpoint(int64_t step) { return absl::OkStatus(); }
};

// What Run does when asked to stop between two steps.
enum class StopRequest {
  kNone,
  kCheckpointAndStop,  // save a checkpoint of the current step, then return (SIGTERM, Ctrl-C)
  kStop,               // return at once, without a checkpoint (the job was cancelled)
};

// Every rank of a job makes the same calls: Create, Resume, Run, Evaluate and SaveCheckpoint are
// collectives over the world communicator.
class Trainer {
 public:
  // Builds the parallel groups (over `world`, null = a single-rank LocalCommunicator), the model
  // with this rank's experts (initialised from config.seed), the optimizer and the data loader.
  // InvalidArgument when world->size() is not config.parallel.world_size().
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerConfig& config, std::shared_ptr<Communicator> world = nullptr);

  // Continues from the newest checkpoint of the job that is good on every rank. NotFound when
  // there is none; each newer damaged checkpoint passed over is reported through `observer`
  // (may be null). FailedPrecondition when the newest readable one holds another model. A
  // checkpoint of any dp × ep layout and sharding resumes on any other (tensors keep their global
  // names: each rank reads the files that hold its experts, FilesToRead); what it restores is
  // the same bits whatever the layout. After an error other than NotFound
  // the trainer may hold part of a checkpoint: make a new one rather than train on.
  absl::Status Resume(TrainObserver* observer);

  // Replaces the model's initial weights with those of the checkpoint step `step_dir` (any
  // layout: each rank reads what it holds), for a job that starts without a checkpoint of its
  // own. Its model_config must equal this trainer's model (FailedPrecondition otherwise, naming
  // the step); a missing or damaged step is NotFound or DataLoss. The optimizer state, step and
  // data position stay fresh.
  absl::Status InitializeFrom(const std::string& step_dir);

  // Trains until config.steps (or config.stop_after_step), or until *stop asks otherwise
  // (checked between steps, and agreed by the ranks: when any rank asks for kCheckpointAndStop
  // every rank does that, else when any asks for kStop every rank stops). Saves a checkpoint
  // every checkpoint_every steps and at the end (with a checkpoint dir), including the ends that
  // stop_after_step and kCheckpointAndStop ask for, but not the one kStop asks for.
  absl::Status Run(TrainObserver* observer, const std::atomic<StopRequest>* stop = nullptr);

  int64_t step() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  const TrainerConfig& config() const { return config_; }
  // This rank's model: the dense weights and its own experts.
  Transformer& model() { return *model_; }
  const Transformer& model() const { return *model_; }
  const ParallelGroups& groups() const { return *groups_; }
  const GradSync& grad_sync() const { return *grad_sync_; }
  // This rank's AdamW: over the trainable parameters, or its pieces of them when sharded.
  const AdamW& optimizer() const { return *optimizer_; }
  // The best possible loss of synthetic data (its entropy rate), if the data is synthetic.
  std::optional<double> best_possible_loss() const;

  // Mean next-token loss over the held-out data (at most config.eval_batches batches), over
  // every rank's share of it.
  absl::StatusOr<double> Evaluate();
  // Writes a checkpoint of the current state (trainer_checkpoint.cc): every rank writes what
  // only it holds into one step directory.
  absl::StatusOr<CheckpointReport> SaveCheckpoint();

 private:
  explicit Trainer(const ExecContext& ctx) : ctx_(ctx) {}
  // One optimizer step; its phase times into `phases`.
  absl::StatusOr<StepReport> TrainStep(StepPhaseSeconds* phases);
  // Forward and backward of the step's micro-batches of `batch` into `stats`; the grads are then
  // summed over the ranks. Times the forward, backward and communication phases into `phases`.
  absl::Status ForwardBackward(const Tensor& batch, StepStats* stats, StepPhaseSeconds* phases);
  // ‖g‖₂ over every rank's grads: the dense ones once (every rank holds them alike) and each
  // expert shard once.
  absl::StatusOr<double> GlobalGradNorm();
  // Clip, AdamW at LR(step), the expert-bias update from the step's global counts, and the
  // compute copies of the weights.
  absl::Status UpdateWeights(double grad_norm, const StepStats& stats, StepReport* report);
  // The stop request every rank follows (see Run).
  absl::StatusOr<StopRequest> AgreeOnStop(const std::atomic<StopRequest>* stop);
  // SaveCheckpoint when every rank's observer allows it; true when one was written.
  absl::StatusOr<bool> MaybeSaveCheckpoint(TrainObserver* observer);
  std::string CheckpointRoot() const;
  // The rank files of a checkpoint written with `written_ep` expert-parallel ranks that hold this
  // rank's tensors: rank 0's (the dense part) and those whose experts overlap this rank's.
  CheckpointReadOptions FilesToRead(int written_ep) const;
  // Resume's part after the ranks agreed on a step: copies it into the model, optimizer, data.
  absl::Status RestoreFrom(const LoadedCheckpoint& loaded);
  // SaveCheckpoint's phases (trainer_checkpoint.cc): rank 0 makes the temporary step directory
  // and every rank learns its name; each first replica writes its shard and every rank learns
  // what was written; rank 0 commits (and prunes) once all succeeded and tells the others.
  absl::StatusOr<std::string> BeginCheckpointOnRanks();
  struct ShardReports {
    std::vector<int64_t> words;  // every rank's report of its files, as integers (AllGather)
    absl::Status written;        // this rank's own write
  };
  // WriteShard's result is an error only when the ranks could not exchange their reports.
  absl::StatusOr<ShardReports> WriteShard(const std::string& tmp_dir,
                                          const CheckpointContents& contents);
  absl::StatusOr<std::string> CommitCheckpointOnRanks(const std::string& tmp_dir,
                                                      const CheckpointContents& contents,
                                                      ShardReports shards);
  // What this rank's shard of a checkpoint of the current state holds. `moments`: the whole flat
  // m and v GatherMoments made, or null for the optimizer's own (unsharded, f32).
  CheckpointContents CheckpointContentsOfRank(const std::vector<Tensor>* moments) const;
  // Sharded optimizer (trainer_sharding.cc). Whether the AdamW state is sharded over the replicas.
  bool sharded() const { return config_.parallel.sharding != Sharding::kNone; }
  // Whether a checkpoint gathers the moments (GatherMoments): sharded, or not f32.
  bool gathers_moments() const {
    return sharded() || config_.optimizer.moment_dtype != DType::kF32;
  }
  // Every rank: the whole m and v in f32, as two host tensors laid out as the flat master buffer
  // (every rank's pieces gathered through the gradient buckets' groups), for a checkpoint.
  absl::StatusOr<std::vector<Tensor>> GatherMoments();
  // This rank's pieces of m and v from a checkpoint's whole f32 moments.
  absl::Status RestoreMomentPieces(const LoadedCheckpoint& loaded);
  // The first replica of each expert shard (dp_rank 0) writes it; rank 0 the dense part too.
  bool WritesShard() const { return groups_->data_rank() == 0; }

  ExecContext ctx_;
  TrainerConfig config_;
  // Declared before the model, whose MoE layers hold pointers to its communicators.
  std::unique_ptr<ParallelGroups> groups_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<GradSync> grad_sync_;
  std::vector<Parameter> trainable_;        // the optimizer's view of the model's trainable tensors
  std::vector<Parameter> trainable_dense_;  // the part every rank holds
  std::vector<Parameter> trainable_experts_;  // this rank's routed experts
  // What this rank's AdamW updates: trainable_, or with a sharded optimizer its pieces of it
  // (pieces_[i].part), those GradSync::OwnedRanges holds the summed grads of. pieces_[i] says
  // which parameter and where optimizer parameter i is (unsharded: the whole parameter i).
  std::vector<Parameter> updated_;
  std::vector<ParameterPiece> pieces_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DataLoader> data_;
  int64_t step_ = 0;
  int64_t tokens_seen_ = 0;
};

// Copies a checkpoint's model tensors into `model`'s masters (by parameter name, f32, exact
// shapes) and refreshes its compute weights; DataLoss naming the checkpoint and the tensor when
// one is missing or mis-shaped. Tensors that are not in `loaded` are read from the step's other
// model files (verified), so that a model can be loaded whole from a sharded checkpoint (moetrain
// eval).
absl::Status RestoreModelParameters(const LoadedCheckpoint& loaded, Transformer* model);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_TRAINER_H_
