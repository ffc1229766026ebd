#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/embedding/embedding.h"
#include "engine/ops/norm/rms_norm.h"

namespace moetrain {

absl::StatusOr<Transformer> Transformer::Create(const ModelConfig& config, DType compute_dtype,
                                                const ExpertParallelConfig& parallel,
                                                const ExecContext& ctx,
                                                const std::optional<Fp8RecipeConfig>& fp8,
                                                Recompute recompute) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_RETURN_IF_ERROR(CheckComputeDType(compute_dtype, "the transformer's compute dtype"));
  const int ep = parallel.expert_group != nullptr ? parallel.expert_group->size() : 1;
  if (config.moe.num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the expert group's ", ep,
                     " ranks do not divide model.moe.num_experts = ", config.moe.num_experts));
  }
  Transformer model(config, compute_dtype, ctx);
  if (fp8.has_value()) {
    MOETRAIN_RETURN_IF_ERROR(fp8->Validate());
    model.fp8_ = std::make_unique<Fp8State>(*fp8, ctx);
  }
  model.num_local_experts_ = config.moe.num_experts / ep;
  model.first_local_expert_ = ep > 1 ? parallel.expert_group->rank() * model.num_local_experts_ : 0;
  for (int64_t l = 0; l < config.total_blocks(); ++l) {
    MOETRAIN_ASSIGN_OR_RETURN(
        TransformerBlock block,
        TransformerBlock::Create(config, l >= config.first_dense_layers, compute_dtype, parallel,
                                 ctx, model.fp8_.get(), l));
    model.blocks_.push_back(std::move(block));
  }
  model.recompute_ = recompute;
  if (recompute != Recompute::kNone) {
    // One set of buffers (FULL) or of scratch buffers (SELECTIVE) for all blocks: the first
    // block's, and the first MoE block's MoE layer's (which the dense FFNs' share too).
    const bool kept_too = recompute == Recompute::kFull;
    const int64_t first_moe = std::min(config.first_dense_layers, config.total_blocks() - 1);
    for (int64_t l = 1; l < config.total_blocks(); ++l) {
      MOETRAIN_RETURN_IF_ERROR(model.blocks_[l].ShareWorkspacesOf(model.blocks_[0], kept_too));
    }
    for (int64_t l = 0; l < config.total_blocks(); ++l) {
      if (l == first_moe) continue;
      MOETRAIN_RETURN_IF_ERROR(
          model.blocks_[l].ShareWorkspacesOf(model.blocks_[first_moe], kept_too));
    }
  }
  if (model.fp8_ != nullptr) MOETRAIN_RETURN_IF_ERROR(model.fp8_->Allocate());
  MOETRAIN_RETURN_IF_ERROR(model.BuildParameters());
  return model;
}

absl::Status Transformer::PrepareTokens(TensorView tokens) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(tokens, "tokens", DType::kI32, {-1, -1}));
  const int64_t b = tokens.dim(0), s = tokens.dim(1) - 1 - config_.mtp_depth;
  if (config_.mtp_depth > 0 && s < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: ", tokens.DebugString(), " has no room for S >= 1 inputs and the ",
        config_.mtp_depth, " tokens past them that model.mtp_depth = ", config_.mtp_depth,
        " reads: expected (B, S + 1 + ", config_.mtp_depth, ")"));
  }
  if (s > config_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: sequence length S = ", s, " (", tokens.DebugString(),
                     ") exceeds model.max_seq_len = ", config_.max_seq_len));
  }
  // The data loader's windows are host memory: they travel to the model's device first.
  if (tokens.device() != ctx_.device() && b >= 1 && s >= 1) {
    MOETRAIN_ASSIGN_OR_RETURN(TensorView on_device,
                              workspace_.Get(kTokens, DType::kI32, {b, tokens.dim(1)}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx_, tokens, on_device));
    tokens = on_device;
  }
  windows_ = tokens;
  MOETRAIN_ASSIGN_OR_RETURN(inputs_,
                            workspace_.Get(kInputs, DType::kI32, {std::max<int64_t>(b * s, 0)}));
  MOETRAIN_ASSIGN_OR_RETURN(targets_,
                            workspace_.Get(kTargets, DType::kI32, {std::max<int64_t>(b * s, 0)}));
  MOETRAIN_RETURN_IF_ERROR(ops::SplitTokens(ctx_, tokens, config_.vocab_size, inputs_, targets_));
  batch_ = b;
  seq_len_ = s;
  return absl::OkStatus();
}

