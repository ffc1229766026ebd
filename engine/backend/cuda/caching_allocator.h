// The device memory of tensors: a caching allocator in front of the device's own allocation
// calls (cudaMalloc is slow and synchronises the device), so that a steady-state step allocates
// nothing from the driver.
//
// - Size classes: a request is rounded up to a multiple of 512 bytes below 1 MiB, and to a
//   multiple of 2 MiB from there; a block serves any request of its class, or a smaller one that
//   wastes at most a quarter of it.
// - Stream-ordered reuse: every op of a context runs on its compute stream (ops that spread work
//   over side streams join them back before they return), so a block freed by the host while
//   kernels queued before still use it may serve the next request at once: whatever uses it next
//   is queued after them.
// - Out of memory: the cached free blocks are returned to the device and the request is tried
//   once more; then ResourceExhausted naming the bytes asked for, the bytes the device has free,
//   and what this allocator holds.
//
// Host logic only: the device's calls come through DeviceMemory, so that the policy is tested
// on the CPU (tests/engine/backend/cuda/caching_allocator_test.cc) and run by the CUDA backend
// over cudaMalloc (cuda_context.cu). Safe from any thread.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_CACHING_ALLOCATOR_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"

namespace moetrain::cuda {

// The device's own allocation calls.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of device memory, at least 256-byte aligned; ResourceExhausted when there is no room,
  // another error for anything else.
  virtual absl::StatusOr<void*> Malloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // The bytes the device has free now (for error messages); 0 when unknown.
  virtual size_t FreeBytes() = 0;
  // Waits until no queued work can still use a cached block (before the cache goes back).
  virtual void WaitForDevice() {}
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;       // in blocks handed out now (rounded sizes)
  int64_t reserved_bytes = 0;        // taken from the device: handed out + cached
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since creation or ResetPeak
  int64_t peak_reserved_bytes = 0;
  int64_t device_mallocs = 0;  // DeviceMemory::Malloc calls that succeeded
  int64_t cache_hits = 0;      // requests served from the cache
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory);
  ~CachingAllocator() override;  // returns every cached block; blocks still handed out leak

  // The size class of a request of `bytes` (> 0).
  static size_t RoundSize(size_t bytes);

  Device device() const override { return device_; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Deallocate(void* data) override;

  CachingAllocatorStats stats() const;
  void ResetPeak();
  // Returns every cached (free) block to the device.
  void ReleaseCached();

 private:
  void ReleaseCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Device device_;
  const std::unique_ptr<DeviceMemory> memory_;
  mutable absl::Mutex mu_;
  std::multimap<size_t, void*> free_ ABSL_GUARDED_BY(mu_);         // size class → cached block
  std::unordered_map<void*, size_t> in_use_ ABSL_GUARDED_BY(mu_);  // handed out → size class
  CachingAllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moetrain::cuda

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_CACHING_ALLOCATOR_H_
