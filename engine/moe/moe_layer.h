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
// GEMMs accumulate in f32; the router runs in f32 (x is widened); gradients are f32. With an
// Fp8State the routed and shared experts' GEMMs run in FP8 by its recipe (engine/fp8/linear.h);
// the router does not.
//
// Device: the layer composes ops (engine/ops) on the execution context it was created with; every
// tensor it is given lives on that context's device. Once per Forward the host reads the router's
// results, at one named point (ReadRoutingOnHost): the E expert counts, which size the grouped
// GEMMs and the expert-parallel exchange, and the two losses for the statistics.
//
// Expert parallel (ExpertParallelConfig::expert_group of ep > 1 ranks): rank j of the group holds
// only its L = E/ep routed experts [j·L, (j+1)·L) (MoeWeights/MoeGrads expert_gate_up (L, 2F, D),
// expert_down (L, D, F)); the router, expert bias and shared experts are whole on every rank.
// Forward routes this rank's tokens over all E experts, sorts the pairs, dispatches them to the
// ranks that own their experts (expert_parallel.h), runs the local experts on what arrives (one
// grouped GEMM per source rank's block), and combines the results back; Backward mirrors it with
// the same layout. Communication overlaps compute: the dispatch of each chunk of experts is in
// flight while the shared experts and the previous chunk's GEMMs run, and its combine while the
// next chunk's do. Every expert's GEMMs see the same row blocks in the same order whatever the
// chunking, so results do not depend on it. In capacity mode each rank caps an expert's pairs
// among its own tokens (⌈cf·T·k/E⌉ of its T).
#ifndef MOETRAIN_ENGINE_MOE_MOE_LAYER_H_
#define MOETRAIN_ENGINE_MOE_MOE_LAYER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "engine/moe/expert_parallel.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/router/router.h"

namespace moetrain {

// How one MoE layer shares its experts and its load counts with other ranks. The communicators
// are not owned and must outlive the layer; every rank of a group runs Forward and Backward
// together.
struct ExpertParallelConfig {
  // Ranks that share their experts; null = all E experts local.
  Communicator* expert_group = nullptr;
  // Ranks whose token counts form the aux loss's f_e (the world); null = this rank's.
  Communicator* count_group = nullptr;
  // 0 = default (2 when expert_group size > 1), 1 = no overlap; at most L are used.
  int overlap_chunks = 0;
};

// Read-only parameters. E experts (L = E/ep of them local), D hidden size, F expert_ffn_dim,
// S shared experts.
struct MoeWeights {
  TensorView router;          // (E, D) f32
  TensorView expert_bias;     // (E) f32; only when config.expert_bias
  TensorView expert_gate_up;  // (L, 2F, D) compute dtype: rows [0, F) gate, [F, 2F) up
  TensorView expert_down;     // (L, D, F) compute dtype
  TensorView shared_gate_up;  // (2·S·F, D) compute dtype; only when S > 0
  TensorView shared_down;     // (D, S·F) compute dtype; only when S > 0
};

// Parameter gradients, f32, same shapes as the weights. Backward adds into them (+=), so that
// micro-batches accumulate; zero them once per optimizer step.
struct MoeGrads {
  TensorView router;          // (E, D)
  TensorView expert_gate_up;  // (L, 2F, D)
  TensorView expert_down;     // (L, D, F)
  TensorView shared_gate_up;  // (2·S·F, D); only when S > 0
  TensorView shared_down;     // (D, S·F); only when S > 0
};

// This rank's numbers (the trainer sums tokens_per_expert over ranks for the expert bias).
struct MoeStats {
  std::vector<int64_t> tokens_per_expert;  // (E) pairs routed to each expert, before drops
  int64_t dropped_tokens = 0;              // (token, slot) pairs dropped by capacity
  float aux_loss = 0.0f;                   // already scaled by its coefficient
  float z_loss = 0.0f;                     // already scaled by its coefficient
  float max_mean_load_ratio = 0.0f;        // max_e n_e / mean_e n_e over tokens_per_expert
};

class MoeLayer {
 public:
  // InvalidArgument when the config (or hidden_size, compute_dtype ∉ {f32, bf16}) is invalid, or
  // when the expert group's size does not divide model.moe.num_experts. The layer runs its ops on
  // `ctx`. With `fp8` (not owned; bf16 compute) the experts' GEMMs run in FP8: Create registers
  // them there as `<name>.experts.gate_up_proj` and `.down_proj` (one group per global expert)
  // and `<name>.shared_experts.*`, before the caller's Fp8State::Allocate.
  static absl::StatusOr<MoeLayer> Create(const MoeConfig& config, int64_t hidden_size,
                                         DType compute_dtype,
                                         const ExpertParallelConfig& parallel = {},
                                         const ExecContext& ctx = ExecContext::Cpu(),
                                         Fp8State* fp8 = nullptr, const std::string& name = "mlp");

