// The entry to the CUDA backend from host code compiled without CUDA headers (ExecContext).
// Defined in cuda_context.cu; present only in builds with MOETRAIN_WITH_CUDA.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_

#include "absl/status/statusor.h"
#include "engine/backend/device_runtime.h"

namespace moetrain::cuda {

// The process-wide context of CUDA device `ordinal`, created on first use and never destroyed.
// Unavailable naming the CUDA error when the device cannot be used (no driver, no such device);
// InvalidArgument for a negative ordinal.
absl::StatusOr<DeviceRuntime*> OpenCudaRuntime(int ordinal);

}  // namespace moetrain::cuda

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
