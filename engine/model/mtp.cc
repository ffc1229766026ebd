// Multi-token prediction (DeepSeek-V3's MTP modules) of the transformer: module k (1-based)
// reads the previous depth's hidden state h_{k−1} and the embedding of the token k positions
// ahead, and predicts the token k + 1 ahead through the shared LM head. h_0 is the main model's
// output after its final norm, what the LM head reads: the hidden state that vLLM's and SGLang's
// DeepSeek-V3 MTP code is fed, so that exported MTP weights see what they were trained on.
//
//   x_k = eh_proj([RMSNorm_e(embed(tokens[t + k])) | RMSNorm_h(h_{k−1})]),  h_k = Block_k(x_k)
//   loss_k = CE(lm_head(RMSNorm_shared(h_k)), tokens[t + k + 1])
//
// The objective adds mtp_loss_weight · mean_k loss_k; every module runs at the model's sequence
// length, its tokens read from the windows' extra mtp_depth columns.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/model/compute_copy.h"
#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/embedding/embedding.h"
#include "engine/ops/norm/rms_norm.h"

namespace moetrain {
namespace {

// One module's buffers in Transformer::mtp_workspace_: slot k·kMtpBuffers + buffer.
enum MtpBuffer {
  kMtpInputs,
  kMtpTargets,
  kEmbedded,
  kRstdE,
  kNormedE,
  kRstdH,
  kNormedH,
  kConcat,
  kBlockIn,
  kHidden,
  kRstdS,
  kNormedS,
  kDNormedS,
  kDHidden,
  kDConcat,
  kDPart,
  kDEmbedded,
  kH0,
  kNumMtpBuffers
};

}  // namespace

absl::Status Transformer::MtpForwardBackward(float loss_scale, StepResult* result,
                                             TensorView d_final) {
  static_assert(kNumMtpBuffers <= kMtpBuffers);
  const int64_t depth = config_.mtp_depth, layers = config_.num_layers;
  const int64_t t = batch_ * seq_len_, d = config_.hidden_size;
  const float eps = config_.rms_norm_eps;
  const DType act = dtype_;
  const auto slot = [&](int64_t k, MtpBuffer b) { return static_cast<int>(k * kMtpBuffers + b); };
  const auto get = [&](int64_t k, MtpBuffer b, DType dtype, std::initializer_list<int64_t> shape) {
    return mtp_workspace_.Get(slot(k, b), dtype, shape);
  };
  // Each module's saved tensors, for the backward.
  struct Saved {
    TensorView inputs, targets, embedded, rstd_e, normed_e, h_in, rstd_h, normed_h, concat;
    TensorView block_in, hidden, rstd_s, normed_s, d_normed_s;
  };
  std::vector<Saved> saved(depth);
  // d loss_k / d logits: the objective weighs the mean over modules by mtp_loss_weight.
  const float d_loss = loss_scale * config_.mtp_loss_weight / static_cast<float>(depth);
  double loss_sum = 0;
  // h_0 in f32, as the norms read it (the bf16 final norm output widens exactly).
  TensorView h_prev = final_normed_;
  if (act != DType::kF32) {
    MOETRAIN_ASSIGN_OR_RETURN(h_prev, get(0, kH0, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, final_normed_, h_prev));
  }
  for (int64_t k = 0; k < depth; ++k) {
    Saved& m = saved[k];
    const MtpWeights& w = mtp_weights_[k];
    MOETRAIN_ASSIGN_OR_RETURN(m.inputs, get(k, kMtpInputs, DType::kI32, {t}));
    MOETRAIN_ASSIGN_OR_RETURN(m.targets, get(k, kMtpTargets, DType::kI32, {t}));
    MOETRAIN_RETURN_IF_ERROR(
        ops::SplitTokens(ctx_, windows_, config_.vocab_size, k + 1, m.inputs, m.targets));
    MOETRAIN_ASSIGN_OR_RETURN(m.embedded, get(k, kEmbedded, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::EmbeddingForward(ctx_, embed_, m.inputs, m.embedded));
    MOETRAIN_ASSIGN_OR_RETURN(m.rstd_e, get(k, kRstdE, DType::kF32, {t}));
    MOETRAIN_ASSIGN_OR_RETURN(m.normed_e, get(k, kNormedE, act, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(
        ops::RmsNormForward(ctx_, m.embedded, w.enorm, eps, m.normed_e, m.rstd_e));
    m.h_in = h_prev;
    MOETRAIN_ASSIGN_OR_RETURN(m.rstd_h, get(k, kRstdH, DType::kF32, {t}));
    MOETRAIN_ASSIGN_OR_RETURN(m.normed_h, get(k, kNormedH, act, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::RmsNormForward(ctx_, h_prev, w.hnorm, eps, m.normed_h, m.rstd_h));
    MOETRAIN_ASSIGN_OR_RETURN(m.concat, get(k, kConcat, act, {t, 2 * d}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyColumns(ctx_, m.normed_e, 0, m.concat, 0, d));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyColumns(ctx_, m.normed_h, 0, m.concat, d, d));
    MOETRAIN_ASSIGN_OR_RETURN(m.block_in, get(k, kBlockIn, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(mtp_eh_proj_.Forward(m.concat, w.eh_proj, m.block_in));
    MOETRAIN_ASSIGN_OR_RETURN(m.hidden, get(k, kHidden, DType::kF32, {t, d}));
    MoeStats stats;
    MOETRAIN_RETURN_IF_ERROR(BlockForward(layers + k, m.block_in, m.hidden, &stats));
    result->aux_loss += stats.aux_loss;
    result->z_loss += stats.z_loss;
    result->moe_layers.push_back(std::move(stats));
    MOETRAIN_ASSIGN_OR_RETURN(m.rstd_s, get(k, kRstdS, DType::kF32, {t}));
    MOETRAIN_ASSIGN_OR_RETURN(m.normed_s, get(k, kNormedS, act, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(
        ops::RmsNormForward(ctx_, m.hidden, w.shared_norm, eps, m.normed_s, m.rstd_s));
    MOETRAIN_ASSIGN_OR_RETURN(m.d_normed_s, get(k, kDNormedS, DType::kF32, {t, d}));
    MOETRAIN_ASSIGN_OR_RETURN(
        const float loss,
        ops::LmHeadLossForwardBackward(
            ctx_, {.hidden = m.normed_s, .weight = lm_head_, .targets = m.targets},
            {.d_loss = d_loss, .d_hidden = m.d_normed_s, .d_weight = lm_head_grad_},
            &lm_head_workspace_));
    loss_sum += loss;
    h_prev = m.hidden;
  }
  result->mtp_loss = static_cast<float>(loss_sum / static_cast<double>(depth));

  // Backward, deepest module first. d_hidden holds dL/dh_k: from module k+1's hnorm (written
  // there), plus module k's own loss through its shared norm (added here).
  for (int64_t k = depth - 1; k >= 0; --k) {
    Saved& m = saved[k];
    const MtpWeights& w = mtp_weights_[k];
    const MtpWeights& g = mtp_grads_[k];
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_hidden, get(k, kDHidden, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = m.hidden,
                                                         .weight = w.shared_norm,
                                                         .rstd = m.rstd_s,
                                                         .d_out = m.d_normed_s,
                                                         .d_x = d_hidden,
                                                         .d_weight = g.shared_norm,
                                                         .accumulate_d_x = k + 1 < depth}));
    // d_hidden becomes dL/d(block input).
    MOETRAIN_RETURN_IF_ERROR(RecomputeBlock(layers + k, m.block_in, m.hidden));
    MOETRAIN_RETURN_IF_ERROR(blocks_[layers + k].Backward(block_weights_[layers + k], d_hidden,
                                                          &block_grads_[layers + k], loss_scale));
    MOETRAIN_ASSIGN_OR_RETURN(  // into normed_s's slot: it is spent
        const TensorView d_in, ComputeCopy(ctx_, mtp_workspace_, act, d_hidden, slot(k, kNormedS)));
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_concat, get(k, kDConcat, DType::kF32, {t, 2 * d}));
    MOETRAIN_RETURN_IF_ERROR(mtp_eh_proj_.BackwardData(d_in, w.eh_proj, d_concat));
    MOETRAIN_RETURN_IF_ERROR(mtp_eh_proj_.BackwardWeight(d_in, m.concat, g.eh_proj));
    // The embedding's half: through enorm into the shared embedding's gradient.
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_part, get(k, kDPart, DType::kF32, {t, d}));
    MOETRAIN_ASSIGN_OR_RETURN(TensorView d_embedded, get(k, kDEmbedded, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyColumns(ctx_, d_concat, 0, d_part, 0, d));
    MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = m.embedded,
                                                         .weight = w.enorm,
                                                         .rstd = m.rstd_e,
                                                         .d_out = d_part,
                                                         .d_x = d_embedded,
                                                         .d_weight = g.enorm}));
    MOETRAIN_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx_, m.inputs, d_embedded, embed_grad_));
    // The hidden half: through hnorm into the previous depth's hidden state, or into h_0's
    // gradient, which holds the LM head's already.
    MOETRAIN_RETURN_IF_ERROR(ops::CopyColumns(ctx_, d_concat, d, d_part, 0, d));
    TensorView d_prev = d_final;
    if (k > 0) {
      MOETRAIN_ASSIGN_OR_RETURN(d_prev, get(k - 1, kDHidden, DType::kF32, {t, d}));
    }
    MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = m.h_in,
                                                         .weight = w.hnorm,
                                                         .rstd = m.rstd_h,
                                                         .d_out = d_part,
                                                         .d_x = d_prev,
                                                         .d_weight = g.hnorm,
                                                         .accumulate_d_x = k == 0}));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
