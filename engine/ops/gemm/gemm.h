// Dense GEMM: c (f32) = [c +] op(a) · op(b), with f32 or bf16 inputs and f32 accumulation. On the
// CPU through oneDNN, whose primitives are created once per shape class and dtype and cached;
// every function here may be called from several threads at once. oneDNN threads a GEMM over the
// calling thread's OpenMP team and picks its kernels by the CPU: identical calls give identical
// bits on one machine, but other CPUs (or OpenMP team sizes) may round differently. On CUDA
// through cuBLASLt (gemm_cuda.h) with f32 compute: TF32 is off, so f32 inputs are multiplied in
// full f32 precision (CUBLAS_COMPUTE_32F, not _FAST_TF32) at a fraction of the tensor-core rate;
// bf16 inputs use the tensor cores. The algorithm of each shape is chosen once and cached, so
// identical calls give identical bits on one GPU model.
#ifndef MOETRAIN_ENGINE_OPS_GEMM_GEMM_H_
#define MOETRAIN_ENGINE_OPS_GEMM_GEMM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

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
absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args);

// FLOP/s of one n×n×n GEMM with `dtype` inputs (f32 accumulate) on ctx's device: the median of
// `reps` timed runs after one warm-up. The denominator of MFU, measured rather than taken from a
// datasheet.
absl::StatusOr<double> MeasureGemmFlops(const ExecContext& ctx, DType dtype, int64_t n = 2048,
                                        int reps = 3);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_GEMM_GEMM_H_
