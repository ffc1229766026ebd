// The CUDA side of grouped_gemm.h: one cuBLASLt matmul per group with rows (ops/gemm/gemm_cuda.h),
// spread round-robin over the context's side streams, which fork from the compute stream and
// join back into it, so the op is stream-ordered on the compute stream like every other.
// Arguments arrive validated. Host-safe: no CUDA headers.
//
// Not here yet: a persistent sm_90a kernel (TMA + wgmma over device-side expert offsets) that
// would need no host counts and run all groups in one launch.
#ifndef MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CUDA_H_
#define MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops::cuda {

absl::Status GroupedGemmForward(const ExecContext& ctx, TensorView x, TensorView w,
                                absl::Span<const int64_t> offsets, TensorView y);
absl::Status GroupedGemmBackwardData(const ExecContext& ctx, TensorView dy, TensorView w,
                                     absl::Span<const int64_t> offsets, TensorView dx);
absl::Status GroupedGemmBackwardWeight(const ExecContext& ctx, TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CUDA_H_