absl::Status Transformer::ForwardToFinalNorm(StepResult* result) {
  const int64_t layers = config_.num_layers, t = batch_ * seq_len_, d = config_.hidden_size;
  MOETRAIN_ASSIGN_OR_RETURN(residual_, workspace_.Get(kResidual, DType::kF32, {layers + 1, t, d}));
  MOETRAIN_RETURN_IF_ERROR(ops::EmbeddingForward(ctx_, embed_, inputs_, residual_.Select(0)));
  for (int64_t l = 0; l < layers; ++l) {
    MoeStats stats;
    const bool report = result != nullptr && blocks_[l].is_moe();
    MOETRAIN_RETURN_IF_ERROR(
        BlockForward(l, residual_.Select(l), residual_.Select(l + 1), report ? &stats : nullptr));
    if (report) {
      result->aux_loss += stats.aux_loss;
      result->z_loss += stats.z_loss;
      result->moe_layers.push_back(std::move(stats));
    }
  }
  MOETRAIN_ASSIGN_OR_RETURN(final_rstd_, workspace_.Get(kFinalRstd, DType::kF32, {t}));
  MOETRAIN_ASSIGN_OR_RETURN(final_normed_, workspace_.Get(kFinalNormed, dtype_, {t, d}));
  return ops::RmsNormForward(ctx_, residual_.Select(layers), final_norm_, config_.rms_norm_eps,
                             final_normed_, final_rstd_);
}

absl::Status Transformer::BlockForward(int64_t l, TensorView x, TensorView y, MoeStats* stats,
                                       bool rerun) {
  last_forward_ = -1;
  MOETRAIN_RETURN_IF_ERROR(
      blocks_[l].Forward(block_weights_[l], batch_, seq_len_, x, y, stats, rerun));
  last_forward_ = l;
  return absl::OkStatus();
}

absl::Status Transformer::RecomputeBlock(int64_t l, TensorView x, TensorView y) {
  if (recompute_ == Recompute::kNone || last_forward_ == l) return absl::OkStatus();
  const bool recording = fp8_ != nullptr && fp8_->recording();
  if (recording) fp8_->set_recording(false);
  absl::Status status;
  if (recompute_ == Recompute::kFull) {
    status = BlockForward(l, x, y, /*stats=*/nullptr, /*rerun=*/true);
  } else {
    last_forward_ = -1;
    status = blocks_[l].Recompute(block_weights_[l]);
    if (status.ok()) last_forward_ = l;
  }
  if (recording) fp8_->set_recording(true);
  return status;
}

int64_t Transformer::activation_bytes() const {
  std::vector<const Workspace*> workspaces = {&workspace_, &mtp_workspace_,
                                              &lm_head_workspace_.buffers()};
  int64_t kept = 0;
  for (const TransformerBlock& block : blocks_) {
    block.AppendWorkspaces(&workspaces);
    kept += block.kept_bytes();
  }
  return Workspace::DistinctBytes(workspaces) + kept;
}

const char* RecomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kFull:
      return "FULL";
    case Recompute::kSelective:
      return "SELECTIVE";
    case Recompute::kNone:
      break;
  }
  return "NONE";
}

std::optional<Recompute> RecomputeFromName(std::string_view name) {
  for (const Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()), RecomputeName(mode))) {
      return mode;
    }
  }
  return std::nullopt;
}

ops::LmHeadLossArgs Transformer::LmHeadArgs() const {
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
  MOETRAIN_RETURN_IF_ERROR(ForwardToFinalNorm(&result));

  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_final, workspace_.Get(kDFinal, DType::kF32, {t, d}));
  MOETRAIN_ASSIGN_OR_RETURN(
      result.loss, ops::LmHeadLossForwardBackward(
                       ctx_, LmHeadArgs(),
                       {.d_loss = loss_scale, .d_hidden = d_final, .d_weight = lm_head_grad_},
                       &lm_head_workspace_));

  // The MTP modules add their gradient of the final norm's output to the LM head's.
  if (config_.mtp_depth > 0) {
    MOETRAIN_RETURN_IF_ERROR(MtpForwardBackward(loss_scale, &result, d_final));
  }
  // d_residual carries dL/d(residual stream) down the blocks.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_residual, workspace_.Get(kDResidual, DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(ops::RmsNormBackward(ctx_, {.x = residual_.Select(layers),
                                                       .weight = final_norm_,
                                                       .rstd = final_rstd_,
                                                       .d_out = d_final,
                                                       .d_x = d_residual,
                                                       .d_weight = final_norm_grad_}));
  if (!options.backward_through_nonfinite_loss &&
      (!std::isfinite(result.loss) || !std::isfinite(result.aux_loss) ||
       !std::isfinite(result.z_loss) || !std::isfinite(result.mtp_loss))) {
    return NonFiniteError(absl::StrCat(
        "loss = ", result.loss, ", aux_loss = ", result.aux_loss, ", z_loss = ", result.z_loss,
        ", mtp_loss = ", result.mtp_loss, " (grads are partly accumulated: zero them)"));
  }
  MOETRAIN_RETURN_IF_ERROR(StageDone(options, 0));
  for (int64_t l = layers - 1; l >= 0; --l) {
    MOETRAIN_RETURN_IF_ERROR(RecomputeBlock(l, residual_.Select(l), residual_.Select(l + 1)));
    MOETRAIN_RETURN_IF_ERROR(
        blocks_[l].Backward(block_weights_[l], d_residual, &block_grads_[l], loss_scale));
    MOETRAIN_RETURN_IF_ERROR(StageDone(options, layers - l));
  }
  MOETRAIN_RETURN_IF_ERROR(ops::EmbeddingBackward(ctx_, inputs_, d_residual, embed_grad_));
  MOETRAIN_RETURN_IF_ERROR(StageDone(options, layers + 1));
  return result;
}

