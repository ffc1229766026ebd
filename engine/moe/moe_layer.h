// One Mixture-of-Experts FFN layer: route, permute, grouped SwiGLU experts, combine; and back.
//
//   out_t = Σ_j g_{t,j} · Expert_{e_{t,j}}(x_t) + Shared(x_t)
//   Expert_e(x) = (silu(x·G_eᵀ) ⊙ (x·U_eᵀ))·D_eᵀ,  Shared likewise with width S·F.
//
// Dropless by default: every (token, slot) pair is computed, with ragged per-expert batches and no
// padding. With a capacity factor cf > 0, expert e keeps at most C = ⌈cf·T·k/E⌉ of its pairs
// (by drop_policy: the C with the largest combine weight g, ties to the earlier token; or the
// first C in (token, slot) order); a dropped pair contributes zero and gets no gradient.
//
// Precision: x, out, d_out, d_x and the expert weights are in the compute dtype (f32 or bf16);
// GEMMs accumulate in f32; the router runs in f32 (x is widened); gradients are f32.
#ifndef MOETRAIN_ENGINE_MOE_MOE_LAYER_H_
#define MOETRAIN_ENGINE_MOE_MOE_LAYER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/permutation.h"
#include "engine/moe/router.h"

namespace moetrain {

// Read-only parameters. E experts, D hidden size, F expert_ffn_dim, S shared experts.
struct MoeWeights {
  TensorView router;          // (E, D) f32
  TensorView expert_bias;     // (E) f32; only when config.expert_bias
  TensorView expert_gate_up;  // (E, 2F, D) compute dtype: rows [0, F) gate, [F, 2F) up
  TensorView expert_down;     // (E, D, F) compute dtype
  TensorView shared_gate_up;  // (2·S·F, D) compute dtype; only when S > 0
  TensorView shared_down;     // (D, S·F) compute dtype; only when S > 0
};

// Parameter gradients, f32, same shapes as the weights. Backward adds into them (+=), so that
// micro-batches accumulate; zero them once per optimizer step.
struct MoeGrads {
  TensorView router;          // (E, D)
  TensorView expert_gate_up;  // (E, 2F, D)
  TensorView expert_down;     // (E, D, F)
  TensorView shared_gate_up;  // (2·S·F, D); only when S > 0
  TensorView shared_down;     // (D, S·F); only when S > 0
};

struct MoeStats {
  std::vector<int64_t> tokens_per_expert;  // (E) pairs routed to each expert, before drops
  int64_t dropped_tokens = 0;              // (token, slot) pairs dropped by capacity
  float aux_loss = 0.0f;                   // already scaled by its coefficient
  float z_loss = 0.0f;                     // already scaled by its coefficient
  float max_mean_load_ratio = 0.0f;        // max_e n_e / mean_e n_e over tokens_per_expert
};

class MoeLayer {
 public:
  // InvalidArgument when the config (or hidden_size, compute_dtype ∉ {f32, bf16}) is invalid.
  static absl::StatusOr<MoeLayer> Create(const MoeConfig& config, int64_t hidden_size,
                                         DType compute_dtype);

  const MoeConfig& config() const { return config_; }
  int64_t hidden_size() const { return hidden_size_; }
  DType compute_dtype() const { return dtype_; }

  // x (T, D), out (T, D) written. T = tokens in this micro-batch, in sequences of
  // tokens_per_sequence consecutive tokens (0 = one sequence; used by the sequence aux loss).
  // Keeps what Backward needs until the next Forward. `stats` may be null.
  absl::Status Forward(const MoeWeights& weights, TensorView x, int64_t tokens_per_sequence,
                       TensorView out, MoeStats* stats);

  // d_out (T, D) for the last Forward's out; d_x (T, D) written; grads accumulated. The aux and
  // z losses of that Forward enter the total loss with weight `loss_weight` (the micro-batch's
  // loss scale, as in d_out).
  absl::Status Backward(const MoeWeights& weights, TensorView d_out, TensorView d_x,
                        MoeGrads* grads, float loss_weight = 1.0f);

 private:
  MoeLayer(const MoeConfig& config, int64_t hidden_size, DType dtype)
      : config_(config), hidden_size_(hidden_size), dtype_(dtype) {}

  MoeConfig config_;
  int64_t hidden_size_;
  DType dtype_;

  // Grows `storage` when needed and returns a view of it with `shape`: buffers live across steps,
  // so the hot path allocates (and page-faults) nothing after the first call.
  static TensorView Workspace(Tensor& storage, DType dtype, std::initializer_list<int64_t> shape);

  // Saved by Forward for Backward (T tokens, R routed pairs kept, F, S·F).
  bool has_forward_ = false;
  int64_t tokens_per_sequence_ = 0;
  TensorView x_;                 // (T, D) compute dtype: the caller's input; must outlive Backward
  TensorView router_input_;      // (T, D) f32: x, widened when computing in bf16
  TensorView logits_;            // (T, E) f32
  RouterOutput routing_;         // scores, top-k experts and weights, losses
  Permutation permutation_;      // pairs sorted by expert
  TensorView permuted_x_;        // (R, D) compute dtype
  TensorView gate_up_;           // (R, 2F) f32: expert pre-activations
  TensorView activated_;         // (R, F) compute dtype: silu(gate) ⊙ up
  TensorView expert_out_;        // (R, D) f32: routed expert outputs before weighting
  TensorView shared_gate_up_;    // (T, 2SF) f32
  TensorView shared_activated_;  // (T, SF) compute dtype

  // Storage behind the views above, and scratch of Backward, by purpose.
  // clang-format off
  enum Buffer {
    kRouterInput, kLogits, kPermutedX, kGateUp, kActivated, kExpertOut, kSharedGateUp,
    kSharedActivated, kSharedOut, kDExpertOut, kDWeights, kDActivated, kDGateUp, kDPermutedX,
    kDSharedActivated, kDSharedGateUp, kDXShared, kDLogits, kDXRouter, kNumBuffers
  };
  // clang-format on
  Tensor buffers_[kNumBuffers];
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_MOE_LAYER_H_