  const MoeConfig& config() const { return config_; }
  int64_t hidden_size() const { return hidden_size_; }
  DType compute_dtype() const { return dtype_; }
  // The routed experts this rank holds: global experts [first, first + num_local_experts()).
  int64_t num_local_experts() const { return num_local_experts_; }
  int64_t first_local_expert() const { return first_local_expert_; }

  // x (T, D), out (T, D) written. T = tokens in this micro-batch, in sequences of
  // tokens_per_sequence consecutive tokens (0 = one sequence; used by the sequence aux loss).
  // Keeps what Backward needs until the next Forward. `stats` may be null.
  // `rerun`: activation recompute of the last successful Forward, on x of the same values with
  // the same weights: its routing, which the layer keeps outside its workspace (scores, top-k,
  // counts, losses, the permutation and the exchange plan), is used again, not computed again, so
  // the rows go where they went; the rest (the router's logits, the permuted rows, their exchange
  // and the experts) is. FailedPrecondition when no routing is kept (stats must be null).
  absl::Status Forward(const MoeWeights& weights, TensorView x, int64_t tokens_per_sequence,
                       TensorView out, MoeStats* stats, bool rerun = false);

  // d_out (T, D) for the last Forward's out; d_x (T, D) written; grads accumulated. The aux and
  // z losses of that Forward enter the total loss with weight `loss_weight` (the micro-batch's
  // loss scale, as in d_out).
  absl::Status Backward(const MoeWeights& weights, TensorView d_out, TensorView d_x,
                        MoeGrads* grads, float loss_weight = 1.0f);

  // Selective recompute (engine/model/transformer.h), after the last Forward's scratch was
  // overwritten and before Backward, on x of the same values (which may now lie elsewhere): the
  // router's f32 input and the SwiGLU outputs of the routed and shared experts, from x and the
  // pre-activations Forward kept. The same ops on the same inputs: the same bits.
  absl::Status Recompute(TensorView x);

  // Activation recompute (engine/model/transformer.h): ShareScratchOf makes this layer's scratch
  // buffers (what Recompute rebuilds, and Backward's) `other`'s, ShareWorkspaceOf every buffer, so
  // that a Forward of either overwrites what the other kept.
  absl::Status ShareScratchOf(const MoeLayer& other) {
    return scratch_.ShareSlotsOf(other.scratch_);
  }
  absl::Status ShareWorkspaceOf(const MoeLayer& other);
  const Workspace& workspace() const { return workspace_; }
  const Workspace& scratch() const { return scratch_; }
  // The bytes Forward keeps outside the workspace, per layer: the routing and the permutation.
  int64_t routing_bytes() const;

 private:
  MoeLayer(const MoeConfig& config, int64_t hidden_size, DType dtype,
           const ExpertParallelConfig& parallel, const ExecContext& ctx);

  // Routes x_ (in router_input_): logits, the router, the aux loss's counts summed over the count
  // group, then ReadRoutingOnHost.
  // With `rerun` only the logits (routing_ is the last Route's).
  absl::Status Route(const MoeWeights& weights, bool rerun);
  // The one point of a pass where the host reads what the router computed on the device:
  // host_counts_ (E) and host_losses_ (aux, z). Everything the host decides (group sizes, the
  // exchange plan, the statistics) follows from them.
  absl::Status ReadRoutingOnHost();

  // The pieces of Forward and Backward (moe_layer.cc), shared by both modes. The routed experts
  // [first, last) (local indices) on their rows [offsets[0], offsets.back()) of `rows_x`, where
  // `offsets` (last − first + 1) are absolute rows of gate_up_, activated_ and expert_out_.
  absl::Status RoutedExpertsForward(const MoeWeights& weights, TensorView rows_x, int64_t first,
                                    int64_t last, absl::Span<const int64_t> offsets);
  // Their backward: d_rows_out (rows, D) compute dtype → d_rows_x (rows, D) f32, grads added.
  absl::Status RoutedExpertsBackward(const MoeWeights& weights, TensorView rows_x,
                                     TensorView d_rows_out, int64_t first, int64_t last,
                                     absl::Span<const int64_t> offsets, TensorView d_rows_x,
                                     MoeGrads* grads);
  // Shared experts on every token: (T, D) f32, or an empty view when S = 0.
  absl::StatusOr<TensorView> SharedExpertsForward(const MoeWeights& weights);
  absl::StatusOr<TensorView> SharedExpertsBackward(const MoeWeights& weights, TensorView d_out,
                                                   MoeGrads* grads);
  // The router's gradient from the combine weights' (T, k) and the losses; returns d_x's part.
  absl::StatusOr<TensorView> RouterBackwardPart(const MoeWeights& weights, TensorView d_weights,
                                                MoeGrads* grads, float loss_weight);

