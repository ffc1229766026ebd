// Every CUDA runtime and cuBLAS call of the backend is checked: a failure becomes a Status that
// names the op, the call and the error, and nothing aborts. Kernel launches are checked right
// after with cudaGetLastError (errors of the kernel's run show at the next synchronisation).
//
//   MOETRAIN_CUDA_RETURN_IF_ERROR("router", cudaMemsetAsync(p, 0, bytes, stream));
//   → Internal "router: cudaMemsetAsync(p, 0, bytes, stream) failed: cudaErrorInvalidValue
//     (invalid argument)"
//
// Codes: out of memory → ResourceExhausted; no usable device or driver → Unavailable; cuBLAS's
// NOT_SUPPORTED → Unimplemented, INVALID_VALUE → InvalidArgument; anything else → Internal.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string_view>

#include "absl/status/status.h"

namespace moetrain::cuda {

absl::Status CudaStatus(cudaError_t error, std::string_view op, std::string_view call);
absl::Status CublasStatus(cublasStatus_t status, std::string_view op, std::string_view call);

}  // namespace moetrain::cuda

#define MOETRAIN_CUDA_RETURN_IF_ERROR(op, call)                             \
  do {                                                                      \
    const cudaError_t moetrain_cuda_error_ = (call);                        \
    if (moetrain_cuda_error_ != cudaSuccess)                                \
      return ::moetrain::cuda::CudaStatus(moetrain_cuda_error_, op, #call); \
  } while (0)

#define MOETRAIN_CUBLAS_RETURN_IF_ERROR(op, call)                                \
  do {                                                                           \
    const cublasStatus_t moetrain_cublas_status_ = (call);                       \
    if (moetrain_cublas_status_ != CUBLAS_STATUS_SUCCESS)                        \
      return ::moetrain::cuda::CublasStatus(moetrain_cublas_status_, op, #call); \
  } while (0)

// After a kernel launch: the launch's own error (bad geometry, no kernel image for this GPU).
#define MOETRAIN_CUDA_CHECK_LAUNCH(op) MOETRAIN_CUDA_RETURN_IF_ERROR(op, cudaGetLastError())

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_
