// The attention branch of a block with Multi-head Latent Attention (model_config.h's MlaConfig),
// forward and backward, on the op layer:
//
//   q_full = q_b_proj(RMSNorm_q(q_a_proj(n)))  or  q_proj(n)          (T, H·Dqk)
//   c = kv_a_proj_with_mqa[latent rows](n),  k_rope = kv_a_proj_with_mqa[rope rows](n)
//   kv = kv_b_proj(RMSNorm_kv(c))                                     (T, H·(nope + v))
//   q, k, v = ops::MlaQkvForward(q_full, k_rope, kv)                  (RoPE, shared key, padding)
//   out += o_proj(narrow(CausalAttention(q, k, v)))                   scale 1/√Dqk
//
// kv_a_proj_with_mqa is one parameter, (kv_lora_rank + rope, D); its two row ranges run as two
// GEMMs, so that the latent and the shared key land in separate dense tensors. The projections'
// outputs, the norms and the attention core are f32; the GEMM inputs are the compute dtype
// ("act"); with an Fp8State the projections run in FP8 by its recipe, the rest does not.
#ifndef MOETRAIN_ENGINE_MODEL_MLA_ATTENTION_H_
#define MOETRAIN_ENGINE_MODEL_MLA_ATTENTION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "engine/model/model_config.h"
#include "engine/ops/attention/attention.h"
#include "engine/ops/mla/mla.h"

namespace moetrain {

// The weights of MLA: projections in the compute dtype, norms f32 (as the block's). The grads
// (f32) have the same fields. q_proj is used when q_lora_rank = 0, q_a_proj, q_a_norm and
// q_b_proj otherwise.
struct MlaWeights {
  TensorView q_proj;     // (H·Dqk, D)
  TensorView q_a_proj;   // (Rq, D)
  TensorView q_a_norm;   // (Rq)
  TensorView q_b_proj;   // (H·Dqk, Rq)
  TensorView kv_a_proj;  // (Rkv + rope, D): the latent's rows, then the shared key's
  TensorView kv_a_norm;  // (Rkv)
  TensorView kv_b_proj;  // (H·(nope + v), Rkv): per head, k_nope's rows then v's
  TensorView o_proj;     // (D, H·v)
};

class MlaAttention {
 public:
  // config.is_mla(). With `fp8` (not owned) the projections register as "<prefix>q_a_proj" etc.
  MlaAttention(const ModelConfig& config, DType compute_dtype, const ExecContext& ctx,
               Fp8State* fp8, const std::string& prefix);

  // n (T, D) act, T = batch·seq_len: the normed input, kept unchanged until Backward (or given
  // again to Recompute).
  // out (T, D) f32 += the branch's output.
  absl::Status Forward(const MlaWeights& w, int64_t batch, int64_t seq_len, TensorView n,
                       TensorView out);
  // d_out (T, D) act: the gradient of out. d_n (T, D) f32 is written; grads accumulated.
  absl::Status Backward(const MlaWeights& w, TensorView d_out, TensorView d_n, MlaWeights* grads);

  // Selective recompute, after the last Forward's scratch was overwritten and before Backward, on
  // the same weights and n's values (which may now lie elsewhere): the two latent norms, the
  // up-projections to q, k and v (DeepSeek-V3's recompute of MLA's up-projections) and the core's
  // narrowed output, from the latents and the core's output Forward kept. The same ops on the
  // same inputs: the same bits.
  absl::Status Recompute(const MlaWeights& w, TensorView n);

  // Activation recompute (MoeLayer's): ShareScratchOf makes this branch's scratch buffers (what
  // Recompute rebuilds, and Backward's) `other`'s, ShareWorkspaceOf every buffer.
  absl::Status ShareScratchOf(const MlaAttention& other) {
    return scratch_.ShareSlotsOf(other.scratch_);
  }
  absl::Status ShareWorkspaceOf(const MlaAttention& other);
  const Workspace& workspace() const { return workspace_; }
  const Workspace& scratch() const { return scratch_; }

 private:
  absl::StatusOr<TensorView> ToCompute(TensorView src, int slot);
  // q_, k_, v_ from n and the latents (q_a_ when q_lora_rank > 0, latent_): the norms, the
  // up-projections, the shared key, RoPE.
  absl::Status UpProject(const MlaWeights& w, TensorView n);
  // o_in_act_: attn_out_'s value heads, narrowed and in the compute dtype.
  absl::Status NarrowOutput();
  // Weight rows of kv_a_proj: the latent's, or the shared key's.
  TensorView LatentRows(TensorView kv_a) const { return kv_a.Slice(0, config_.mla.kv_lora_rank); }
  TensorView RopeRows(TensorView kv_a) const {
    return kv_a.Slice(config_.mla.kv_lora_rank, kv_a.dim(0));
  }

  ModelConfig config_;
  DType dtype_;
  ExecContext ctx_;
  Linear q_proj_, q_a_proj_, q_b_proj_, kv_a_latent_, kv_a_rope_, kv_b_proj_, o_proj_;

  // Saved by Forward for Backward.
  bool has_forward_ = false;
  ops::MlaShape shape_;
  ops::AttentionShape core_;
  TensorView n_;                                 // (T, D) act
  TensorView q_a_, rstd_q_, q_a_normed_;         // (T, Rq) f32, (T) f32, (T, Rq) act
  TensorView latent_, rstd_kv_, latent_normed_;  // (T, Rkv) f32, (T) f32, (T, Rkv) act
  TensorView q_, k_, v_, attn_out_, lse_;        // (T, H·Dqk) f32 ×4, (B, H, S) f32
  TensorView o_in_act_;                          // (T, H·v) act

  // What Forward keeps (`workspace_`) and what selective recompute rebuilds or Backward only
  // uses (`scratch_`), by purpose.
  enum Kept { kQA, kRstdQ, kLatent, kRstdKv, kAttnOut, kLse, kNumKept };
  // clang-format off
  enum Scratch {
    kQANormed, kQFull, kKRope, kLatentNormed, kKv, kQ, kK, kV, kOIn, kOInAct, kDOIn, kDAttn, kDQ,
    kDK, kDV, kDQFull, kDKRope, kDKv, kDKvAct, kDLatentNormed, kDLatent, kDLatentAct, kDKRopeAct,
    kDQFullAct, kDQANormed, kDQA, kDQAAct, kNumScratch
  };
  // clang-format on
  Workspace workspace_;
  Workspace scratch_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_MLA_ATTENTION_H_
