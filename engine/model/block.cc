#include "engine/model/block.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/elementwise.h"
#include "engine/backend/cpu/gemm.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/model/layers.h"

namespace moetrain {
namespace {

#define MOETRAIN_BLOCK_ROW_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))

MOETRAIN_BLOCK_ROW_CLONES void AddRow(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// out (T, D) f32 = residual (T, D) f32 + branch (T, D) act: the MoE layer's output joins the
// residual stream (its output is in the compute dtype, so no GEMM can accumulate it in place).
void AddBranch(TensorView residual, TensorView branch, TensorView out) {
  const int64_t t = residual.dim(0), d = residual.dim(1);
  DefaultThreadPool().ParallelFor(
      t, std::max<int64_t>(1, 16384 / d), [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> widened;
        if (static_cast<int64_t>(widened.size()) < d) widened.resize(d);
        for (int64_t r = begin; r < end; ++r) {
          const float* b = widened.data();
          if (branch.dtype() == DType::kBF16) {
            ConvertBF16ToF32(branch.data<BF16>() + r * d, widened.data(), d);
          } else {
            b = branch.data<float>() + r * d;
          }
          AddRow(residual.data<float>() + r * d, b, d, out.data<float>() + r * d);
        }
      });
}

absl::Status CheckStream(const TensorView& t, const char* name, int64_t tokens, int64_t d) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(t, name, DType::kF32, {tokens, d}));
  if (!t.is_contiguous()) return absl::InvalidArgumentError(absl::StrCat(name, ": not contiguous"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TransformerBlock> TransformerBlock::Create(const ModelConfig& config, bool moe,
                                                          DType compute_dtype,
                                                          const ExpertParallelConfig& parallel) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute dtype ", std::string(DTypeName(compute_dtype)),
                     " is not supported by the transformer block (f32, bf16)"));
  }
  TransformerBlock block(config, compute_dtype);
  if (moe) {
    MOETRAIN_ASSIGN_OR_RETURN(
        MoeLayer layer, MoeLayer::Create(config.moe, config.hidden_size, compute_dtype, parallel));
    block.moe_.emplace(std::move(layer));
  }
  return block;
}

absl::StatusOr<TensorView> TransformerBlock::ToCompute(TensorView src, Tensor& buf) {
  if (dtype_ == DType::kF32) return src;
  TensorView dst = Workspace(buf, dtype_, {src.dim(0), src.dim(1)});
  MOETRAIN_RETURN_IF_ERROR(cpu::ConvertTensor(src, dst));
  return dst;
}

