// The decoder-only MoE transformer: embedding, blocks (block.h), final RMSNorm, LM head and the
// next-token cross-entropy, with f32 master weights, their compute-dtype copies and f32 grads.
//
// One training step of a micro-batch: ForwardBackward (grads +=); after the optimizer has updated
// the masters, SyncComputeWeights refreshes the compute copies; ZeroGrads starts the next step.
// All parameters live in one flat f32 buffer (and their gradients in another, laid out alike), so
// that the optimizer and a data-parallel all-reduce can treat them as one vector.
//
// Expert parallel: built with an expert group of ep ranks, the model holds only its rank's
// routed experts, [ep_rank·E/ep, (ep_rank+1)·E/ep) of every MoE layer (the MoE layers exchange
// tokens with the other ranks); everything else is whole on every rank. Parameter names keep
// the global expert index, and Initialize gives every expert the values it has in the
// single-rank model of the same seed.
//
// Buffer layout, for gradient all-reduces that start while backward is still running: first
// the dense part (every parameter but the routed experts) in the order backward finishes it
// (LM head and final norm, blocks L-1 … 0, embedding), then the routed experts, blocks L-1 … 0.
// grad_stages() says which ranges each backward stage completes.
#ifndef MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_
#define MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "engine/model/block.h"
#include "engine/model/model_config.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/loss/lm_head_loss.h"

namespace moetrain {

// One parameter tensor in checkpoint order, by its Hugging Face name (ARCHITECTURE.md).
struct NamedParameter {
  std::string name;   // e.g. "model.layers.1.mlp.experts.3.up_proj.weight"
  TensorView value;   // f32 master, a contiguous range of the flat buffer
  TensorView grad;    // f32, same shape
  bool weight_decay;  // false for norms and the expert bias
  bool trainable;     // false for the expert bias (moved by UpdateExpertBiases, not the optimizer)
  bool expert;        // a routed expert's weight (held by its expert-parallel rank only)
};

// The parameters whose gradients one backward stage completes: two ranges of the flat buffers,
// in elements (empty ranges when begin == end). Stage 0 is the LM head and final norm, stage
// 1 + (L-1-l) block l, stage L+1 the embedding (also the tied LM head). The dense ranges of
// stages 0, 1, … tile [0, dense_size) in order; the expert ranges tile [dense_size, N).
struct GradStage {
  int64_t dense_begin = 0, dense_end = 0;    // every parameter but the routed experts
  int64_t expert_begin = 0, expert_end = 0;  // this rank's routed experts
};

// What backward finds of the forward's activations (train.recompute).
// In order of what it lets go of (the layout search relies on it).
enum class Recompute : uint8_t {
  // Every block keeps what its backward reads, in buffers of its own.
  kNone,
  // Each block keeps what is costly to compute again (the projections' and the attention core's
  // outputs, the experts' pre-activations and rows, the routing) and lets go of what is cheap:
  // the RMSNorm outputs, the SwiGLU outputs, the compute-dtype copies, and MLA's up-projected q, k
  // and v (as DeepSeek-V3 trains). Those live in scratch buffers all blocks share with their
  // backward scratch, and backward rebuilds them just before a block's backward
  // (TransformerBlock::Recompute; not for the block whose forward ran last), with the same ops on
  // the same kept inputs: the same bits. The attention core keeps no softmax (only its row
  // logsumexp), so there is none to drop. No exchange or routing runs again.
  kSelective,
  // Each block keeps only its input (the residual stream, which the model keeps anyway); all
  // blocks, MTP modules' included, share one set of buffers, and backward re-runs a block's forward
  // just before its backward (not for the block whose forward ran last). The re-run is the same
  // deterministic forward on the same input and weights, so it gives the same bits. An MoE
  // block's routing is kept per layer (the scores, top-k and permutation: T·(E + 3k) numbers, not
  // in the shared buffers) and used again, so the rows go where they went and the count
  // all-reduce is not repeated; with expert parallelism the dispatch and combine exchanges run
  // again rather than their (rows × D) results being kept, which would keep most of what
  // recompute frees. The re-run records no MoE statistics and no FP8 amaxes or saturation counts
  // (those of the first forward count once).
  kFull,
};
// "NONE", "FULL", "SELECTIVE" (the job spec's names).
const char* RecomputeName(Recompute recompute);
// The mode of such a name, in any case ("full", "Selective"); nullopt for any other text.
std::optional<Recompute> RecomputeFromName(std::string_view name);

// How ForwardBackward runs one micro-batch.
struct BackwardOptions {
  // Multiplies ∇(cross-entropy + aux + z losses) before it is added into the grads (> 0, e.g.
  // 1 / micro-batches).
  float loss_scale = 1.0f;
  // Called with s after backward stage s (grad_stages()) is done, in order; an error stops
  // backward and is returned. Null: nothing is called.
  std::function<absl::Status(int64_t stage)> on_stage_done;
  // A NaN/Inf loss still runs backward (the grads take the NaN) and is reported in the result
  // instead of as an error: ranks whose collectives must pair up keep in step.
  bool backward_through_nonfinite_loss = false;
};

struct StepResult {
  float loss = 0.0f;  // mean next-token cross-entropy
  // Multi-token prediction: the mean over the modules of each one's cross-entropy, unweighted
  // (model.mtp_loss_weight multiplies it in the objective); 0 without MTP.
  float mtp_loss = 0.0f;
  float aux_loss = 0.0f;             // Σ over MoE layers, already multiplied by the coefficient
  float z_loss = 0.0f;               // Σ over MoE layers, already multiplied by the coefficient
  int64_t tokens = 0;                // predicted tokens: B·S
  std::vector<MoeStats> moe_layers;  // one per MoE block, in layer order (MTP blocks last)
};

class Transformer {
 public:
  // InvalidArgument for an invalid config, a compute dtype other than f32 or bf16, or an expert
  // group whose size does not divide model.moe.num_experts. Parameters start at zero: call
  // Initialize, or write the masters (a checkpoint) and SyncComputeWeights. The communicators
  // in `parallel` must outlive the model. Parameters, gradients and activations live on ctx's
  // device, and every op runs there.
  // With `fp8`, the blocks' linear layers (attention projections, dense FFNs, routed and shared
  // experts) run their GEMMs in FP8 by that recipe (engine/fp8/); the router, attention core, LM
  // head and embeddings stay in the compute dtype. The model owns the recipe's state.
  // `recompute`: what the blocks keep for backward (Recompute).
  static absl::StatusOr<Transformer> Create(const ModelConfig& config, DType compute_dtype,
                                            const ExpertParallelConfig& parallel = {},
                                            const ExecContext& ctx = ExecContext::Cpu(),
                                            const std::optional<Fp8RecipeConfig>& fp8 = {},
                                            Recompute recompute = Recompute::kNone);

