#include "engine/model/transformer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain {

absl::StatusOr<Transformer> Transformer::Create(const ModelConfig& config, DType compute_dtype,
                                                const ExpertParallelConfig& parallel) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute dtype ", std::string(DTypeName(compute_dtype)),
                     " is not supported by the transformer (f32, bf16)"));
  }
  const int ep = parallel.expert_group != nullptr ? parallel.expert_group->size() : 1;
  if (config.moe.num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the expert group's ", ep,
                     " ranks do not divide model.moe.num_experts = ", config.moe.num_experts));
  }
  Transformer model(config, compute_dtype);
  model.num_local_experts_ = config.moe.num_experts / ep;
  model.first_local_expert_ = ep > 1 ? parallel.expert_group->rank() * model.num_local_experts_ : 0;
  for (int64_t l = 0; l < config.num_layers; ++l) {
    MOETRAIN_ASSIGN_OR_RETURN(
        TransformerBlock block,
        TransformerBlock::Create(config, l >= config.first_dense_layers, compute_dtype, parallel));
    model.blocks_.push_back(std::move(block));
  }
  model.BuildParameters();
  return model;
}

absl::Status Transformer::PrepareTokens(TensorView tokens) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(tokens, "tokens", DType::kI32, {-1, -1}));
  if (!tokens.is_contiguous()) return absl::InvalidArgumentError("tokens: must be contiguous");
  const int64_t b = tokens.dim(0), s = tokens.dim(1) - 1;
  if (b < 1 || s < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: expected (B, S + 1) with B >= 1 and S >= 1, got ", tokens.DebugString()));
  }
  if (s > config_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: sequence length S = ", s, " (", tokens.DebugString(),
                     ") exceeds model.max_seq_len = ", config_.max_seq_len));
  }
  const int32_t* ids = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", i / (s + 1), ", ", i % (s + 1), "] = ", ids[i],
          " is outside the vocabulary [0, model.vocab_size = ", config_.vocab_size, ")"));
    }
  }
  batch_ = b;
  seq_len_ = s;
  inputs_ = Workspace(buffers_[kInputs], DType::kI32, {b * s});
  targets_ = Workspace(buffers_[kTargets], DType::kI32, {b * s});
  for (int64_t row = 0; row < b; ++row) {
    std::memcpy(inputs_.data<int32_t>() + row * s, ids + row * (s + 1), s * sizeof(int32_t));
    std::memcpy(targets_.data<int32_t>() + row * s, ids + row * (s + 1) + 1, s * sizeof(int32_t));
  }
  return absl::OkStatus();
}

absl::Status Transformer::ForwardToFinalNorm(float loss_scale, StepResult* result) {
  const int64_t layers = config_.num_layers, t = batch_ * seq_len_, d = config_.hidden_size;
  residual_ = Workspace(buffers_[kResidual], DType::kF32, {layers + 1, t, d});
  MOETRAIN_RETURN_IF_ERROR(EmbeddingForward(embed_, inputs_, residual_.Select(0)));
  for (int64_t l = 0; l < layers; ++l) {
    MoeStats stats;
    const bool report = result != nullptr && blocks_[l].is_moe();
    MOETRAIN_RETURN_IF_ERROR(blocks_[l].Forward(block_weights_[l], batch_, seq_len_,
                                                residual_.Select(l), residual_.Select(l + 1),
                                                loss_scale, report ? &stats : nullptr));
    if (report) {
      result->aux_loss += stats.aux_loss;
      result->z_loss += stats.z_loss;
      result->moe_layers.push_back(std::move(stats));
    }
  }
  final_rstd_ = Workspace(buffers_[kFinalRstd], DType::kF32, {t});
  final_normed_ = Workspace(buffers_[kFinalNormed], dtype_, {t, d});
  return RmsNormForward(residual_.Select(layers), final_norm_, config_.rms_norm_eps, final_normed_,
                        final_rstd_);
}

LmHeadLossArgs Transformer::LmHeadArgs() const {
  return {.hidden = final_normed_, .weight = lm_head_, .targets = targets_};
}

absl::Status Transformer::StageDone(const BackwardOptions& options, int64_t stage) {
  return options.on_stage_done ? options.on_stage_done(stage) : absl::OkStatus();
}

absl::StatusOr<StepResult> Transformer::ForwardBackward(TensorView tokens, float loss_scale) {
  BackwardOptions options;
  options.loss_scale = loss_scale;
  return ForwardBackward(tokens, options);
}

