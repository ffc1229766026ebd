#include "engine/model/mla_attention.h"

#include "engine/core/status.h"
#include "engine/model/compute_copy.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/norm/rms_norm.h"

namespace moetrain {

MlaAttention::MlaAttention(const ModelConfig& config, DType compute_dtype, const ExecContext& ctx,
                           Fp8State* fp8, const std::string& prefix)
    : config_(config),
      dtype_(compute_dtype),
      ctx_(ctx),
      q_proj_(ctx),
      q_a_proj_(ctx),
      q_b_proj_(ctx),
      kv_a_latent_(ctx),
      kv_a_rope_(ctx),
      kv_b_proj_(ctx),
      o_proj_(ctx),
      workspace_(kNumKept, ctx.allocator()),
      scratch_(kNumScratch, ctx.allocator()) {
  if (fp8 == nullptr) return;
  const auto linear = [&](const char* name) {
    return Linear(ctx, fp8, fp8->Register(prefix + name, 1));
  };
  if (config.mla.q_lora_rank == 0) {
    q_proj_ = linear("q_proj");
  } else {
    q_a_proj_ = linear("q_a_proj");
    q_b_proj_ = linear("q_b_proj");
  }
  kv_a_latent_ = linear("kv_a_proj_with_mqa");
  kv_a_rope_ = linear("kv_a_proj_with_mqa.rope_rows");
  kv_b_proj_ = linear("kv_b_proj");
  o_proj_ = linear("o_proj");
}

absl::StatusOr<TensorView> MlaAttention::ToCompute(TensorView src, int slot) {
  return ComputeCopy(ctx_, scratch_, dtype_, src, slot);
}

absl::Status MlaAttention::ShareWorkspaceOf(const MlaAttention& other) {
  MOETRAIN_RETURN_IF_ERROR(workspace_.ShareSlotsOf(other.workspace_));
  return scratch_.ShareSlotsOf(other.scratch_);
}

absl::Status MlaAttention::Forward(const MlaWeights& w, int64_t batch, int64_t seq_len,
                                   TensorView n, TensorView out) {
  has_forward_ = false;
  const MlaConfig& m = config_.mla;
  const int64_t t = batch * seq_len, h = config_.num_heads, dqk = m.qk_head_dim();
  shape_ = {.batch = batch,
            .seq_len = seq_len,
            .num_heads = h,
            .qk_nope = m.qk_nope_head_dim,
            .qk_rope = m.qk_rope_head_dim,
            .v_head_dim = m.v_head_dim};
  core_ = {.batch = batch, .seq_len = seq_len, .num_heads = h, .num_kv_heads = h, .head_dim = dqk};

  // The down-projections, whose outputs (the latents) are kept.
  if (m.q_lora_rank > 0) {
    MOETRAIN_ASSIGN_OR_RETURN(q_a_, workspace_.Get(kQA, DType::kF32, {t, m.q_lora_rank}));
    MOETRAIN_RETURN_IF_ERROR(q_a_proj_.Forward(n, w.q_a_proj, q_a_));
  }
  MOETRAIN_ASSIGN_OR_RETURN(latent_, workspace_.Get(kLatent, DType::kF32, {t, m.kv_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(kv_a_latent_.Forward(n, LatentRows(w.kv_a_proj), latent_));
  MOETRAIN_RETURN_IF_ERROR(UpProject(w, n));
  MOETRAIN_ASSIGN_OR_RETURN(attn_out_, workspace_.Get(kAttnOut, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(lse_, workspace_.Get(kLse, DType::kF32, {batch, h, seq_len}));
  MOETRAIN_RETURN_IF_ERROR(ops::CausalAttentionForward(ctx_, core_, q_, k_, v_, attn_out_, lse_));
  MOETRAIN_RETURN_IF_ERROR(NarrowOutput());
  MOETRAIN_RETURN_IF_ERROR(o_proj_.Forward(o_in_act_, w.o_proj, out, /*accumulate=*/true));
  n_ = n;
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status MlaAttention::UpProject(const MlaWeights& w, TensorView n) {
  const MlaConfig& m = config_.mla;
  const int64_t t = shape_.tokens(), h = shape_.num_heads, dqk = m.qk_head_dim();
  const float eps = config_.rms_norm_eps;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView q_full, scratch_.Get(kQFull, DType::kF32, {t, h * dqk}));
  if (m.q_lora_rank == 0) {
    MOETRAIN_RETURN_IF_ERROR(q_proj_.Forward(n, w.q_proj, q_full));
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(rstd_q_, workspace_.Get(kRstdQ, DType::kF32, {t}));
    MOETRAIN_ASSIGN_OR_RETURN(q_a_normed_, scratch_.Get(kQANormed, dtype_, {t, m.q_lora_rank}));
    MOETRAIN_RETURN_IF_ERROR(
        ops::RmsNormForward(ctx_, q_a_, w.q_a_norm, eps, q_a_normed_, rstd_q_));
    MOETRAIN_RETURN_IF_ERROR(q_b_proj_.Forward(q_a_normed_, w.q_b_proj, q_full));
  }
  MOETRAIN_ASSIGN_OR_RETURN(TensorView k_rope,
                            scratch_.Get(kKRope, DType::kF32, {t, m.qk_rope_head_dim}));
  MOETRAIN_RETURN_IF_ERROR(kv_a_rope_.Forward(n, RopeRows(w.kv_a_proj), k_rope));
  MOETRAIN_ASSIGN_OR_RETURN(rstd_kv_, workspace_.Get(kRstdKv, DType::kF32, {t}));
  MOETRAIN_ASSIGN_OR_RETURN(latent_normed_,
                            scratch_.Get(kLatentNormed, dtype_, {t, m.kv_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::RmsNormForward(ctx_, latent_, w.kv_a_norm, eps, latent_normed_, rstd_kv_));
  MOETRAIN_ASSIGN_OR_RETURN(
      TensorView kv, scratch_.Get(kKv, DType::kF32, {t, h * (m.qk_nope_head_dim + m.v_head_dim)}));
  MOETRAIN_RETURN_IF_ERROR(kv_b_proj_.Forward(latent_normed_, w.kv_b_proj, kv));
  MOETRAIN_ASSIGN_OR_RETURN(q_, scratch_.Get(kQ, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(k_, scratch_.Get(kK, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(v_, scratch_.Get(kV, DType::kF32, {t, h * dqk}));
  return ops::MlaQkvForward(ctx_, shape_, config_.rope_theta, q_full, k_rope, kv, q_, k_, v_);
}

absl::Status MlaAttention::NarrowOutput() {
  const int64_t t = shape_.tokens(), h = shape_.num_heads;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView o_in,
                            scratch_.Get(kOIn, DType::kF32, {t, h * config_.mla.v_head_dim}));
  MOETRAIN_RETURN_IF_ERROR(ops::MlaNarrowHeads(ctx_, shape_, attn_out_, o_in));
  MOETRAIN_ASSIGN_OR_RETURN(o_in_act_, ToCompute(o_in, kOInAct));
  return absl::OkStatus();
}

absl::Status MlaAttention::Recompute(const MlaWeights& w, TensorView n) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("MlaAttention::Recompute needs a successful Forward");
  }
  has_forward_ = false;
  MOETRAIN_RETURN_IF_ERROR(UpProject(w, n));
  MOETRAIN_RETURN_IF_ERROR(NarrowOutput());
  n_ = n;
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status MlaAttention::Backward(const MlaWeights& w, TensorView d_out, TensorView d_n,
                                    MlaWeights* grads) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("MlaAttention::Backward needs a successful Forward");
  }
  const MlaConfig& m = config_.mla;
  const int64_t t = shape_.tokens(), h = shape_.num_heads, dqk = m.qk_head_dim();
  const float theta = config_.rope_theta;

  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_o_in,
                            scratch_.Get(kDOIn, DType::kF32, {t, h * m.v_head_dim}));
  MOETRAIN_RETURN_IF_ERROR(o_proj_.BackwardData(d_out, w.o_proj, d_o_in));
  MOETRAIN_RETURN_IF_ERROR(o_proj_.BackwardWeight(d_out, o_in_act_, grads->o_proj));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_attn, scratch_.Get(kDAttn, DType::kF32, {t, h * dqk}));
  MOETRAIN_RETURN_IF_ERROR(ops::MlaWidenHeads(ctx_, shape_, d_o_in, d_attn));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q, scratch_.Get(kDQ, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k, scratch_.Get(kDK, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_v, scratch_.Get(kDV, DType::kF32, {t, h * dqk}));
  MOETRAIN_RETURN_IF_ERROR(ops::CausalAttentionBackward(ctx_, core_, q_, k_, v_, attn_out_, lse_,
                                                        d_attn, d_q, d_k, d_v));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_full, scratch_.Get(kDQFull, DType::kF32, {t, h * dqk}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k_rope,
                            scratch_.Get(kDKRope, DType::kF32, {t, m.qk_rope_head_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(
      TensorView d_kv,
      scratch_.Get(kDKv, DType::kF32, {t, h * (m.qk_nope_head_dim + m.v_head_dim)}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::MlaQkvBackward(ctx_, shape_, theta, d_q, d_k, d_v, d_q_full, d_k_rope, d_kv));

  // Key/value: kv_b_proj, its norm, then both row ranges of kv_a_proj_with_mqa into d_n.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_kv_act, ToCompute(d_kv, kDKvAct));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_latent_normed,
                            scratch_.Get(kDLatentNormed, DType::kF32, {t, m.kv_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(kv_b_proj_.BackwardData(d_kv_act, w.kv_b_proj, d_latent_normed));
  MOETRAIN_RETURN_IF_ERROR(kv_b_proj_.BackwardWeight(d_kv_act, latent_normed_, grads->kv_b_proj));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_latent,
                            scratch_.Get(kDLatent, DType::kF32, {t, m.kv_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = latent_,
                                                       .weight = w.kv_a_norm,
                                                       .rstd = rstd_kv_,
                                                       .d_out = d_latent_normed,
                                                       .d_x = d_latent,
                                                       .d_weight = grads->kv_a_norm}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_latent_act, ToCompute(d_latent, kDLatentAct));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k_rope_act, ToCompute(d_k_rope, kDKRopeAct));
  MOETRAIN_RETURN_IF_ERROR(kv_a_latent_.BackwardData(d_latent_act, LatentRows(w.kv_a_proj), d_n));
  MOETRAIN_RETURN_IF_ERROR(
      kv_a_latent_.BackwardWeight(d_latent_act, n_, LatentRows(grads->kv_a_proj)));
  MOETRAIN_RETURN_IF_ERROR(
      kv_a_rope_.BackwardData(d_k_rope_act, RopeRows(w.kv_a_proj), d_n, /*accumulate=*/true));
  MOETRAIN_RETURN_IF_ERROR(kv_a_rope_.BackwardWeight(d_k_rope_act, n_, RopeRows(grads->kv_a_proj)));

  // Query.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_full_act, ToCompute(d_q_full, kDQFullAct));
  if (m.q_lora_rank == 0) {
    MOETRAIN_RETURN_IF_ERROR(
        q_proj_.BackwardData(d_q_full_act, w.q_proj, d_n, /*accumulate=*/true));
    return q_proj_.BackwardWeight(d_q_full_act, n_, grads->q_proj);
  }
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_a_normed,
                            scratch_.Get(kDQANormed, DType::kF32, {t, m.q_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(q_b_proj_.BackwardData(d_q_full_act, w.q_b_proj, d_q_a_normed));
  MOETRAIN_RETURN_IF_ERROR(q_b_proj_.BackwardWeight(d_q_full_act, q_a_normed_, grads->q_b_proj));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_a, scratch_.Get(kDQA, DType::kF32, {t, m.q_lora_rank}));
  MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = q_a_,
                                                       .weight = w.q_a_norm,
                                                       .rstd = rstd_q_,
                                                       .d_out = d_q_a_normed,
                                                       .d_x = d_q_a,
                                                       .d_weight = grads->q_a_norm}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_a_act, ToCompute(d_q_a, kDQAAct));
  MOETRAIN_RETURN_IF_ERROR(q_a_proj_.BackwardData(d_q_a_act, w.q_a_proj, d_n, /*accumulate=*/true));
  return q_a_proj_.BackwardWeight(d_q_a_act, n_, grads->q_a_proj);
}

}  // namespace moetrain
