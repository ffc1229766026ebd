// The CUDA side of rope.h (rope_cuda.cu); arguments arrive validated by the dispatch in rope.cc,
// x dense on ctx's device. Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_H_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"

namespace moetrain::ops::cuda {

absl::Status ApplyRope(const ExecContext& ctx, const AttentionShape& shape, float theta,
                       bool inverse, TensorView x);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_H_
