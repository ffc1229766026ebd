// The CUDA side of swiglu.h (swiglu_cuda.cu); arguments arrive validated by the dispatch in
// swiglu.cc, every tensor dense on ctx's device. Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CUDA_H_
#define MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops::cuda {

absl::Status SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out);
absl::Status SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                            TensorView d_gate_up);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CUDA_H_
