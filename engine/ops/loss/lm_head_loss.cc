// The chunked LM head: GEMMs through ops::Gemm, and between them the backend's cross-entropy
// rows (CheckTargets refuses a device it does not serve before anything runs).
#include "engine/ops/loss/lm_head_loss.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/loss/lm_head_loss_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/loss/lm_head_loss_cuda.h"
#endif

namespace moetrain::ops {
namespace {

absl::Status CheckLmHeadArgs(const ExecContext& ctx, const LmHeadLossArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "lm_head",
                   {{"hidden", args.hidden}, {"weight", args.weight}, {"targets", args.targets}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.hidden, "lm_head hidden", {-1, -1}));
  const int64_t t = args.hidden.dim(0), d = args.hidden.dim(1);
  if (t < 1) return absl::InvalidArgumentError("lm_head hidden: needs at least one token");
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(args.weight, "lm_head weight", args.hidden.dtype(), {-1, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.targets, "lm_head targets", DType::kI32, {t}));
  if (args.chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lm_head chunk_tokens = ", args.chunk_tokens, " must not be negative"));
  }
  return absl::OkStatus();
}

// The backend's parts of the loss, between the chunks' GEMMs.
absl::Status CheckTargets(const ExecContext& ctx, TensorView targets, int64_t vocab) {
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::CheckTargets(ctx, targets, vocab);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "lm_head");
  return cpu::CheckTargets(targets, vocab);
}

// On the device CheckTargets accepted (the CPU or a CUDA device); arguments checked.
absl::Status CrossEntropyRowsOn(const ExecContext& ctx, TensorView z, TensorView targets,
                                TensorView token_loss, TensorView d_logits, float scale) {
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::CrossEntropyRows(ctx, z, targets, token_loss, d_logits, scale);
  }
#endif
  cpu::CrossEntropyRows(ctx, z, targets, token_loss, d_logits, scale);
  return absl::OkStatus();
}

absl::StatusOr<double> SumInOrder(const ExecContext& ctx, TensorView token_loss) {
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::SumInOrder(ctx, token_loss);
#endif
  return cpu::SumInOrder(token_loss);
}

// Forward (and with `grads`, backward) over the chunks.
absl::StatusOr<float> LmHeadLoss(const ExecContext& ctx, const LmHeadLossArgs& args,
                                 const LmHeadLossGrads* grads, LmHeadLossWorkspace* workspace) {
  MOETRAIN_RETURN_IF_ERROR(CheckLmHeadArgs(ctx, args));
  const int64_t t = args.hidden.dim(0), d = args.hidden.dim(1), v = args.weight.dim(0);
  const DType act = args.hidden.dtype();
  if (grads != nullptr) {
    MOETRAIN_RETURN_IF_ERROR(CheckDevices(
        ctx, "lm_head", {{"d_hidden", grads->d_hidden}, {"d_weight", grads->d_weight}}));
    MOETRAIN_RETURN_IF_ERROR(
        CheckDenseTensor(grads->d_hidden, "lm_head d_hidden", DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(
        CheckDenseTensor(grads->d_weight, "lm_head d_weight", DType::kF32, {v, d}));
  }
  // Every target before the first GEMM: an error leaves the gradients untouched.
  MOETRAIN_RETURN_IF_ERROR(CheckTargets(ctx, args.targets, v));
  std::optional<LmHeadLossWorkspace> local;
  if (workspace == nullptr) workspace = &local.emplace(ctx);
  Workspace& ws = workspace->buffers();
  const int64_t chunk =
      args.chunk_tokens > 0 ? std::min(t, args.chunk_tokens) : DefaultLmHeadChunkTokens(t, v);
  using Buffer = LmHeadLossWorkspace::Buffer;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView logits, ws.Get(Buffer::kLogits, DType::kF32, {chunk, v}));
  TensorView d_logits;
  if (grads != nullptr) {
    MOETRAIN_ASSIGN_OR_RETURN(d_logits, ws.Get(Buffer::kDLogits, act, {chunk, v}));
  }
  MOETRAIN_ASSIGN_OR_RETURN(TensorView token_loss, ws.Get(Buffer::kTokenLoss, DType::kF32, {t}));
  // d loss / d z_{t,v} = (softmax(z_t)_v − [v = target_t]) / T, times d_loss.
  const float scale = grads != nullptr ? grads->d_loss / static_cast<float>(t) : 0.0f;

  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t rows = std::min(chunk, t - t0);
    TensorView hidden = args.hidden.Slice(t0, t0 + rows);
    TensorView z = logits.Slice(0, rows);
    MOETRAIN_RETURN_IF_ERROR(Gemm(ctx, {.a = hidden, .b = args.weight, .c = z, .trans_b = true}));
    const TensorView dz = grads != nullptr ? d_logits.Slice(0, rows) : TensorView();
    MOETRAIN_RETURN_IF_ERROR(CrossEntropyRowsOn(ctx, z, args.targets.Slice(t0, t0 + rows),
                                                token_loss.Slice(t0, t0 + rows), dz, scale));
    if (grads == nullptr) continue;
    MOETRAIN_RETURN_IF_ERROR(
        Gemm(ctx, {.a = dz, .b = args.weight, .c = grads->d_hidden.Slice(t0, t0 + rows)}));
    MOETRAIN_RETURN_IF_ERROR(Gemm(
        ctx, {.a = dz, .b = hidden, .c = grads->d_weight, .trans_a = true, .accumulate = true}));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const double total, SumInOrder(ctx, token_loss));
  return static_cast<float>(total / static_cast<double>(t));
}

}  // namespace

absl::StatusOr<float> LmHeadLossForward(const ExecContext& ctx, const LmHeadLossArgs& args,
                                        LmHeadLossWorkspace* workspace) {
  return LmHeadLoss(ctx, args, nullptr, workspace);
}

absl::Status CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                              TensorView token_loss, TensorView d_logits, float scale) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "cross-entropy rows",
      {{"z", z}, {"targets", targets}, {"token_loss", token_loss}, {"d_logits", d_logits}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(z, "cross-entropy z", DType::kF32, {-1, -1}));
  const int64_t rows = z.dim(0), v = z.dim(1);
  if (rows < 1) return absl::InvalidArgumentError("cross-entropy z: needs at least one row");
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(targets, "cross-entropy targets", DType::kI32, {rows}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(token_loss, "cross-entropy token_loss", DType::kF32, {rows}));
  if (!d_logits.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckAct(d_logits, "cross-entropy d_logits", {rows, v}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckTargets(ctx, targets, v));
  return CrossEntropyRowsOn(ctx, z, targets, token_loss, d_logits, scale);
}

absl::StatusOr<float> LmHeadLossForwardBackward(const ExecContext& ctx, const LmHeadLossArgs& args,
                                                const LmHeadLossGrads& grads,
                                                LmHeadLossWorkspace* workspace) {
  return LmHeadLoss(ctx, args, &grads, workspace);
}

}  // namespace moetrain::ops
