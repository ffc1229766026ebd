// Grouped GEMMs over rows sorted by group, as the MoE layer's experts need them: group g owns rows
// [offsets[g], offsets[g+1]) of the row-major activations, and w holds one (N, K) matrix per
// group. Groups with no rows cost nothing (and their weight gradient is zero, or left as it was
// when accumulating).
//
//   forward:          y_g  = x_g · w_gᵀ       x (R, K), w (G, N, K), y (R, N) f32
//   backward data:    dx_g = dy_g · w_g       dy (R, N), w (G, N, K), dx (R, K) f32
//   backward weight:  dw_g [+]= dy_gᵀ · x_g   dy (R, N), x (R, K), dw (G, N, K) f32
//
// x, w, dy share one dtype, f32 or bf16, and are dense. `offsets` (G + 1, from 0 to R,
// non-decreasing) are host numbers: the group sizes every backend needs on the host to plan the
// products (the MoE layer copies its expert counts to the host once per pass to make them).
#ifndef MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_H_
#define MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

absl::Status GroupedGemmForward(const ExecContext& ctx, TensorView x, TensorView w,
                                absl::Span<const int64_t> offsets, TensorView y);
absl::Status GroupedGemmBackwardData(const ExecContext& ctx, TensorView dy, TensorView w,
                                     absl::Span<const int64_t> offsets, TensorView dx);
absl::Status GroupedGemmBackwardWeight(const ExecContext& ctx, TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_H_
