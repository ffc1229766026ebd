// One decoder block of the transformer, forward and backward:
//
//   a = x + o_proj(Attention(RoPE(q_proj(n1)), RoPE(k_proj(n1)), v_proj(n1))),  n1 = RMSNorm(x)
//   y = a + FFN(n2),  n2 = RMSNorm(a);  FFN = dense SwiGLU or the MoE layer.
//
// That is grouped-query attention; with Multi-head Latent Attention (config.is_mla()) the
// attention branch is MlaAttention's (mla_attention.h) instead.
//
// T = B·S tokens; D hidden; H, Hkv heads of Dh; F the dense FFN width. The residual stream (x, a,
// y), the attention core and the norms are f32; the projections are GEMMs on compute-dtype
// ("act") inputs and weights with f32 outputs; with an Fp8State they run in FP8 by its recipe
// (engine/fp8/linear.h), the attention core and the norms do not.
#ifndef MOETRAIN_ENGINE_MODEL_BLOCK_H_
#define MOETRAIN_ENGINE_MODEL_BLOCK_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "engine/model/mla_attention.h"
#include "engine/model/model_config.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/attention/attention.h"

namespace moetrain {

// The weights one block reads. Norms, router and expert bias are the f32 masters; the rest are
// the compute-dtype copies.
struct BlockWeights {
  TensorView input_norm;  // (D) f32
  // Grouped-query attention's projections (q, k, v, o); MLA's are in `mla`.
  TensorView q_proj;               // (H·Dh, D) act
  TensorView k_proj;               // (Hkv·Dh, D) act
  TensorView v_proj;               // (Hkv·Dh, D) act
  TensorView o_proj;               // (D, H·Dh) act
  TensorView post_attention_norm;  // (D) f32
  TensorView mlp_gate_up;          // (2F, D) act: gate_proj rows [0, F), up_proj [F, 2F); dense
  TensorView mlp_down;             // (D, F) act; dense
  MoeWeights moe;                  // MoE blocks
  MlaWeights mla;                  // MLA blocks
};

// Gradients, f32, shaped as the weights; Backward adds into them.
struct BlockGrads {
  TensorView input_norm;
  TensorView q_proj;
  TensorView k_proj;
  TensorView v_proj;
  TensorView o_proj;
  TensorView post_attention_norm;
  TensorView mlp_gate_up;
  TensorView mlp_down;
  MoeGrads moe;
  MlaWeights mla;  // the gradients of MLA's weights
};

class TransformerBlock {
 public:
  // A dense block when `moe` is false. An MoE block is built with `parallel` (its weights and
  // grads then hold only the expert group's local experts). Its ops run on `ctx`. With `fp8`
  // (not owned) its linear layers register there as "model.layers.<layer>.…" and run in FP8.
  static absl::StatusOr<TransformerBlock> Create(const ModelConfig& config, bool moe,
                                                 DType compute_dtype,
                                                 const ExpertParallelConfig& parallel = {},
                                                 const ExecContext& ctx = ExecContext::Cpu(),
                                                 Fp8State* fp8 = nullptr, int64_t layer = 0);

  bool is_moe() const { return moe_.has_value(); }

  // x (T, D) f32 with T = batch·seq_len; y (T, D) f32 written. x must stay unchanged until
  // Backward, which reads it. `stats` (MoE blocks; may be null) receives the layer's statistics,
  // the aux and z losses unscaled. `rerun`: activation recompute of the last successful Forward
  // (same x values and weights; stats null): an MoE block's routing is used again
  // (MoeLayer::Forward).
  absl::Status Forward(const BlockWeights& weights, int64_t batch, int64_t seq_len, TensorView x,
                       TensorView y, MoeStats* stats, bool rerun = false);

  // Selective recompute (transformer.h): after the last Forward's scratch buffers were
  // overwritten (by other blocks sharing them) and before Backward, rebuilds them from what Forward
  // kept: the two norms' outputs, the compute copy of the attention output, the dense FFN's SwiGLU
  // output, then MLA's (MlaAttention::Recompute) and the MoE layer's (MoeLayer::Recompute). Same
  // weights, x unchanged.
  absl::Status Recompute(const BlockWeights& weights);

  // d (T, D) f32: the gradient of y on entry, of x on return. Grads accumulated. The MoE aux and
  // z losses of the last Forward enter the objective with weight `loss_scale` (the micro-batch's
  // loss scale, already in d).
  absl::Status Backward(const BlockWeights& weights, TensorView d, BlockGrads* grads,
                        float loss_scale = 1.0f);

