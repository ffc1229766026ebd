#include "engine/ops/router/router.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/router/router_cpu.h"
#include "engine/ops/router/router_cuda.h"

namespace moetrain::ops {
namespace {

absl::StatusOr<cpu::RouterExtents> CheckRouterArgs(const ExecContext& ctx, const char* op,
                                                   const MoeConfig& config,
                                                   const RouterArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, op, {{"logits", args.logits}, {"expert_bias", args.expert_bias}}));
  const int64_t num_experts = config.num_experts;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(args.logits, "logits", DType::kF32, {-1, num_experts}));
  if (config.expert_bias) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(args.expert_bias, "expert_bias", DType::kF32, {num_experts}));
  }
  const int64_t tokens = args.logits.dim(0);
  if (args.tokens_per_sequence < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens_per_sequence = ", args.tokens_per_sequence,
                     " must not be negative (0 = all tokens)"));
  }
  const int64_t seq_len = args.tokens_per_sequence == 0 ? tokens : args.tokens_per_sequence;
  if (seq_len > 0 && tokens % seq_len != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logits has T = ", tokens,
        " tokens, not a multiple of tokens_per_sequence = ", args.tokens_per_sequence));
  }
  return cpu::RouterExtents{tokens, num_experts, config.top_k,
                            config.aux_loss == AuxLossType::kSequence ? seq_len : tokens};
}

// The tensors of a RouterForward of these extents.
absl::Status CheckForward(const cpu::RouterExtents& x, const RouterOutput& forward) {
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(forward.scores, "forward.scores", DType::kF32, {T, E}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(forward.topk_experts, "forward.topk_experts", DType::kI32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(forward.topk_weights, "forward.topk_weights", DType::kF32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(forward.aux_counts, "forward.aux_counts", DType::kI64, {E + 1}));
  return CheckDenseTensor(forward.losses, "forward.losses", DType::kF32, {2});
}

}  // namespace

absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                           RouterOutput* out) {
  MOETRAIN_ASSIGN_OR_RETURN(const cpu::RouterExtents x,
                            CheckRouterArgs(ctx, "router", config, args));
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
#if MOETRAIN_HAVE_CUDA
  const bool on_cuda = ctx.device().type == DeviceType::kCuda;
#else
  const bool on_cuda = false;
#endif
  // Checked before the outputs are allocated: a device without a backend gets nothing.
  if (!ctx.device().is_cpu() && !on_cuda) return NoBackend(ctx, "router");
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->scores, DType::kF32, {T, E}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->topk_experts, DType::kI32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->topk_weights, DType::kF32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->tokens_per_expert, DType::kI64, {E}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->aux_counts, DType::kI64, {E + 1}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->losses, DType::kF32, {2}));
#if MOETRAIN_HAVE_CUDA
  if (on_cuda) return cuda::RouterForward(ctx, config, x, args, out);
#endif
  return cpu::RouterForward(ctx, config, x, args, out);
}

absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                           RouterOutput* out) {
  MOETRAIN_ASSIGN_OR_RETURN(const cpu::RouterExtents x,
                            CheckRouterArgs(ctx, "router aux loss", config, args));
  MOETRAIN_RETURN_IF_ERROR(CheckForward(x, *out));
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "router aux loss",
                                        {{"scores", out->scores},
                                         {"topk_experts", out->topk_experts},
                                         {"aux_counts", out->aux_counts},
                                         {"losses", out->losses}}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::RouterAuxLoss(ctx, config, x, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "router aux loss");
  return cpu::RouterAuxLoss(ctx, config, x, out);
}

absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights,
                            TensorView d_logits, float loss_weight) {
  MOETRAIN_ASSIGN_OR_RETURN(const cpu::RouterExtents x,
                            CheckRouterArgs(ctx, "router backward", config, args));
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "router backward",
                                        {{"forward.scores", forward.scores},
                                         {"forward.topk_experts", forward.topk_experts},
                                         {"forward.topk_weights", forward.topk_weights},
                                         {"forward.aux_counts", forward.aux_counts},
                                         {"d_topk_weights", d_topk_weights},
                                         {"d_logits", d_logits}}));
  MOETRAIN_RETURN_IF_ERROR(CheckForward(x, forward));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(d_topk_weights, "d_topk_weights", DType::kF32, {x.tokens, x.top_k}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_logits, "d_logits", DType::kF32, {x.tokens, x.experts}));
  if (!(loss_weight > 0.0f) || !std::isfinite(loss_weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_weight = ", loss_weight, " must be positive and finite"));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::RouterBackward(ctx, config, x, args, forward, d_topk_weights, d_logits,
                                loss_weight);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "router backward");
  return cpu::RouterBackward(ctx, config, x, args, forward, d_topk_weights, d_logits, loss_weight);
}

absl::Status UpdateExpertBias(const ExecContext& ctx, TensorView tokens_per_expert, float rate,
                              TensorView bias) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "expert bias update", {{"tokens_per_expert", tokens_per_expert}, {"bias", bias}}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(tokens_per_expert, "tokens_per_expert", DType::kI64, {-1}));
  const int64_t num_experts = tokens_per_expert.dim(0);
  if (num_experts == 0) return absl::InvalidArgumentError("tokens_per_expert is empty");
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(bias, "bias", DType::kF32, {num_experts}));
  if (!(rate >= 0.0f) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate = ", rate, " must be non-negative and finite"));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::UpdateExpertBias(ctx, tokens_per_expert, rate, bias);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "expert bias update");
  return cpu::UpdateExpertBias(tokens_per_expert, rate, bias);
}

}  // namespace moetrain::ops
