// What an ExecContext needs of a device backend other than the CPU, in host types only, so that
// code compiled without the backend's toolkit can hold and synchronise it. The CUDA backend's is
// cuda::CudaContext (engine/backend/cuda/cuda_context.h).
#ifndef MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_
#define MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"

namespace moetrain {

// Device memory as the runtime's allocator sees it: bytes in tensors now, and the most at once
// since the runtime was created or ResetPeakMemory.
struct DeviceMemoryStats {
  int64_t in_use_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t reserved_bytes = 0;  // taken from the device: in use + cached for reuse
  int64_t total_bytes = 0;     // the device's memory
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // The memory of tensors on device(): stream-ordered on the compute stream.
  virtual Allocator& allocator() = 0;
  // Returns once every op issued so far has finished; the error of a failed kernel shows here.
  virtual absl::Status Synchronize() = 0;

  virtual DeviceMemoryStats memory_stats() const = 0;
  virtual void ResetPeakMemory() = 0;
  // The backend's streams as opaque handles (a cudaStream_t on CUDA), for code that hands them to
  // a library without including the toolkit's headers (the NCCL communicator): ops run on the
  // compute stream, collectives on the communication stream.
  virtual void* compute_stream_handle() const = 0;
  virtual void* comm_stream_handle() const = 0;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_BACKEND_DEVICE_RUNTIME_H_
