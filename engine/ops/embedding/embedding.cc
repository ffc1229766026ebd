#include "engine/ops/embedding/embedding.h"

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/embedding/embedding_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/embedding/embedding_cuda.h"
#endif

namespace moetrain::ops {

absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab,
                         TensorView inputs, TensorView targets) {
  return SplitTokens(ctx, windows, vocab, /*offset=*/0, inputs, targets);
}

absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab, int64_t offset,
                         TensorView inputs, TensorView targets) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "split tokens", {{"windows", windows}, {"inputs", inputs}, {"targets", targets}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(windows, "tokens", DType::kI32, {-1, -1}));
  const int64_t b = windows.dim(0), w = windows.dim(1);
  const int64_t s = b >= 1 && inputs.rank() == 1 ? inputs.dim(0) / b : 0;
  if (b < 1 || s < 1 || offset < 0 || offset + s + 1 > w) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: expected (B, W) with B >= 1 holding S >= 1 inputs and targets from column ",
        offset, ", got ", windows.DebugString(), " for ", inputs.DebugString(), " inputs"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(inputs, "inputs", DType::kI32, {b * s}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(targets, "targets", DType::kI32, {b * s}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::SplitTokens(ctx, windows, vocab, offset, inputs, targets);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "split tokens");
  return cpu::SplitTokens(windows, vocab, offset, inputs, targets);
}

absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "embedding", {{"table", table}, {"tokens", tokens}, {"out", out}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(table, "embedding table", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(tokens, "embedding tokens", DType::kI32, {-1}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(out, "embedding out", DType::kF32, {tokens.dim(0), table.dim(1)}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::EmbeddingForward(ctx, table, tokens, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "embedding");
  return cpu::EmbeddingForward(ctx, table, tokens, out);
}

absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "embedding backward", {{"tokens", tokens}, {"d_out", d_out}, {"d_table", d_table}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_table, "embedding d_table", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(tokens, "embedding tokens", DType::kI32, {-1}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(d_out, "embedding d_out", DType::kF32, {tokens.dim(0), d_table.dim(1)}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::EmbeddingBackward(ctx, tokens, d_out, d_table);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "embedding backward");
  return cpu::EmbeddingBackward(ctx, tokens, d_out, d_table);
}

}  // namespace moetrain::ops