  const ModelConfig& config() const { return config_; }
  DType compute_dtype() const { return dtype_; }
  const ExecContext& context() const { return ctx_; }
  Recompute recompute() const { return recompute_; }
  // The bytes the activation buffers hold now (after a step: what forward kept for backward,
  // backward's scratch, the LM head's chunk and the MTP modules'), counted from their allocations,
  // shared buffers once. Parameters, gradients and FP8's transient operands are not included.
  int64_t activation_bytes() const;
  // The FP8 recipe's state (scales, amax histories, statistics); null without FP8. The trainer
  // ends each step on it (Fp8State::EndStep) and checkpoints it.
  Fp8State* fp8_state() const { return fp8_.get(); }

  // normal(0, init_std) for linear weights, embeddings and routers; ones for norms; zeros for
  // expert biases. Parameter i (in the single-rank model's parameters() order) draws from
  // Rng(seed, /*step=*/i, /*rank=*/0, kInitStream), so the result depends on the seed and the
  // architecture only, not on the expert-parallel layout. Also syncs the compute weights.
  absl::Status Initialize(uint64_t seed);
  static constexpr uint32_t kInitStream = 0x1417;

  // Refreshes the compute-dtype copies from the masters (nothing to do in f32).
  absl::Status SyncComputeWeights();
  absl::Status ZeroGrads();

