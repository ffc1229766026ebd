// The decoder-only MoE transformer: embedding, blocks (block.h), final RMSNorm, LM head and the
// next-token cross-entropy, with f32 master weights, their compute-dtype copies and f32 grads.
//
// One training step of a micro-batch: ForwardBackward (grads +=); after the optimizer has updated
// the masters, SyncComputeWeights refreshes the compute copies; ZeroGrads starts the next step.
// All parameters live in one flat f32 buffer (and their gradients in another, laid out alike), so
// that the optimizer and a data-parallel all-reduce can treat them as one vector.
#ifndef MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_
#define MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/core/tensor.h"
#include "engine/model/block.h"
#include "engine/model/layers.h"
#include "engine/model/model_config.h"
#include "engine/moe/moe_layer.h"

namespace moetrain {

// One parameter tensor in checkpoint order, by its Hugging Face name (ARCHITECTURE.md).
struct NamedParameter {
  std::string name;   // e.g. "model.layers.1.mlp.experts.3.up_proj.weight"
  TensorView value;   // f32 master, a contiguous range of the flat buffer
  TensorView grad;    // f32, same shape
  bool weight_decay;  // false for norms and the expert bias
  bool trainable;     // false for the expert bias (moved by UpdateExpertBiases, not the optimizer)
};

struct StepResult {
  float loss = 0.0f;                 // mean next-token cross-entropy
  float aux_loss = 0.0f;             // Σ over MoE layers, already multiplied by the coefficient
  float z_loss = 0.0f;               // Σ over MoE layers, already multiplied by the coefficient
  int64_t tokens = 0;                // predicted tokens: B·S
  std::vector<MoeStats> moe_layers;  // one per MoE block, in layer order
};

class Transformer {
 public:
  // InvalidArgument for an invalid config or a compute dtype other than f32 or bf16. Parameters
  // start at zero: call Initialize, or write the masters (a checkpoint) and SyncComputeWeights.
  static absl::StatusOr<Transformer> Create(const ModelConfig& config, DType compute_dtype);

  const ModelConfig& config() const { return config_; }
  DType compute_dtype() const { return dtype_; }

  // normal(0, init_std) for linear weights, embeddings and routers; ones for norms; zeros for
  // expert biases. Parameter i (in parameters() order) draws from
  // Rng(seed, /*step=*/i, /*rank=*/0, kInitStream), so the result depends on the seed and the
  // architecture only. Also syncs the compute weights.
  absl::Status Initialize(uint64_t seed);
  static constexpr uint32_t kInitStream = 0x1417;

  // Refreshes the compute-dtype copies from the masters (nothing to do in f32).
  void SyncComputeWeights();
  void ZeroGrads();

  // tokens (B, S+1) i32 with 1 ≤ S ≤ max_seq_len: inputs tokens[:, :S], targets tokens[:, 1:].
  // Adds loss_scale · ∇(cross-entropy + aux + z losses) into the grads (loss_scale > 0, e.g.
  // 1 / micro-batches). The result reports the losses unscaled. A NaN or Inf loss is a
  // NonFiniteError (engine/core/status.h), with the grads partly accumulated.
  absl::StatusOr<StepResult> ForwardBackward(TensorView tokens, float loss_scale = 1.0f);
  // The mean next-token cross-entropy only (NonFiniteError if NaN or Inf); grads untouched.
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
  int64_t num_moe_layers() const { return config_.num_layers - config_.first_dense_layers; }

 private:
  Transformer(const ModelConfig& config, DType dtype) : config_(config), dtype_(dtype) {}

  // Builds the flat buffers and every view into them (parameters.cc).
  void BuildParameters();
  // Checks tokens and splits them into inputs and targets; T = B·S.
  absl::Status PrepareTokens(TensorView tokens);
  // Embedding, blocks and final norm; the final norm's output is in final_normed_.
  absl::Status ForwardToFinalNorm(float loss_scale, StepResult* result);
  LmHeadLossArgs LmHeadArgs() const;

  ModelConfig config_;
  DType dtype_;
  float loss_scale_ = 1.0f;  // of the last ForwardBackward (the MoE layers are set up for it)

  Tensor masters_;  // (N) f32
  Tensor grads_;    // (N) f32
  Tensor compute_;  // (N) act copy of masters_ (bf16 only; f32 computes on the masters)
  std::vector<NamedParameter> parameters_;
  enum class Init : uint8_t { kNormal, kOnes, kZeros };
  std::vector<Init> parameter_init_;  // one per parameters_ entry

  // Views of the model's tensors: masters (f32), compute copies (act) and grads (f32).
  TensorView embed_;       // (V, D) f32
  TensorView embed_grad_;  // (V, D)
  TensorView final_norm_;  // (D) f32
  TensorView final_norm_grad_;
  TensorView lm_head_;       // (V, D) act: lm_head, or the embedding when tied
  TensorView lm_head_grad_;  // (V, D): lm_head's grad, or the embedding's when tied
  std::vector<TransformerBlock> blocks_;
  std::vector<BlockWeights> block_weights_;
  std::vector<BlockGrads> block_grads_;

  // Activations of the last forward.
  int64_t batch_ = 0, seq_len_ = 0;
  TensorView inputs_;      // (T) i32
  TensorView targets_;     // (T) i32
  TensorView residual_;    // (L + 1, T, D) f32: the stream entering each block, and after the last
  TensorView final_rstd_;  // (T) f32
  TensorView final_normed_;  // (T, D) act
  // clang-format off
  enum Buffer { kInputs, kTargets, kResidual, kFinalRstd, kFinalNormed, kDFinal, kDResidual,
                kNumBuffers };
  // clang-format on
  Tensor buffers_[kNumBuffers];
  LmHeadLossWorkspace lm_head_workspace_;
};

// Model FLOPs of one training token (forward and backward) at sequence length `seq_len`:
// 6 × the matmul parameters a token activates (attention projections, dense FFNs, routers, its
// top-k and shared experts, LM head) + the causal attention core, 6·H·Dh·(S + 1) per layer (the
// query at position p attends p + 1 keys). For MFU.
double TrainingFlopsPerToken(const ModelConfig& config, int64_t seq_len);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_TRANSFORMER_H_
