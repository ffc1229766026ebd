// What an ExecContext needs of a device backend other than the CPU, in host types only, so that
// code compiled without the backend's toolkit can hold and synchronise it. The CUDA backend's is
// cuda::CudaContext (engine/backend/cuda/cuda_context.h).
#ifndef MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_
#define MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_

#include "absl/status/status.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"

namespace moetrain {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // The memory of tensors on device(): stream-ordered on the compute stream.
  virtual Allocator& allocator() = 0;
  // Returns once every op issued so far has finished; the error of a failed kernel shows here.
  virtual absl::Status Synchronize() = 0;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_