  // tokens (B, S + 1 + mtp_depth) i32 with 1 ≤ S ≤ max_seq_len, on the CPU or the model's
  // device: inputs tokens[:, :S], targets tokens[:, 1:S+1]; MTP module k reads inputs
  // tokens[:, k:S+k] and targets tokens[:, k+1:S+k+1].
  // Adds loss_scale · ∇(cross-entropy + aux + z losses + mtp_loss_weight · mtp loss) into the
  // grads (loss_scale > 0, e.g.
  // 1 / micro-batches). The result reports the losses unscaled. A NaN or Inf loss is a
  // NonFiniteError (engine/core/status.h), with the grads partly accumulated.
  absl::StatusOr<StepResult> ForwardBackward(TensorView tokens, float loss_scale = 1.0f);
  // The same with every option; a NaN/Inf loss is a NonFiniteError unless
  // options.backward_through_nonfinite_loss.
  absl::StatusOr<StepResult> ForwardBackward(TensorView tokens, const BackwardOptions& options);
  // The main model's mean next-token cross-entropy only (NonFiniteError if NaN or Inf), from
  // tokens shaped as ForwardBackward's; grads untouched. FP8
  // statistics are not recorded, so evaluation does not feed the amax histories.
  absl::StatusOr<float> Evaluate(TensorView tokens);

  // b_e += rate·sign(mean(n) − n_e) per MoE layer, from tokens_per_expert (one (E) vector per
  // MoE layer, in layer order, summed over the step's micro-batches and all ranks). Nothing to
  // do (OK) unless config.moe.expert_bias.
  absl::Status UpdateExpertBiases(absl::Span<const std::vector<int64_t>> tokens_per_expert);

  std::vector<NamedParameter>& parameters() { return parameters_; }
  const std::vector<NamedParameter>& parameters() const { return parameters_; }
  // Every parameter (and zero padding between them): (N) f32.
  TensorView master_buffer() const { return masters_; }
  TensorView grad_buffer() const { return grads_; }
  // MoE blocks: the model's, then one per MTP module.
  int64_t num_moe_layers() const {
    return config_.num_layers - config_.first_dense_layers + config_.mtp_depth;
  }
  // This rank's routed experts: [first_local_expert, first_local_expert + num_local_experts).
  int64_t first_local_expert() const { return first_local_expert_; }
  int64_t num_local_experts() const { return num_local_experts_; }
  // In backward order; L + 2 stages.
  const std::vector<GradStage>& grad_stages() const { return grad_stages_; }
  // Elements [0, dense_size) of the flat buffers are the dense part.
  int64_t dense_size() const { return dense_size_; }

 private:
  Transformer(const ModelConfig& config, DType dtype, const ExecContext& ctx)
      : config_(config),
        dtype_(dtype),
        ctx_(ctx),
        mtp_eh_proj_(ctx),
        mtp_workspace_(kMtpBuffers * static_cast<int>(std::max<int64_t>(config.mtp_depth, 0)),
                       ctx.allocator()),
        workspace_(kNumBuffers, ctx.allocator()),
        lm_head_workspace_(ctx) {}

  // Stage `stage` of backward is done: calls options.on_stage_done if set.
  static absl::Status StageDone(const BackwardOptions& options, int64_t stage);

  // Block l's forward on x into y (the stream or an MTP module's), noting which block ran last;
  // `rerun` as TransformerBlock::Forward's.
  absl::Status BlockForward(int64_t l, TensorView x, TensorView y, MoeStats* stats,
                            bool rerun = false);
  // Block l's scratch (kSelective) or its whole forward (kFull, same x and y) again, unless its
  // forward ran last; nothing for kNone.
  absl::Status RecomputeBlock(int64_t l, TensorView x, TensorView y);

  // Builds the flat buffers and every view into them (parameters.cc).
  absl::Status BuildParameters();
  // Checks tokens and splits them into inputs and targets on the device; T = B·S.
  absl::Status PrepareTokens(TensorView tokens);
  // Embedding, blocks and final norm; the final norm's output is in final_normed_.
  absl::Status ForwardToFinalNorm(StepResult* result);
  ops::LmHeadLossArgs LmHeadArgs() const;
  // Multi-token prediction (mtp.cc): every module's forward and loss, then its backward, after
  // the main LM head. Adds the MTP losses and MoE statistics to `result` and the gradient of the
  // final norm's output (the first module's input) into d_final (T, D) f32, which holds the LM
  // head's.
  absl::Status MtpForwardBackward(float loss_scale, StepResult* result, TensorView d_final);

