// Where and how ops run: a device, the allocator of its memory, and on the CPU the thread pool
// that runs the ops' loops. Every op takes one (engine/ops); layers keep the one they were built
// with, so that nothing below the trainer reaches for a global.
//
// The CUDA backend adds its contexts (a device ordinal and streams) beside Cpu(); until then a
// CUDA device is refused by ForDevice, and tensors on it by every op.
#ifndef MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_
#define MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  // A context on `device`; InvalidArgument naming the device when no backend in this build
  // serves it.
  static absl::StatusOr<ExecContext> ForDevice(Device device);

  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }
  // The threads of a CPU context's ops.
  ThreadPool& thread_pool() const { return *pool_; }

  // Returns once every op issued on this context has finished, so that the host or a
  // communicator may read what they wrote (a bucket of gradients, the rows of a dispatch). CPU
  // ops are done when they return: nothing to wait for.
  absl::Status Synchronize() const { return absl::OkStatus(); }

 private:
  ExecContext(Device device, Allocator* allocator, ThreadPool* pool)
      : device_(device), allocator_(allocator), pool_(pool) {}

  Device device_;
  Allocator* allocator_;
  ThreadPool* pool_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_BACKEND_EXEC_CONTEXT_H_
