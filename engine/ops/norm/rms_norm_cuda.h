// The CUDA side of rms_norm.h (rms_norm_cuda.cu); arguments arrive validated by the dispatch in
// rms_norm.cc, every tensor dense on ctx's device. Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CUDA_H_
#define MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/norm/rms_norm.h"

namespace moetrain::ops::cuda {

absl::Status RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                            TensorView out, TensorView rstd);
absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& args);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CUDA_H_
