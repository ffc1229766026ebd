// Memory for tensors, one allocator per device. The CPU's is here; a device backend provides its
// own (engine/backend/exec_context.h hands out the one of a context's device).
#ifndef MOETRAIN_ENGINE_CORE_ALLOCATOR_H_
#define MOETRAIN_ENGINE_CORE_ALLOCATOR_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "engine/core/device.h"

namespace moetrain {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // `bytes` (> 0) of uninitialised memory on device(), aligned to at least 64 bytes; or
  // ResourceExhausted naming the bytes asked for.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Returns memory that Allocate gave out; null is ignored.
  virtual void Deallocate(void* data) = 0;
};

// Host memory from the C heap, 64-byte aligned. Safe from any thread; never destroyed.
Allocator& CpuAllocator();

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_ALLOCATOR_H_