absl::Status TransformerBlock::Forward(const BlockWeights& w, int64_t batch, int64_t seq_len,
                                       TensorView x, TensorView y, float aux_loss_scale,
                                       MoeStats* stats) {
  has_forward_ = false;
  const int64_t d = config_.hidden_size, dh = config_.resolved_head_dim();
  const int64_t q_dim = config_.num_heads * dh, kv_dim = config_.num_kv_heads * dh;
  const int64_t t = batch * seq_len;
  MOETRAIN_RETURN_IF_ERROR(CheckStream(x, "block x", t, d));
  MOETRAIN_RETURN_IF_ERROR(CheckStream(y, "block y", t, d));
  shape_ = {.batch = batch,
            .seq_len = seq_len,
            .num_heads = config_.num_heads,
            .num_kv_heads = config_.num_kv_heads,
            .head_dim = dh};
  const float eps = config_.rms_norm_eps;

  // Attention.
  rstd_attn_ = Workspace(buffers_[kRstdAttn], DType::kF32, {t});
  normed_attn_ = Workspace(buffers_[kNormedAttn], dtype_, {t, d});
  MOETRAIN_RETURN_IF_ERROR(RmsNormForward(x, w.input_norm, eps, normed_attn_, rstd_attn_));
  q_ = Workspace(buffers_[kQ], DType::kF32, {t, q_dim});
  k_ = Workspace(buffers_[kK], DType::kF32, {t, kv_dim});
  v_ = Workspace(buffers_[kV], DType::kF32, {t, kv_dim});
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = normed_attn_, .b = w.q_proj, .c = q_, .trans_b = true}));
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = normed_attn_, .b = w.k_proj, .c = k_, .trans_b = true}));
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = normed_attn_, .b = w.v_proj, .c = v_, .trans_b = true}));
  MOETRAIN_RETURN_IF_ERROR(ApplyRope(shape_, config_.rope_theta, /*inverse=*/false, q_));
  MOETRAIN_RETURN_IF_ERROR(ApplyRope(shape_, config_.rope_theta, /*inverse=*/false, k_));
  attn_out_ = Workspace(buffers_[kAttnOut], DType::kF32, {t, q_dim});
  lse_ = Workspace(buffers_[kLse], DType::kF32, {batch, config_.num_heads, seq_len});
  MOETRAIN_RETURN_IF_ERROR(CausalAttentionForward(shape_, q_, k_, v_, attn_out_, lse_));
  MOETRAIN_ASSIGN_OR_RETURN(attn_out_act_, ToCompute(attn_out_, buffers_[kAttnOutAct]));
  // a = x + o_proj(attention): the GEMM accumulates onto a copy of the residual.
  mid_ = Workspace(buffers_[kMid], DType::kF32, {t, d});
  MOETRAIN_RETURN_IF_ERROR(cpu::ConvertTensor(x, mid_));
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
      {.a = attn_out_act_, .b = w.o_proj, .c = mid_, .trans_b = true, .accumulate = true}));

  // FFN.
  rstd_ffn_ = Workspace(buffers_[kRstdFfn], DType::kF32, {t});
  normed_ffn_ = Workspace(buffers_[kNormedFfn], dtype_, {t, d});
  MOETRAIN_RETURN_IF_ERROR(
      RmsNormForward(mid_, w.post_attention_norm, eps, normed_ffn_, rstd_ffn_));
  if (!is_moe()) {
    const int64_t f = config_.ffn_dim;
    gate_up_ = Workspace(buffers_[kGateUp], DType::kF32, {t, 2 * f});
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = normed_ffn_, .b = w.mlp_gate_up, .c = gate_up_, .trans_b = true}));
    activated_ = Workspace(buffers_[kActivated], dtype_, {t, f});
    MOETRAIN_RETURN_IF_ERROR(cpu::SwigluForward(gate_up_, activated_));
    MOETRAIN_RETURN_IF_ERROR(cpu::ConvertTensor(mid_, y));
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = activated_, .b = w.mlp_down, .c = y, .trans_b = true, .accumulate = true}));
  } else {
    if (!(aux_loss_scale > 0.0f) || !std::isfinite(aux_loss_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("aux_loss_scale = ", aux_loss_scale, " must be positive and finite"));
    }
    aux_loss_scale_ = aux_loss_scale;
    TensorView moe_out = Workspace(buffers_[kMoeOut], dtype_, {t, d});
    MOETRAIN_RETURN_IF_ERROR(moe_->Forward(w.moe, normed_ffn_, seq_len, moe_out, stats));
    AddBranch(mid_, moe_out, y);
  }
  x_ = x;
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status TransformerBlock::Backward(const BlockWeights& w, TensorView d, BlockGrads* grads) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("TransformerBlock::Backward needs a successful Forward");
  }
  if (grads == nullptr) return absl::InvalidArgumentError("block grads: null");
  const int64_t t = x_.dim(0), dim = config_.hidden_size;
  const int64_t q_dim = q_.dim(1), kv_dim = k_.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckStream(d, "block d", t, dim));

  // FFN: d holds dL/dy = dL/d(ffn out); the norm's backward then adds its part, giving dL/da.
  TensorView d_normed_ffn;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_act, ToCompute(d, buffers_[kDAct]));
  if (!is_moe()) {
    const int64_t f = config_.ffn_dim;
    TensorView d_hidden = Workspace(buffers_[kDFfnHidden], DType::kF32, {t, f});
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_act, .b = w.mlp_down, .c = d_hidden}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
        {.a = d_act, .b = activated_, .c = grads->mlp_down, .trans_a = true, .accumulate = true}));
    TensorView d_gate_up = Workspace(buffers_[kDGateUp], dtype_, {t, 2 * f});
    MOETRAIN_RETURN_IF_ERROR(cpu::SwigluBackward(gate_up_, d_hidden, d_gate_up));
    d_normed_ffn = Workspace(buffers_[kDNormed], DType::kF32, {t, dim});
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_gate_up, .b = w.mlp_gate_up, .c = d_normed_ffn}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_gate_up,
                                        .b = normed_ffn_,
                                        .c = grads->mlp_gate_up,
                                        .trans_a = true,
                                        .accumulate = true}));
  } else {
    d_normed_ffn = Workspace(buffers_[kDNormedAct], dtype_, {t, dim});
    MOETRAIN_RETURN_IF_ERROR(
        moe_->Backward(w.moe, d_act, d_normed_ffn, &grads->moe, aux_loss_scale_));
  }
  MOETRAIN_RETURN_IF_ERROR(RmsNormBackward({.x = mid_,
                                            .weight = w.post_attention_norm,
                                            .rstd = rstd_ffn_,
                                            .d_out = d_normed_ffn,
                                            .d_x = d,
                                            .d_weight = grads->post_attention_norm,
                                            .accumulate_d_x = true}));

  // Attention: d holds dL/da; the input norm's backward adds its part, giving dL/dx.
  MOETRAIN_ASSIGN_OR_RETURN(d_act, ToCompute(d, buffers_[kDAct]));
  TensorView d_attn = Workspace(buffers_[kDAttn], DType::kF32, {t, q_dim});
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_act, .b = w.o_proj, .c = d_attn}));
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
      {.a = d_act, .b = attn_out_act_, .c = grads->o_proj, .trans_a = true, .accumulate = true}));
  TensorView d_q = Workspace(buffers_[kDQ], DType::kF32, {t, q_dim});
  TensorView d_k = Workspace(buffers_[kDK], DType::kF32, {t, kv_dim});
  TensorView d_v = Workspace(buffers_[kDV], DType::kF32, {t, kv_dim});
  MOETRAIN_RETURN_IF_ERROR(
      CausalAttentionBackward(shape_, q_, k_, v_, attn_out_, lse_, d_attn, d_q, d_k, d_v));
  MOETRAIN_RETURN_IF_ERROR(ApplyRope(shape_, config_.rope_theta, /*inverse=*/true, d_q));
  MOETRAIN_RETURN_IF_ERROR(ApplyRope(shape_, config_.rope_theta, /*inverse=*/true, d_k));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_q_act, ToCompute(d_q, buffers_[kDQAct]));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_k_act, ToCompute(d_k, buffers_[kDKAct]));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_v_act, ToCompute(d_v, buffers_[kDVAct]));
  TensorView d_normed_attn = Workspace(buffers_[kDNormed], DType::kF32, {t, dim});
  const struct {
    TensorView d_proj, weight, grad;
  } projections[] = {{d_q_act, w.q_proj, grads->q_proj},
                     {d_k_act, w.k_proj, grads->k_proj},
                     {d_v_act, w.v_proj, grads->v_proj}};
  bool first = true;
  for (const auto& p : projections) {
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = p.d_proj, .b = p.weight, .c = d_normed_attn, .accumulate = !first}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
        {.a = p.d_proj, .b = normed_attn_, .c = p.grad, .trans_a = true, .accumulate = true}));
    first = false;
  }
  return RmsNormBackward({.x = x_,
                          .weight = w.input_norm,
                          .rstd = rstd_attn_,
                          .d_out = d_normed_attn,
                          .d_x = d,
                          .d_weight = grads->input_norm,
                          .accumulate_d_x = true});
}

}  // namespace moetrain
