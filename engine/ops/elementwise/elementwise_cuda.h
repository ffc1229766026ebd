// The CUDA side of elementwise.h (elementwise_cuda.cu); arguments arrive validated by the
// dispatch in elementwise.cc, ctx is on a CUDA device. Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CUDA_H_
#define MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace moetrain::ops::cuda {

// Both on ctx's device, dense; queued on the compute stream.
absl::Status ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst);

// At least one of src and dst on ctx's device, the other there or on the host. A copy that
// involves the host is complete when this returns (the host may read dst, or free src, at
// once); a device-to-device copy is queued on the compute stream.
absl::Status CopyTensor(const ExecContext& ctx, TensorView src, TensorView dst);

absl::Status CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                         int64_t dst_col, int64_t cols);
absl::Status Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out);
absl::Status Fill(const ExecContext& ctx, TensorView t, float value);
absl::Status FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean,
                        float stddev);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CUDA_H_
