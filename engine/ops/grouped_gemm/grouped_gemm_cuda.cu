// Grouped GEMMs on CUDA (grouped_gemm_cuda.h): the host plans the products from the host offsets
// (grouped_gemm_plan.h), then each group with rows gets one cuBLASLt matmul on a side stream.
//
// Ordering: every side stream used first waits for the compute stream (the op's inputs are
// written there), and before returning the compute stream waits for each of them. Memory freed
// after the op is reused in compute-stream order, so it is never reused while a side stream
// still reads it. Outputs that no product writes (empty sums) are zeroed on the compute stream
// before the fork.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/gemm/gemm_cuda.h"
#include "engine/ops/grouped_gemm/grouped_gemm_cuda.h"
#include "engine/ops/grouped_gemm/grouped_gemm_plan.h"

namespace moetrain::ops::cuda {
namespace {

// The address of element `element` of dense `t` (byte arithmetic in size_t: offsets pass 2^31).
void* ElementPtr(const TensorView& t, int64_t element) {
  return static_cast<char*>(t.raw()) + static_cast<size_t>(element) * DTypeSize(t.dtype());
}
float* FloatPtr(const TensorView& t, int64_t element) {
  return static_cast<float*>(t.raw()) + static_cast<size_t>(element);
}

// Zeroes `elements` f32 of `t` from element `begin`, on the compute stream.
absl::Status ZeroFloats(const CudaOp& op, const TensorView& t, int64_t begin, int64_t elements,
                        const char* name) {
  if (elements == 0) return absl::OkStatus();
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      name, cudaMemsetAsync(FloatPtr(t, begin), 0, static_cast<size_t>(elements) * sizeof(float),
                            op.stream));
  return absl::OkStatus();
}

// Forks the plan's side streams from the compute stream, queues make(problem) for each problem
// on its side stream (workspace 1 + stream), and joins them back.
absl::Status RunPlan(const CudaOp& op, const GroupedGemmPlan& plan,
                     absl::FunctionRef<DeviceGemm(const GroupedGemmProblem&)> make,
                     const char* name) {
  CudaContext& context = *op.context;
  for (int s = 0; s < plan.streams_used; ++s) {
    // A failed fork leaves nothing queued on the side streams: no join needed.
    MOETRAIN_RETURN_IF_ERROR(context.StreamWait(context.side_stream(s), op.stream));
  }
  absl::Status status = [&]() -> absl::Status {
    for (const GroupedGemmProblem& problem : plan.problems) {
      MOETRAIN_RETURN_IF_ERROR(RunDeviceGemm(context, 1 + problem.stream, make(problem), name));
    }
    return absl::OkStatus();
  }();
  // Join even after an error: products already queued still read the inputs, which the caller
  // may free (in compute-stream order) as soon as this returns. The first error is kept.
  for (int s = 0; s < plan.streams_used; ++s) {
    status.Update(context.StreamWait(op.stream, context.side_stream(s)));
  }
  return status;
}

}  // namespace

absl::Status GroupedGemmForward(const ExecContext& ctx, TensorView x, TensorView w,
                                absl::Span<const int64_t> offsets, TensorView y) {
  constexpr const char* kName = "grouped gemm forward";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kName));
  const int64_t n = w.dim(1), k = w.dim(2);
  const GroupedGemmPlan plan = PlanGroupedGemm(GroupedGemmKind::kForward, offsets, n, k,
                                               /*accumulate=*/false, CudaContext::kNumSideStreams);
  if (plan.zero_whole_output) return ZeroFloats(op, y, 0, y.numel(), kName);
  // y_g (rows_g, n) = x_g (rows_g, k) · w_gᵀ, w_g stored (n, k).
  return RunPlan(
      op, plan,
      [&](const GroupedGemmProblem& p) -> DeviceGemm {
        return {.dtype = x.dtype(),
                .a = ElementPtr(x, p.row_begin * k),
                .b = ElementPtr(w, p.group * n * k),
                .c = FloatPtr(y, p.row_begin * n),
                .m = p.rows,
                .n = n,
                .k = k,
                .lda = k,
                .ldb = k,
                .ldc = n,
                .trans_a = false,
                .trans_b = true,
                .accumulate = false};
      },
      kName);
}

absl::Status GroupedGemmBackwardData(const ExecContext& ctx, TensorView dy, TensorView w,
                                     absl::Span<const int64_t> offsets, TensorView dx) {
  constexpr const char* kName = "grouped gemm backward data";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kName));
  const int64_t n = w.dim(1), k = w.dim(2);
  const GroupedGemmPlan plan = PlanGroupedGemm(GroupedGemmKind::kBackwardData, offsets, n, k,
                                               /*accumulate=*/false, CudaContext::kNumSideStreams);
  if (plan.zero_whole_output) return ZeroFloats(op, dx, 0, dx.numel(), kName);
  // dx_g (rows_g, k) = dy_g (rows_g, n) · w_g (n, k).
  return RunPlan(
      op, plan,
      [&](const GroupedGemmProblem& p) -> DeviceGemm {
        return {.dtype = dy.dtype(),
                .a = ElementPtr(dy, p.row_begin * n),
                .b = ElementPtr(w, p.group * n * k),
                .c = FloatPtr(dx, p.row_begin * k),
                .m = p.rows,
                .n = k,
                .k = n,
                .lda = n,
                .ldb = k,
                .ldc = k,
                .trans_a = false,
                .trans_b = false,
                .accumulate = false};
      },
      kName);
}

absl::Status GroupedGemmBackwardWeight(const ExecContext& ctx, TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate) {
  constexpr const char* kName = "grouped gemm backward weight";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kName));
  const int64_t n = dy.dim(1), k = x.dim(1);
  const GroupedGemmPlan plan = PlanGroupedGemm(GroupedGemmKind::kBackwardWeight, offsets, n, k,
                                               accumulate, CudaContext::kNumSideStreams);
  // A group with no rows has an empty sum for its gradient: zero, never left uninitialised.
  for (const GroupRange& range : plan.zero_groups) {
    MOETRAIN_RETURN_IF_ERROR(
        ZeroFloats(op, dw, range.begin * n * k, (range.end - range.begin) * n * k, kName));
  }
  // dw_g (n, k) [+]= dy_gᵀ (n, rows_g) · x_g (rows_g, k), dy_g stored (rows_g, n).
  return RunPlan(
      op, plan,
      [&](const GroupedGemmProblem& p) -> DeviceGemm {
        return {.dtype = dy.dtype(),
                .a = ElementPtr(dy, p.row_begin * n),
                .b = ElementPtr(x, p.row_begin * k),
                .c = FloatPtr(dw, p.group * n * k),
                .m = n,
                .n = k,
                .k = p.rows,
                .lda = n,
                .ldb = k,
                .ldc = k,
                .trans_a = true,
                .trans_b = false,
                .accumulate = accumulate};
      },
      kName);
}

}  // namespace moetrain::ops::cuda