  ModelConfig config_;
  DType dtype_;
  ExecContext ctx_;
  std::unique_ptr<Fp8State> fp8_;  // heap: the blocks hold its address across moves
  Recompute recompute_ = Recompute::kNone;
  int64_t last_forward_ = -1;  // the block whose Forward ran last, if its buffers still hold it

  Tensor masters_;  // (N) f32
  Tensor grads_;    // (N) f32
  Tensor compute_;  // (N) act copy of masters_ (bf16 only; f32 computes on the masters)
  std::vector<NamedParameter> parameters_;
  enum class Init : uint8_t { kNormal, kOnes, kZeros };
  std::vector<Init> parameter_init_;  // one per parameters_ entry
  // One per parameters_ entry: its index in the single-rank model, which keys its init stream.
  std::vector<int64_t> parameter_init_index_;
  int64_t first_local_expert_ = 0;
  int64_t num_local_experts_ = 0;
  std::vector<GradStage> grad_stages_;
  int64_t dense_size_ = 0;

  // Views of the model's tensors: masters (f32), compute copies (act) and grads (f32).
  TensorView embed_;       // (V, D) f32
  TensorView embed_grad_;  // (V, D)
  TensorView final_norm_;  // (D) f32
  TensorView final_norm_grad_;
  TensorView lm_head_;                    // (V, D) act: lm_head, or the embedding when tied
  TensorView lm_head_grad_;               // (V, D): lm_head's grad, or the embedding's when tied
  std::vector<TransformerBlock> blocks_;  // the model's num_layers, then one per MTP module
  std::vector<BlockWeights> block_weights_;
  std::vector<BlockGrads> block_grads_;
  // An MTP module's own parameters besides its block (masters f32 but eh_proj, a compute copy).
  struct MtpWeights {
    TensorView enorm;        // (D): RMSNorm of the embedding of token t+k
    TensorView hnorm;        // (D): RMSNorm of the previous depth's hidden state
    TensorView eh_proj;      // (D, 2D): [enorm output | hnorm output] → the block's input
    TensorView shared_norm;  // (D): shared_head.norm, before the shared LM head
  };
  std::vector<MtpWeights> mtp_weights_, mtp_grads_;  // one per module
  Linear mtp_eh_proj_;                               // in the compute dtype, never FP8
  static constexpr int kMtpBuffers = 20;             // mtp.cc's per module
  Workspace mtp_workspace_;                          // mtp.cc's buffers, per module

  // Activations of the last forward.
  int64_t batch_ = 0, seq_len_ = 0;
  TensorView windows_;     // (B, S + 1 + mtp_depth) i32 on the model's device
  TensorView inputs_;      // (T) i32
  TensorView targets_;     // (T) i32
  TensorView residual_;    // (L + 1, T, D) f32: the stream entering each block, and after the last
  TensorView final_rstd_;  // (T) f32
  TensorView final_normed_;  // (T, D) act
  // clang-format off
  enum Buffer { kTokens, kInputs, kTargets, kResidual, kFinalRstd, kFinalNormed, kDFinal,
                kDResidual, kBiasCounts, kNumBuffers };
  // clang-format on
  Workspace workspace_;
  ops::LmHeadLossWorkspace lm_head_workspace_;
};

// Model FLOPs of one training token (forward and backward) at sequence length `seq_len`:
// 6 × the matmul parameters a token activates (attention projections, dense FFNs, routers, its
// top-k and shared experts, LM head) + the causal attention core, 6·H·Dh·(S + 1) per layer (the
// query at position p attends p + 1 keys). For MFU.
double TrainingFlopsPerToken(const ModelConfig& config, int64_t seq_len);

// The FP8 state slots (Fp8State) that Create registers with a recipe on, the same on every rank:
// 3 (input, weight, grad) per linear layer of every block, and per *global* expert for the routed
// experts' two grouped layers. A double: a hostile config's count overflows int64.
double Fp8SlotCount(const ModelConfig& config);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_
