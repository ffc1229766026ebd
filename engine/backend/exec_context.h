// Where and how ops run: a device, the allocator of its memory, and on the CPU the thread pool
// that runs the ops' loops. Every op takes one (engine/ops); layers keep the one they were built
// with, so that nothing below the trainer reaches for a global.
//
// A CUDA context (built with MOETRAIN_WITH_CUDA and a usable GPU) runs ops on its device's
// compute stream (engine/backend/cuda/cuda_context.h): an op returns once its work is queued,
// and Synchronize waits for it.
#ifndef MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_
#define MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/device_runtime.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"
#include "engine/core/thread_pool.h"

namespace moetrain {

// Cheap to copy; what it points to outlives it.
class ExecContext {
 public:
  // The CPU: host memory, ops threaded over `pool` (null = DefaultThreadPool()). oneDNN's GEMMs
  // run on the calling thread's OpenMP team, which is the same set of threads.
  static ExecContext Cpu(ThreadPool* pool = nullptr);
  // A context on `device`. For a CUDA device: InvalidArgument naming it when this build has no
  // CUDA backend, Unavailable naming the CUDA error when the device cannot be used (no GPU).
  static absl::StatusOr<ExecContext> ForDevice(Device device);

  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }
  // The threads of a CPU context's ops (and of the host work of a device's ops).
  ThreadPool& thread_pool() const { return *pool_; }
  // The backend of a device context; null on the CPU.
  DeviceRuntime* runtime() const { return runtime_; }

  // Returns once every op issued on this context has finished, so that the host or a
  // communicator may read what they wrote (a bucket of gradients, the rows of a dispatch). CPU
  // ops are done when they return: nothing to wait for.
  absl::Status Synchronize() const {
    return runtime_ == nullptr ? absl::OkStatus() : runtime_->Synchronize();
  }

 private:
  ExecContext(Device device, Allocator* allocator, ThreadPool* pool, DeviceRuntime* runtime)
      : device_(device), allocator_(allocator), pool_(pool), runtime_(runtime) {}

  Device device_;
  Allocator* allocator_;
  ThreadPool* pool_;
  DeviceRuntime* runtime_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_
