#include "engine/backend/exec_context.h"

#include "absl/strings/str_cat.h"

#if MOETRAIN_HAVE_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace moetrain {

ExecContext ExecContext::Cpu(ThreadPool* pool) {
  return ExecContext(Device::Cpu(), &CpuAllocator(), pool != nullptr ? pool : &DefaultThreadPool(),
                     nullptr);
}

absl::StatusOr<ExecContext> ExecContext::ForDevice(Device device) {
  if (device.is_cpu()) return Cpu();
#if MOETRAIN_HAVE_CUDA
  absl::StatusOr<DeviceRuntime*> runtime = cuda::OpenCudaRuntime(device.index);
  if (!runtime.ok()) return runtime.status();
  return ExecContext(device, &(*runtime)->allocator(), &DefaultThreadPool(), *runtime);
#else
  return absl::InvalidArgumentError(
      absl::StrCat("device ", device.DebugString(),
                   ": this build has no CUDA backend (built without nvcc; the engine computes on "
                   "the CPU only)"));
#endif
}

}  // namespace moetrain
