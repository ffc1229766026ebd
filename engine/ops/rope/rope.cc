#include "engine/ops/rope/rope.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/rope/rope_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/rope/rope_cuda.h"
#endif

namespace moetrain::ops {

absl::Status ApplyRope(const ExecContext& ctx, const AttentionShape& shape, float theta,
                       bool inverse, TensorView x) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "rope", {{"x", x}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAttentionShape(shape));
  if (!(theta > 0.0f) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(absl::StrCat("theta = ", theta, " must be positive"));
  }
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(x, "x", DType::kF32, {shape.batch * shape.seq_len, -1}));
  const int64_t cols = x.dim(1);
  if (cols == 0 || cols % shape.head_dim != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x: ", cols, " columns are not a positive multiple of shape.head_dim = ", shape.head_dim));
  }
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::ApplyRope(ctx, shape, theta, inverse, x);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "rope");
  cpu::ApplyRope(ctx, shape, theta, inverse, x);
  return absl::OkStatus();
}

}  // namespace moetrain::ops
