// The CUDA side of the GEMM ops (gemm.h, and the per-group products of grouped_gemm.h): cuBLASLt
// matmuls with f32 or bf16 inputs, f32 output, f32 compute (CUBLAS_COMPUTE_32F: no TF32). The
// algorithm of each problem is chosen once by cuBLASLt's heuristic and cached, so identical calls
// run the same kernel and give identical bits. Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_GEMM_GEMM_CUDA_H_
#define MOETRAIN_ENGINE_OPS_GEMM_GEMM_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/ops/gemm/gemm.h"

namespace moetrain::cuda {
class CudaContext;
}  // namespace moetrain::cuda

namespace moetrain::ops::cuda {

// ops::Gemm of op(a) (m, k) × op(b) (k, n) on ctx's compute stream (arguments validated).
absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args, int64_t m, int64_t n, int64_t k);

// c (m, n) [+]= op(a) (m, k) · op(b) (k, n): device pointers, row-major, with the leading
// dimensions (row strides, in elements) of the matrices as stored. m, n, k ≥ 1.
struct DeviceGemm {
  DType dtype;  // of a and b: f32 or bf16
  const void* a;
  const void* b;
  float* c;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
  bool trans_a, trans_b, accumulate;
};

// Queues one product on `context`'s stream `stream_index` (0: the compute stream; 1 + i: side
// stream i) with that stream's cuBLASLt workspace. The caller has made the device current and
// orders the stream with the rest. Errors name `op`.
absl::Status RunDeviceGemm(::moetrain::cuda::CudaContext& context, int stream_index,
                           const DeviceGemm& gemm, const char* op);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_GEMM_GEMM_CUDA_H_
