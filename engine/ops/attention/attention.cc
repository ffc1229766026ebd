#include "engine/ops/attention/attention.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/attention/attention_cpu.h"
#include "engine/ops/common/op_checks.h"

#if MOETRAIN_HAVE_CUDA
#include "engine/ops/attention/attention_cuda.h"
#endif

namespace moetrain::ops {
namespace {

// f32 of `dims`, and dense: rows are addressed as data + row · columns.
absl::Status CheckDense(const TensorView& t, const char* name,
                        std::initializer_list<int64_t> dims) {
  return CheckDenseTensor(t, name, DType::kF32, dims);
}

// The shape and the forward's tensors, validated.
absl::Status CheckForwardArgs(const ExecContext& ctx, const char* op, const AttentionShape& s,
                              const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, op, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAttentionShape(s));
  const int64_t rows = s.batch * s.seq_len;
  const int64_t q_ld = s.num_heads * s.head_dim, kv_ld = s.num_kv_heads * s.head_dim;
  MOETRAIN_RETURN_IF_ERROR(CheckDense(q, "q", {rows, q_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(k, "k", {rows, kv_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(v, "v", {rows, kv_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(out, "out", {rows, q_ld}));
  return CheckDense(lse, "lse", {s.batch, s.num_heads, s.seq_len});
}

}  // namespace

absl::Status CheckAttentionShape(const AttentionShape& shape) {
  const std::pair<const char*, int64_t> fields[] = {{"batch", shape.batch},
                                                    {"seq_len", shape.seq_len},
                                                    {"num_heads", shape.num_heads},
                                                    {"num_kv_heads", shape.num_kv_heads},
                                                    {"head_dim", shape.head_dim}};
  for (const auto& [name, value] : fields) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape.", name, " = ", value, " must be positive"));
    }
  }
  if (shape.num_heads % shape.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape.num_kv_heads = ", shape.num_kv_heads,
                     " does not divide shape.num_heads = ", shape.num_heads));
  }
  if (shape.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape.head_dim = ", shape.head_dim, " must be even (RoPE rotates pairs of features)"));
  }
  return absl::OkStatus();
}

absl::Status CausalAttentionForward(const ExecContext& ctx, const AttentionShape& shape,
                                    TensorView q, TensorView k, TensorView v, TensorView out,
                                    TensorView lse) {
  MOETRAIN_RETURN_IF_ERROR(CheckForwardArgs(ctx, "attention", shape, q, k, v, out, lse));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::CausalAttentionForward(ctx, shape, q, k, v, out, lse);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "attention");
  cpu::CausalAttentionForward(ctx, shape, q, k, v, out, lse);
  return absl::OkStatus();
}

absl::Status CausalAttentionBackward(const ExecContext& ctx, const AttentionShape& shape,
                                     TensorView q, TensorView k, TensorView v, TensorView out,
                                     TensorView lse, TensorView d_out, TensorView d_q,
                                     TensorView d_k, TensorView d_v) {
  MOETRAIN_RETURN_IF_ERROR(CheckForwardArgs(ctx, "attention backward", shape, q, k, v, out, lse));
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "attention backward", {{"d_out", d_out}, {"d_q", d_q}, {"d_k", d_k}, {"d_v", d_v}}));
  const int64_t rows = shape.batch * shape.seq_len;
  const int64_t q_ld = shape.num_heads * shape.head_dim;
  const int64_t kv_ld = shape.num_kv_heads * shape.head_dim;
  MOETRAIN_RETURN_IF_ERROR(CheckDense(d_out, "d_out", {rows, q_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(d_q, "d_q", {rows, q_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(d_k, "d_k", {rows, kv_ld}));
  MOETRAIN_RETURN_IF_ERROR(CheckDense(d_v, "d_v", {rows, kv_ld}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::CausalAttentionBackward(ctx, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "attention backward");
  cpu::CausalAttentionBackward(ctx, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