  // Expert parallel (moe_layer_expert_parallel.cc): from the routing to out, and back to d_x.
  absl::Status ForwardExpertParallel(const MoeWeights& weights, TensorView out, bool rerun);
  absl::Status BackwardExpertParallel(const MoeWeights& weights, TensorView d_out, TensorView d_x,
                                      MoeGrads* grads, float loss_weight);
  // Runs each chunk's `compute` between its dispatch and its combine, with `other` (work that
  // needs neither) while the first dispatch is in flight; serially when there is one chunk.
  // `compute(c, s)` is called for every source rank s of chunk c.
  absl::Status RunChunks(const DispatchArgs& dispatch, const CombineArgs& combine,
                         const std::function<absl::Status()>& other,
                         const std::function<absl::Status(int chunk, int source)>& compute);

  MoeConfig config_;
  int64_t hidden_size_;
  DType dtype_;
  ExpertParallelConfig parallel_;
  ExecContext ctx_;
  int64_t num_local_experts_;     // L
  int64_t first_local_expert_;    // j·L
  bool expert_parallel_ = false;  // an expert group of ep > 1 ranks
  int num_chunks_ = 1;            // overlap chunks when expert parallel
  Fp8State* fp8_ = nullptr;       // FP8 GEMMs for the experts when set
  GroupedLinear experts_gate_up_;
  GroupedLinear experts_down_;
  Linear shared_gate_up_proj_;
  Linear shared_down_proj_;

  // Saved by Forward for Backward (T tokens, R routed pairs kept, N rows received, F, S·F).
  // Without expert parallelism the expert rows are the permuted rows, N = R; with it they are the
  // received rows, in the dispatch layout (by chunk, source rank, local expert).
  bool has_forward_ = false;
  bool has_routing_ = false;  // routing_, the permutation and the plan are a whole Route's
  int64_t tokens_per_sequence_ = 0;
  TensorView x_;               // (T, D) compute dtype: the caller's input; must outlive Backward
  TensorView router_input_;    // (T, D) f32: x, widened when computing in bf16
  TensorView logits_;          // (T, E) f32
  ops::RouterOutput routing_;  // scores, top-k experts and weights, counts, losses
  std::vector<int64_t> host_counts_;  // (E) routing_.tokens_per_expert, read by the host
  float host_losses_[2] = {0, 0};     // routing_.losses, read by the host
  ops::Permutation permutation_;      // pairs sorted by expert (by expert send slot when parallel)
  std::vector<int64_t> offsets_;  // (E + 1) host: the permuted rows of each expert (not parallel)
  int64_t dropped_ = 0;           // pairs dropped by capacity
  DispatchHandle handle_;         // where the permuted rows went, when expert parallel
  TensorView permuted_x_;         // (R, D) compute dtype
  TensorView received_x_;         // (N, D) compute dtype: rows of the local experts (parallel)
  TensorView gate_up_;            // (N, 2F) f32: expert pre-activations
  TensorView activated_;          // (N, F) compute dtype: silu(gate) ⊙ up
  TensorView expert_out_;         // (N, D) f32: routed expert outputs before weighting
  TensorView combined_;           // (R, D) f32: expert outputs back in permuted order (parallel)
  TensorView shared_gate_up_;     // (T, 2SF) f32
  TensorView shared_activated_;   // (T, SF) compute dtype

  // Storage behind the views above: what Forward keeps (`workspace_`), and what selective
  // recompute rebuilds or only Forward or Backward uses (`scratch_`), by purpose. With expert
  // parallelism the permuted rows and the experts' outputs are only sent (kSentX, kSentOut):
  // backward reads the received rows and the combined outputs instead.
  // (The first of each a dense FFN's buffers share under recompute: like for like.)
  enum Kept {
    kGateUp,
    kLogits,
    kPermutedX,
    kExpertOut,
    kSharedGateUp,
    kSendOrder,
    kReceivedX,
    kCombined,
    kNumKept
  };
  // clang-format off
  enum Scratch {
    kActivated, kDActivated, kDGateUp, kRouterInput, kSharedActivated, kSharedOut, kDExpertOut,
    kDWeights, kDPermutedX, kDSharedActivated, kDSharedGateUp, kDXShared, kDLogits, kDXRouter,
    kDReceived, kDReceivedX, kSentX, kSentOut, kNumScratch
  };
  // clang-format on
  Workspace workspace_;
  Workspace scratch_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_MOE_LAYER_H_