absl::StatusOr<float> Transformer::Evaluate(TensorView tokens) {
  MOETRAIN_RETURN_IF_ERROR(PrepareTokens(tokens));
  if (fp8_ != nullptr) fp8_->set_recording(false);
  const absl::Status forward = ForwardToFinalNorm(nullptr);
  if (fp8_ != nullptr) fp8_->set_recording(true);
  MOETRAIN_RETURN_IF_ERROR(forward);
  MOETRAIN_ASSIGN_OR_RETURN(const float loss,
                            ops::LmHeadLossForward(ctx_, LmHeadArgs(), &lm_head_workspace_));
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
  double attention = 2.0 * d * heads * dh + 2.0 * d * kv_heads * dh;
  // The core's products: q·kᵀ over the query/key width, p·v over the value width.
  double core_width = 2.0 * dh;
  if (config.is_mla()) {
    const MlaConfig& m = config.mla;
    const double rq = static_cast<double>(m.q_lora_rank), rkv = static_cast<double>(m.kv_lora_rank);
    const double dqk = static_cast<double>(m.qk_head_dim()), dv = static_cast<double>(m.v_head_dim);
    const double nope = static_cast<double>(m.qk_nope_head_dim);
    const double rope = static_cast<double>(m.qk_rope_head_dim);
    const double query = rq == 0 ? d * heads * dqk : d * rq + rq * heads * dqk;
    attention = query + d * (rkv + rope) + rkv * heads * (nope + dv) + heads * dv * d;
    core_width = dqk + dv;
  }
  const double dense_ffn = 3.0 * d * static_cast<double>(config.ffn_dim);
  const double active_experts = static_cast<double>(moe.top_k + moe.num_shared_experts);
  const double moe_ffn = static_cast<double>(moe.num_experts) * d +
                         active_experts * 3.0 * d * static_cast<double>(moe.expert_ffn_dim);
  const double lm_head = static_cast<double>(config.vocab_size) * d;
  // Each MTP module: eh_proj, an MoE block and the shared LM head once more.
  const double mtp = static_cast<double>(config.mtp_depth);
  const double matmul_params = (layers + mtp) * attention + dense_layers * dense_ffn +
                               (layers - dense_layers + mtp) * moe_ffn + lm_head * (1 + mtp) +
                               mtp * 2.0 * d * d;
  const double attention_core =
      (layers + mtp) * 3.0 * heads * core_width * static_cast<double>(seq_len + 1);
  return 6.0 * matmul_params + attention_core;
}

double Fp8SlotCount(const ModelConfig& config) {
  // Registered in block.cc, mla_attention.cc and moe_layer.cc. Attention: q, k, v, o; MLA: q (or
  // q_a and q_b), kv_a's latent and RoPE rows, kv_b, o. A dense FFN: gate_up, down. An MoE FFN:
  // the routed experts' gate_up and down, a group per expert, and the shared experts' two.
  const double attention = !config.is_mla() ? 4 : config.mla.q_lora_rank == 0 ? 5 : 6;
  const double dense_ffn = 2;
  const double moe_ffn =
      2 * static_cast<double>(config.moe.num_experts) + (config.moe.num_shared_experts > 0 ? 2 : 0);
  const double blocks = static_cast<double>(config.total_blocks());
  const double dense_blocks = static_cast<double>(config.first_dense_layers);
  return kNumFp8Roles *
         (blocks * attention + dense_blocks * dense_ffn + (blocks - dense_blocks) * moe_ffn);
}

}  // namespace moetrain
