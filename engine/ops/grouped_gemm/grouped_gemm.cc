#include "engine/ops/grouped_gemm/grouped_gemm.h"

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/grouped_gemm/grouped_gemm_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/grouped_gemm/grouped_gemm_cuda.h"
#endif

namespace moetrain::ops {
namespace {

// Checks offsets (G + 1, non-decreasing, from 0 to rows).
absl::Status CheckOffsets(absl::Span<const int64_t> offsets, int64_t groups, int64_t rows) {
  if (static_cast<int64_t>(offsets.size()) != groups + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets: size ", offsets.size(), " must be groups + 1 = ", groups + 1));
  }
  if (offsets.front() != 0 || offsets.back() != rows) {
    return absl::InvalidArgumentError(absl::StrCat("offsets: must run from 0 to rows = ", rows,
                                                   ", got ", offsets.front(), " .. ",
                                                   offsets.back()));
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (offsets[g + 1] < offsets[g]) {
      return absl::InvalidArgumentError(absl::StrCat("offsets: decrease at group ", g, " (",
                                                     offsets[g], " > ", offsets[g + 1], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GroupedGemmForward(const ExecContext& ctx, TensorView x, TensorView w,
                                absl::Span<const int64_t> offsets, TensorView y) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "grouped gemm forward", {{"x", x}, {"w", w}, {"y", y}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(x, "grouped gemm x", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(w, "grouped gemm w", x.dtype(), {-1, -1, x.dim(1)}));
  const int64_t rows = x.dim(0), groups = w.dim(0), n = w.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(y, "grouped gemm y", DType::kF32, {rows, n}));
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::GroupedGemmForward(ctx, x, w, offsets, y);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "grouped gemm forward");
  return cpu::GroupedGemmForward(x, w, offsets, y);
}

absl::Status GroupedGemmBackwardData(const ExecContext& ctx, TensorView dy, TensorView w,
                                     absl::Span<const int64_t> offsets, TensorView dx) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "grouped gemm backward data", {{"dy", dy}, {"w", w}, {"dx", dx}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(dy, "grouped gemm dy", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(w, "grouped gemm w", dy.dtype(), {-1, dy.dim(1), -1}));
  const int64_t rows = dy.dim(0), groups = w.dim(0), k = w.dim(2);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(dx, "grouped gemm dx", DType::kF32, {rows, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::GroupedGemmBackwardData(ctx, dy, w, offsets, dx);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "grouped gemm backward data");
  return cpu::GroupedGemmBackwardData(dy, w, offsets, dx);
}

absl::Status GroupedGemmBackwardWeight(const ExecContext& ctx, TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "grouped gemm backward weight", {{"dy", dy}, {"x", x}, {"dw", dw}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(dy, "grouped gemm dy", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(x, "grouped gemm x", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(x, "grouped gemm x", dy.dtype(), {dy.dim(0), -1}));
  const int64_t rows = dy.dim(0), n = dy.dim(1), k = x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(dw, "grouped gemm dw", DType::kF32, {-1, n, k}));
  const int64_t groups = dw.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) {
    return cuda::GroupedGemmBackwardWeight(ctx, dy, x, offsets, dw, accumulate);
  }
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "grouped gemm backward weight");
  return cpu::GroupedGemmBackwardWeight(dy, x, offsets, dw, accumulate);
}

}  // namespace moetrain::ops
