// The CUDA side of mla.h (mla_cuda.cu); arguments arrive validated by the dispatch in mla.cc.
// Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_MLA_MLA_CUDA_H_
#define MOETRAIN_ENGINE_OPS_MLA_MLA_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/mla/mla.h"

namespace moetrain::ops::cuda {

absl::Status MlaQkvForward(const ExecContext& ctx, const MlaShape& shape, float theta,
                           TensorView q_full, TensorView k_rope, TensorView kv, TensorView q,
                           TensorView k, TensorView v);
absl::Status MlaQkvBackward(const ExecContext& ctx, const MlaShape& shape, float theta,
                            TensorView d_q, TensorView d_k, TensorView d_v, TensorView d_q_full,
                            TensorView d_k_rope, TensorView d_kv);
// widen: wide = narrow zero-padded per head; else narrow = the first v features of each head.
absl::Status MlaCopyHeads(const ExecContext& ctx, const MlaShape& shape, TensorView wide,
                          TensorView narrow, bool widen);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_MLA_MLA_CUDA_H_
