#include "engine/model/block.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/model/compute_copy.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/norm/rms_norm.h"
#include "engine/ops/rope/rope.h"
#include "engine/ops/swiglu/swiglu.h"

namespace moetrain {
namespace {

absl::Status CheckStream(const TensorView& t, const char* name, int64_t tokens, int64_t d) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(t, name, DType::kF32, {tokens, d}));
  if (!t.is_contiguous()) return absl::InvalidArgumentError(absl::StrCat(name, ": not contiguous"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransformerBlock> TransformerBlock::Create(const ModelConfig& config, bool moe,
                                                          DType compute_dtype,
                                                          const ExpertParallelConfig& parallel,
                                                          const ExecContext& ctx, Fp8State* fp8,
                                                          int64_t layer) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_RETURN_IF_ERROR(CheckComputeDType(compute_dtype, "the transformer's compute dtype"));
  TransformerBlock block(config, compute_dtype, ctx);
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  if (config.is_mla()) {
    block.mla_.emplace(config, compute_dtype, ctx, fp8, prefix + "self_attn.");
  }
  if (fp8 != nullptr) {
    const auto linear = [&](const char* name) {
      return Linear(ctx, fp8, fp8->Register(prefix + name, 1));
    };
    if (!config.is_mla()) {
      block.q_proj_ = linear("self_attn.q_proj");
      block.k_proj_ = linear("self_attn.k_proj");
      block.v_proj_ = linear("self_attn.v_proj");
      block.o_proj_ = linear("self_attn.o_proj");
    }
    if (!moe) {
      block.mlp_gate_up_ = linear("mlp.gate_up_proj");
      block.mlp_down_ = linear("mlp.down_proj");
    }
  }
  if (moe) {
    MOETRAIN_ASSIGN_OR_RETURN(MoeLayer moe_layer,
                              MoeLayer::Create(config.moe, config.hidden_size, compute_dtype,
                                               parallel, ctx, fp8, prefix + "mlp"));
    block.moe_.emplace(std::move(moe_layer));
  }
  return block;
}

absl::Status TransformerBlock::ShareWorkspacesOf(const TransformerBlock& other, bool kept_too) {
  has_forward_ = false;
  MOETRAIN_RETURN_IF_ERROR(scratch_.ShareSlotsOf(other.scratch_));
  if (kept_too) MOETRAIN_RETURN_IF_ERROR(workspace_.ShareSlotsOf(other.workspace_));
  if (mla_.has_value() && other.mla_.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(kept_too ? mla_->ShareWorkspaceOf(*other.mla_)
                                      : mla_->ShareScratchOf(*other.mla_));
  }
  if (moe_.has_value() && other.moe_.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(kept_too ? moe_->ShareWorkspaceOf(*other.moe_)
                                      : moe_->ShareScratchOf(*other.moe_));
  }
  // A dense FFN's few buffers take the first slots of an MoE layer's: a block has one or the other.
  if (!is_moe()) {
    MOETRAIN_RETURN_IF_ERROR(
        ffn_scratch_.ShareSlotsOf(other.is_moe() ? other.moe_->scratch() : other.ffn_scratch_));
    if (kept_too) {
      MOETRAIN_RETURN_IF_ERROR(ffn_workspace_.ShareSlotsOf(other.is_moe() ? other.moe_->workspace()
                                                                          : other.ffn_workspace_));
    }
  }
  return absl::OkStatus();
}

void TransformerBlock::AppendWorkspaces(std::vector<const Workspace*>* out) const {
  out->insert(out->end(), {&workspace_, &scratch_, &ffn_workspace_, &ffn_scratch_});
  if (mla_.has_value()) out->insert(out->end(), {&mla_->workspace(), &mla_->scratch()});
  if (moe_.has_value()) out->insert(out->end(), {&moe_->workspace(), &moe_->scratch()});
}

absl::StatusOr<TensorView> TransformerBlock::ToCompute(TensorView src, int slot) {
  return ComputeCopy(ctx_, scratch_, dtype_, src, slot);
}

absl::Status TransformerBlock::Forward(const BlockWeights& w, int64_t batch, int64_t seq_len,
                                       TensorView x, TensorView y, MoeStats* stats, bool rerun) {
  has_forward_ = false;
  const int64_t d = config_.hidden_size, t = batch * seq_len;
  MOETRAIN_RETURN_IF_ERROR(CheckStream(x, "block x", t, d));
  MOETRAIN_RETURN_IF_ERROR(CheckStream(y, "block y", t, d));
  const float eps = config_.rms_norm_eps;

  // Attention: a = x + attention(n1), the projection accumulating onto a copy of the residual.
  MOETRAIN_ASSIGN_OR_RETURN(rstd_attn_, workspace_.Get(kRstdAttn, DType::kF32, {t}));
  MOETRAIN_ASSIGN_OR_RETURN(normed_attn_, scratch_.Get(kNormedAttn, dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::RmsNormForward(ctx_, x, w.input_norm, eps, normed_attn_, rstd_attn_));
  MOETRAIN_ASSIGN_OR_RETURN(mid_, workspace_.Get(kMid, DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, x, mid_));
  if (mla_.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(mla_->Forward(w.mla, batch, seq_len, normed_attn_, mid_));
  } else {
    MOETRAIN_RETURN_IF_ERROR(GqaForward(w, batch, seq_len));
  }

  // FFN.
  MOETRAIN_ASSIGN_OR_RETURN(rstd_ffn_, workspace_.Get(kRstdFfn, DType::kF32, {t}));
  MOETRAIN_ASSIGN_OR_RETURN(normed_ffn_, scratch_.Get(kNormedFfn, dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::RmsNormForward(ctx_, mid_, w.post_attention_norm, eps, normed_ffn_, rstd_ffn_));
  if (!is_moe()) {
    const int64_t f = config_.ffn_dim;
    MOETRAIN_ASSIGN_OR_RETURN(gate_up_, ffn_workspace_.Get(kGateUp, DType::kF32, {t, 2 * f}));
    MOETRAIN_RETURN_IF_ERROR(mlp_gate_up_.Forward(normed_ffn_, w.mlp_gate_up, gate_up_));
    MOETRAIN_ASSIGN_OR_RETURN(activated_, ffn_scratch_.Get(kActivated, dtype_, {t, f}));
    MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, gate_up_, activated_));
    MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, mid_, y));
    MOETRAIN_RETURN_IF_ERROR(mlp_down_.Forward(activated_, w.mlp_down, y, /*accumulate=*/true));
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(TensorView moe_out, scratch_.Get(kMoeOut, dtype_, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(moe_->Forward(w.moe, normed_ffn_, seq_len, moe_out, stats, rerun));
    // The MoE output is in the compute dtype, so no GEMM can accumulate it into the residual.
    MOETRAIN_RETURN_IF_ERROR(ops::Add(ctx_, mid_, moe_out, y));
  }
  x_ = x;
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status TransformerBlock::GqaForward(const BlockWeights& w, int64_t batch, int64_t seq_len) {
  const int64_t dh = config_.resolved_head_dim();
  const int64_t q_dim = config_.num_heads * dh, kv_dim = config_.num_kv_heads * dh;
  const int64_t t = batch * seq_len;
  shape_ = {.batch = batch,
            .seq_len = seq_len,
            .num_heads = config_.num_heads,
            .num_kv_heads = config_.num_kv_heads,
            .head_dim = dh};
  MOETRAIN_ASSIGN_OR_RETURN(q_, workspace_.Get(kQ, DType::kF32, {t, q_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(k_, workspace_.Get(kK, DType::kF32, {t, kv_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(v_, workspace_.Get(kV, DType::kF32, {t, kv_dim}));
  MOETRAIN_RETURN_IF_ERROR(q_proj_.Forward(normed_attn_, w.q_proj, q_));
  MOETRAIN_RETURN_IF_ERROR(k_proj_.Forward(normed_attn_, w.k_proj, k_));
  MOETRAIN_RETURN_IF_ERROR(v_proj_.Forward(normed_attn_, w.v_proj, v_));
  MOETRAIN_RETURN_IF_ERROR(ops::ApplyRope(ctx_, shape_, config_.rope_theta, /*inverse=*/false, q_));
  MOETRAIN_RETURN_IF_ERROR(ops::ApplyRope(ctx_, shape_, config_.rope_theta, /*inverse=*/false, k_));
  MOETRAIN_ASSIGN_OR_RETURN(attn_out_, workspace_.Get(kAttnOut, DType::kF32, {t, q_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(lse_,
                            workspace_.Get(kLse, DType::kF32, {batch, config_.num_heads, seq_len}));
  MOETRAIN_RETURN_IF_ERROR(ops::CausalAttentionForward(ctx_, shape_, q_, k_, v_, attn_out_, lse_));
  MOETRAIN_ASSIGN_OR_RETURN(attn_out_act_, ToCompute(attn_out_, kAttnOutAct));
  return o_proj_.Forward(attn_out_act_, w.o_proj, mid_, /*accumulate=*/true);
}

absl::Status TransformerBlock::Recompute(const BlockWeights& w) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("TransformerBlock::Recompute needs a successful Forward");
  }
  has_forward_ = false;
  const int64_t t = x_.dim(0), d = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  MOETRAIN_ASSIGN_OR_RETURN(normed_attn_, scratch_.Get(kNormedAttn, dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::RmsNormForward(ctx_, x_, w.input_norm, eps, normed_attn_, rstd_attn_));
  if (mla_.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(mla_->Recompute(w.mla, normed_attn_));
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(attn_out_act_, ToCompute(attn_out_, kAttnOutAct));
  }
  MOETRAIN_ASSIGN_OR_RETURN(normed_ffn_, scratch_.Get(kNormedFfn, dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::RmsNormForward(ctx_, mid_, w.post_attention_norm, eps, normed_ffn_, rstd_ffn_));
  if (is_moe()) {
    MOETRAIN_RETURN_IF_ERROR(moe_->Recompute(normed_ffn_));
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(activated_,
                              ffn_scratch_.Get(kActivated, dtype_, {t, config_.ffn_dim}));
    MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, gate_up_, activated_));
  }
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status TransformerBlock::Backward(const BlockWeights& w, TensorView d, BlockGrads* grads,
                                        float loss_scale) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("TransformerBlock::Backward needs a successful Forward");
  }
  if (grads == nullptr) return absl::InvalidArgumentError("block grads: null");
  const int64_t t = x_.dim(0), dim = config_.hidden_size;
  MOETRAIN_RETURN_IF_ERROR(CheckStream(d, "block d", t, dim));

  // FFN: d holds dL/dy = dL/d(ffn out); the norm's backward then adds its part, giving dL/da.
  TensorView d_normed_ffn;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_act, ToCompute(d, kDAct));
  if (!is_moe()) {
    const int64_t f = config_.ffn_dim;
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_hidden,
                              ffn_scratch_.Get(kDFfnHidden, DType::kF32, {t, f}));
    MOETRAIN_RETURN_IF_ERROR(mlp_down_.BackwardData(d_act, w.mlp_down, d_hidden));
    MOETRAIN_RETURN_IF_ERROR(mlp_down_.BackwardWeight(d_act, activated_, grads->mlp_down));
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_gate_up, ffn_scratch_.Get(kDGateUp, dtype_, {t, 2 * f}));
    MOETRAIN_RETURN_IF_ERROR(ops::SwigluBackward(ctx_, gate_up_, d_hidden, d_gate_up));
    MOETRAIN_ASSIGN_OR_RETURN(d_normed_ffn, scratch_.Get(kDNormed, DType::kF32, {t, dim}));
    MOETRAIN_RETURN_IF_ERROR(mlp_gate_up_.BackwardData(d_gate_up, w.mlp_gate_up, d_normed_ffn));
    MOETRAIN_RETURN_IF_ERROR(
        mlp_gate_up_.BackwardWeight(d_gate_up, normed_ffn_, grads->mlp_gate_up));
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(d_normed_ffn, scratch_.Get(kDNormedAct, dtype_, {t, dim}));
    MOETRAIN_RETURN_IF_ERROR(moe_->Backward(w.moe, d_act, d_normed_ffn, &grads->moe, loss_scale));
  }
  MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = mid_,
                                                       .weight = w.post_attention_norm,
                                                       .rstd = rstd_ffn_,
                                                       .d_out = d_normed_ffn,
                                                       .d_x = d,
                                                       .d_weight = grads->post_attention_norm,
                                                       .accumulate_d_x = true}));

  // Attention: d holds dL/da; the input norm's backward adds its part, giving dL/dx.
  MOETRAIN_ASSIGN_OR_RETURN(d_act, ToCompute(d, kDAct));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_normed_attn,
                            scratch_.Get(kDNormed, DType::kF32, {t, dim}));
  if (mla_.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(mla_->Backward(w.mla, d_act, d_normed_attn, &grads->mla));
  } else {
    MOETRAIN_RETURN_IF_ERROR(GqaBackward(w, d_act, d_normed_attn, grads));
  }
  return ops::RmsNormBackward(ctx_, {.x = x_,
                                     .weight = w.input_norm,
                                     .rstd = rstd_attn_,
                                     .d_out = d_normed_attn,
                                     .d_x = d,
                                     .d_weight = grads->input_norm,
                                     .accumulate_d_x = true});
}

absl::Status TransformerBlock::GqaBackward(const BlockWeights& w, TensorView d_act,
                                           TensorView d_normed_attn, BlockGrads* grads) {
  const int64_t t = x_.dim(0), q_dim = q_.dim(1), kv_dim = k_.dim(1);
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_attn, scratch_.Get(kDAttn, DType::kF32, {t, q_dim}));
  MOETRAIN_RETURN_IF_ERROR(o_proj_.BackwardData(d_act, w.o_proj, d_attn));
  MOETRAIN_RETURN_IF_ERROR(o_proj_.BackwardWeight(d_act, attn_out_act_, grads->o_proj));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q, scratch_.Get(kDQ, DType::kF32, {t, q_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k, scratch_.Get(kDK, DType::kF32, {t, kv_dim}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_v, scratch_.Get(kDV, DType::kF32, {t, kv_dim}));
  MOETRAIN_RETURN_IF_ERROR(ops::CausalAttentionBackward(ctx_, shape_, q_, k_, v_, attn_out_, lse_,
                                                        d_attn, d_q, d_k, d_v));
  MOETRAIN_RETURN_IF_ERROR(ops::ApplyRope(ctx_, shape_, config_.rope_theta, /*inverse=*/true, d_q));
  MOETRAIN_RETURN_IF_ERROR(ops::ApplyRope(ctx_, shape_, config_.rope_theta, /*inverse=*/true, d_k));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_act, ToCompute(d_q, kDQAct));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k_act, ToCompute(d_k, kDKAct));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_v_act, ToCompute(d_v, kDVAct));
  const struct {
    const Linear& linear;
    TensorView d_proj, weight, grad;
  } projections[] = {{q_proj_, d_q_act, w.q_proj, grads->q_proj},
                     {k_proj_, d_k_act, w.k_proj, grads->k_proj},
                     {v_proj_, d_v_act, w.v_proj, grads->v_proj}};
  bool first = true;
  for (const auto& p : projections) {
    MOETRAIN_RETURN_IF_ERROR(
        p.linear.BackwardData(p.d_proj, p.weight, d_normed_attn, /*accumulate=*/!first));
    MOETRAIN_RETURN_IF_ERROR(p.linear.BackwardWeight(p.d_proj, normed_attn_, p.grad));
    first = false;
  }
  return absl::OkStatus();
}

}  // namespace moetrain
