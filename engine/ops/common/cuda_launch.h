// What every op's CUDA file (engine/ops/<family>/<family>_cuda.cu) starts with: the CUDA context
// and compute stream of its ExecContext, made current on the calling thread. Included by .cu
// files only.
#ifndef MOETRAIN_ENGINE_OPS_COMMON_CUDA_LAUNCH_H_
#define MOETRAIN_ENGINE_OPS_COMMON_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/backend/exec_context.h"
#include "engine/core/status.h"
#include "engine/ops/common/launch_geometry.h"

namespace moetrain::ops::cuda {

using ::moetrain::cuda::CudaContext;

// Where an op issues its work: the context, and its compute stream.
struct CudaOp {
  CudaContext* context;
  cudaStream_t stream;
};

// ctx must be on a CUDA device (the op's dispatch checked). Errors name `op`.
inline absl::StatusOr<CudaOp> BeginCudaOp(const ExecContext& ctx, const char* op) {
  CudaContext& context = ::moetrain::cuda::ContextOf(ctx);
  absl::Status current = context.MakeCurrent(op);
  if (!current.ok()) return current;
  return CudaOp{&context, context.compute_stream()};
}

// Copies `bytes` of device memory at `device` to `host` through the context's pinned staging
// buffer and waits for it (and so for everything queued before it on the compute stream). For
// the small verdicts (a first bad index, a flag) an op must read before it can return an error.
inline absl::Status ReadToHost(const CudaOp& op, const char* name, const void* device, size_t bytes,
                               void* host) {
  absl::MutexLock lock(&op.context->staging_mutex());
  MOETRAIN_ASSIGN_OR_RETURN(void* const staging, op.context->PinnedStaging(bytes));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      name, cudaMemcpyAsync(staging, device, bytes, cudaMemcpyDeviceToHost, op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR(name, cudaStreamSynchronize(op.stream));
  std::memcpy(host, staging, bytes);
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_COMMON_CUDA_LAUNCH_H_