  // Activation recompute (transformer.h): each of this block's buffers that `other` has too (the
  // block's own, MLA's, the MoE layer's; a dense FFN's take the first of other's MoE layer's, or
  // other's dense FFN's) becomes other's, so that a Forward of either overwrites what the other
  // kept. `kept_too` false (selective): only the scratch buffers, and the caller runs Recompute
  // before Backward; true (full): every buffer, and the caller re-runs Forward.
  absl::Status ShareWorkspacesOf(const TransformerBlock& other, bool kept_too);
  // Its workspaces, for Workspace::DistinctBytes, and the bytes Forward keeps outside them.
  void AppendWorkspaces(std::vector<const Workspace*>* out) const;
  int64_t kept_bytes() const { return moe_.has_value() ? moe_->routing_bytes() : 0; }

 private:
  TransformerBlock(const ModelConfig& config, DType dtype, const ExecContext& ctx)
      : config_(config),
        dtype_(dtype),
        ctx_(ctx),
        q_proj_(ctx),
        k_proj_(ctx),
        v_proj_(ctx),
        o_proj_(ctx),
        mlp_gate_up_(ctx),
        mlp_down_(ctx),
        workspace_(kNumKept, ctx.allocator()),
        scratch_(kNumScratch, ctx.allocator()),
        ffn_workspace_(kNumFfnKept, ctx.allocator()),
        ffn_scratch_(kNumFfnScratch, ctx.allocator()) {}

  // The grouped-query attention branch: mid_ (holding x) += o_proj(attention(normed_attn_)).
  absl::Status GqaForward(const BlockWeights& weights, int64_t batch, int64_t seq_len);
  // d_act (T, D) act: the gradient of the branch's output; d_normed_attn (T, D) f32 is written.
  absl::Status GqaBackward(const BlockWeights& weights, TensorView d_act, TensorView d_normed_attn,
                           BlockGrads* grads);

  // `src` (T, cols) f32 as a compute-dtype tensor: src itself for f32, else converted into
  // scratch slot `slot`.
  absl::StatusOr<TensorView> ToCompute(TensorView src, int slot);

  ModelConfig config_;
  DType dtype_;
  ExecContext ctx_;
  std::optional<MoeLayer> moe_;
  std::optional<MlaAttention> mla_;           // MLA blocks
  Linear q_proj_, k_proj_, v_proj_, o_proj_;  // the GEMMs of each projection (GQA)
  Linear mlp_gate_up_, mlp_down_;             // dense blocks

  // Saved by Forward for Backward.
  bool has_forward_ = false;
  ops::AttentionShape shape_;
  TensorView x_;             // (T, D) f32: the caller's input
  TensorView rstd_attn_;     // (T) f32
  TensorView normed_attn_;   // (T, D) act: n1
  TensorView q_, k_, v_;     // GQA: (T, H·Dh), (T, Hkv·Dh) ×2 f32, RoPE applied to q and k
  TensorView attn_out_;      // (T, H·Dh) f32
  TensorView attn_out_act_;  // (T, H·Dh) act: attn_out, or its bf16 copy
  TensorView lse_;           // (B, H, S) f32
  TensorView mid_;           // (T, D) f32: a
  TensorView rstd_ffn_;      // (T) f32
  TensorView normed_ffn_;    // (T, D) act: n2 (also the MoE layer's saved input)
  TensorView gate_up_;       // (T, 2F) f32: dense FFN pre-activations
  TensorView activated_;     // (T, F) act: silu(gate) ⊙ up

  // Storage behind the views above, by purpose: what Forward keeps (`workspace_`), and what
  // selective recompute rebuilds or only Forward or Backward uses (`scratch_`).
  enum Kept { kRstdAttn, kQ, kK, kV, kAttnOut, kLse, kMid, kRstdFfn, kNumKept };
  // clang-format off
  enum Scratch {
    kNormedAttn, kAttnOutAct, kNormedFfn, kMoeOut, kDAct, kDNormed, kDNormedAct, kDAttn, kDQ, kDK,
    kDV, kDQAct, kDKAct, kDVAct, kNumScratch
  };
  // clang-format on
  Workspace workspace_;
  Workspace scratch_;
  // The dense FFN's, apart: with recompute they share an MoE layer's first slots.
  enum FfnKept { kGateUp, kNumFfnKept };
  enum FfnScratch { kActivated, kDFfnHidden, kDGateUp, kNumFfnScratch };
  Workspace ffn_workspace_;
  Workspace ffn_scratch_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_BLOCK_H_
