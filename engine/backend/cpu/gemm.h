// Dense and grouped GEMM on the CPU through oneDNN (f32, or bf16 inputs with f32 accumulation).
//
// Primitives are created once per (shape class, dtype) with the row count as a run-time
// dimension, and cached, so ragged expert batches of any size reuse them. Every function here may
// be called from several threads at once.
#ifndef MOETRAIN_ENGINE_BACKEND_CPU_GEMM_H_
#define MOETRAIN_ENGINE_BACKEND_CPU_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

// c (M, N) f32  = [c +] op(a) · op(b), with op(a) (M, K) and op(b) (K, N). a and b are f32 or
// bf16 (the same), row-major and contiguous; trans_a means a is stored (K, M), trans_b that b is
// stored (N, K). accumulate adds into c instead of overwriting it.
struct GemmArgs {
  TensorView a;
  TensorView b;
  TensorView c;
  bool trans_a = false;
  bool trans_b = false;
  bool accumulate = false;
};
absl::Status Gemm(const GemmArgs& args);

// FLOP/s of one n×n×n GEMM with `dtype` inputs (f32 accumulate) on this machine, with the calling
// thread's OpenMP team: the median of `reps` timed runs after one warm-up. The denominator of MFU,
// measured rather than taken from a datasheet.
absl::StatusOr<double> MeasureGemmFlops(DType dtype, int64_t n = 2048, int reps = 3);

// Grouped GEMMs over rows sorted by group: group g owns rows [offsets[g], offsets[g+1]) of the
// row-major activations; w holds one (N, K) matrix per group. Groups with no rows cost nothing.
//   forward:          y_g  = x_g · w_gᵀ       x (R, K), w (G, N, K), y (R, N) f32
//   backward data:    dx_g = dy_g · w_g       dy (R, N), w (G, N, K), dx (R, K) f32
//   backward weight:  dw_g [+]= dy_gᵀ · x_g   dy (R, N), x (R, K), dw (G, N, K) f32
// x, w, dy share one dtype, f32 or bf16.
absl::Status GroupedGemmForward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                                TensorView y);
absl::Status GroupedGemmBackwardData(TensorView dy, TensorView w, absl::Span<const int64_t> offsets,
                                     TensorView dx);
absl::Status GroupedGemmBackwardWeight(TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_BACKEND_CPU_GEMM_H_
