#include "engine/ops/mla/mla.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/mla/mla_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/mla/mla_cuda.h"
#endif

namespace moetrain::ops {
namespace {

absl::Status CheckTheta(float theta) {
  if (!(theta > 0.0f) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(absl::StrCat("mla: theta = ", theta, " must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMlaShape(const MlaShape& s) {
  for (const auto& [name, value] : {std::pair{"batch", s.batch},
                                    {"seq_len", s.seq_len},
                                    {"num_heads", s.num_heads},
                                    {"v_head_dim", s.v_head_dim}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mla: shape.", name, " = ", value, " must be at least 1"));
    }
  }
  if (s.qk_nope < 0 || s.qk_nope % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla: shape.qk_nope = ", s.qk_nope, " must be even and not negative"));
  }
  if (s.qk_rope < 2 || s.qk_rope % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla: shape.qk_rope = ", s.qk_rope, " must be even and at least 2"));
  }
  if (s.v_head_dim > s.qk_head_dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla: shape.v_head_dim = ", s.v_head_dim,
                     " exceeds qk_nope + qk_rope = ", s.qk_head_dim()));
  }
  return absl::OkStatus();
}

absl::Status MlaQkvForward(const ExecContext& ctx, const MlaShape& shape, float theta,
                           TensorView q_full, TensorView k_rope, TensorView kv, TensorView q,
                           TensorView k, TensorView v) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(
      ctx, "mla qkv",
      {{"q_full", q_full}, {"k_rope", k_rope}, {"kv", kv}, {"q", q}, {"k", k}, {"v", v}}));
  MOETRAIN_RETURN_IF_ERROR(CheckMlaShape(shape));
  MOETRAIN_RETURN_IF_ERROR(CheckTheta(theta));
  const int64_t t = shape.tokens(), h = shape.num_heads;
  const int64_t wide = h * shape.qk_head_dim();
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(q_full, "mla q_full", DType::kF32, {t, wide}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(k_rope, "mla k_rope", DType::kF32, {t, shape.qk_rope}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(kv, "mla kv", DType::kF32, {t, h * (shape.qk_nope + shape.v_head_dim)}));
  for (const auto& [name, out] : {std::pair{"mla q", q}, {"mla k", k}, {"mla v", v}}) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(out, name, DType::kF32, {t, wide}));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::MlaQkvForward(ctx, shape, theta, q_full, k_rope, kv, q, k, v);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "mla qkv");
  cpu::MlaQkvForward(ctx, shape, theta, q_full, k_rope, kv, q, k, v);
  return absl::OkStatus();
}

absl::Status MlaQkvBackward(const ExecContext& ctx, const MlaShape& shape, float theta,
                            TensorView d_q, TensorView d_k, TensorView d_v, TensorView d_q_full,
                            TensorView d_k_rope, TensorView d_kv) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "mla qkv backward",
                                        {{"d_q", d_q},
                                         {"d_k", d_k},
                                         {"d_v", d_v},
                                         {"d_q_full", d_q_full},
                                         {"d_k_rope", d_k_rope},
                                         {"d_kv", d_kv}}));
  MOETRAIN_RETURN_IF_ERROR(CheckMlaShape(shape));
  MOETRAIN_RETURN_IF_ERROR(CheckTheta(theta));
  const int64_t t = shape.tokens(), h = shape.num_heads;
  const int64_t wide = h * shape.qk_head_dim();
  for (const auto& [name, in] : {std::pair{"mla d_q", d_q}, {"mla d_k", d_k}, {"mla d_v", d_v}}) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(in, name, DType::kF32, {t, wide}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_q_full, "mla d_q_full", DType::kF32, {t, wide}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(d_k_rope, "mla d_k_rope", DType::kF32, {t, shape.qk_rope}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(d_kv, "mla d_kv", DType::kF32, {t, h * (shape.qk_nope + shape.v_head_dim)}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::MlaQkvBackward(ctx, shape, theta, d_q, d_k, d_v, d_q_full, d_k_rope, d_kv);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "mla qkv backward");
  cpu::MlaQkvBackward(ctx, shape, theta, d_q, d_k, d_v, d_q_full, d_k_rope, d_kv);
  return absl::OkStatus();
}

absl::Status MlaNarrowHeads(const ExecContext& ctx, const MlaShape& shape, TensorView wide,
                            TensorView narrow) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "mla narrow", {{"wide", wide}, {"narrow", narrow}}));
  MOETRAIN_RETURN_IF_ERROR(CheckMlaShape(shape));
  const int64_t t = shape.tokens(), h = shape.num_heads;
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(wide, "mla wide", DType::kF32, {t, h * shape.qk_head_dim()}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(narrow, "mla narrow", DType::kF32, {t, h * shape.v_head_dim}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::MlaCopyHeads(ctx, shape, wide, narrow, /*widen=*/false);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "mla narrow");
  cpu::MlaCopyHeads(ctx, shape, wide, narrow, /*widen=*/false);
  return absl::OkStatus();
}

absl::Status MlaWidenHeads(const ExecContext& ctx, const MlaShape& shape, TensorView narrow,
                           TensorView wide) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "mla widen", {{"narrow", narrow}, {"wide", wide}}));
  MOETRAIN_RETURN_IF_ERROR(CheckMlaShape(shape));
  const int64_t t = shape.tokens(), h = shape.num_heads;
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(narrow, "mla narrow", DType::kF32, {t, h * shape.v_head_dim}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(wide, "mla wide", DType::kF32, {t, h * shape.qk_head_dim()}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::MlaCopyHeads(ctx, shape, wide, narrow, /*widen=*/true);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "mla widen");
  cpu::MlaCopyHeads(ctx, shape, wide, narrow, /*widen=*/true);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