absl::StatusOr<StepResult> Transformer::ForwardBackward(TensorView tokens,
                                                        const BackwardOptions& options) {
  const float loss_scale = options.loss_scale;
  if (!(loss_scale > 0.0f) || !std::isfinite(loss_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_scale = ", loss_scale, " must be positive and finite"));
  }
  MOETRAIN_RETURN_IF_ERROR(PrepareTokens(tokens));
  const int64_t layers = config_.num_layers, t = batch_ * seq_len_, d = config_.hidden_size;
  StepResult result;
  result.tokens = t;
  loss_scale_ = loss_scale;
  MOETRAIN_RETURN_IF_ERROR(ForwardToFinalNorm(loss_scale, &result));

  TensorView d_final = Workspace(buffers_[kDFinal], DType::kF32, {t, d});
  MOETRAIN_ASSIGN_OR_RETURN(
      result.loss,
      LmHeadLossForwardBackward(
          LmHeadArgs(), {.d_loss = loss_scale, .d_hidden = d_final, .d_weight = lm_head_grad_},
          &lm_head_workspace_));
  if (!options.backward_through_nonfinite_loss &&
      (!std::isfinite(result.loss) || !std::isfinite(result.aux_loss) ||
       !std::isfinite(result.z_loss))) {
    return NonFiniteError(absl::StrCat("loss = ", result.loss, ", aux_loss = ", result.aux_loss,
                                       ", z_loss = ", result.z_loss,
                                       " (grads are partly accumulated: zero them)"));
  }
  // d_residual carries dL/d(residual stream) down the blocks.
  TensorView d_residual = Workspace(buffers_[kDResidual], DType::kF32, {t, d});
  MOETRAIN_RETURN_IF_ERROR(RmsNormBackward({.x = residual_.Select(layers),
                                            .weight = final_norm_,
                                            .rstd = final_rstd_,
                                            .d_out = d_final,
                                            .d_x = d_residual,
                                            .d_weight = final_norm_grad_}));
  MOETRAIN_RETURN_IF_ERROR(StageDone(options, 0));
  for (int64_t l = layers - 1; l >= 0; --l) {
    MOETRAIN_RETURN_IF_ERROR(blocks_[l].Backward(block_weights_[l], d_residual, &block_grads_[l]));
    MOETRAIN_RETURN_IF_ERROR(StageDone(options, layers - l));
  }
  MOETRAIN_RETURN_IF_ERROR(EmbeddingBackward(inputs_, d_residual, embed_grad_));
  MOETRAIN_RETURN_IF_ERROR(StageDone(options, layers + 1));
  return result;
}

absl::StatusOr<float> Transformer::Evaluate(TensorView tokens) {
  MOETRAIN_RETURN_IF_ERROR(PrepareTokens(tokens));
  // The training loss scale, so that the MoE layers keep their set-up (it only scales aux
  // losses, which are not reported here).
  MOETRAIN_RETURN_IF_ERROR(ForwardToFinalNorm(loss_scale_, nullptr));
  MOETRAIN_ASSIGN_OR_RETURN(const float loss, LmHeadLossForward(LmHeadArgs(), &lm_head_workspace_));
  if (!std::isfinite(loss)) return NonFiniteError(absl::StrCat("evaluation loss = ", loss));
  return loss;
}

double TrainingFlopsPerToken(const ModelConfig& config, int64_t seq_len) {
  const MoeConfig& moe = config.moe;
  const double d = static_cast<double>(config.hidden_size);
  const double dh = static_cast<double>(config.resolved_head_dim());
  const double heads = static_cast<double>(config.num_heads);
  const double kv_heads = static_cast<double>(config.num_kv_heads);
  const double layers = static_cast<double>(config.num_layers);
  const double dense_layers = static_cast<double>(config.first_dense_layers);
  const double attention = 2.0 * d * heads * dh + 2.0 * d * kv_heads * dh;
  const double dense_ffn = 3.0 * d * static_cast<double>(config.ffn_dim);
  const double active_experts = static_cast<double>(moe.top_k + moe.num_shared_experts);
  const double moe_ffn = static_cast<double>(moe.num_experts) * d +
                         active_experts * 3.0 * d * static_cast<double>(moe.expert_ffn_dim);
  const double lm_head = static_cast<double>(config.vocab_size) * d;
  const double matmul_params =
      layers * attention + dense_layers * dense_ffn + (layers - dense_layers) * moe_ffn + lm_head;
  const double attention_core = layers * 6.0 * heads * dh * static_cast<double>(seq_len + 1);
  return 6.0 * matmul_params + attention_core;
}

}  // namespace moetrain
