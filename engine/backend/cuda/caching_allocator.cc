#include "engine/backend/cuda/caching_allocator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moetrain::cuda {
namespace {

constexpr size_t kSmallQuantum = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeQuantum = size_t{2} << 20;

size_t RoundUp(size_t bytes, size_t quantum) { return (bytes + quantum - 1) / quantum * quantum; }

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

}  // namespace

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<DeviceMemory> memory)
    : device_(device), memory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes < kLargeThreshold) return RoundUp(std::max<size_t>(bytes, 1), kSmallQuantum);
  return RoundUp(bytes, kLargeQuantum);
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("device allocation of 0 bytes");
  const size_t size = RoundSize(bytes);
  absl::MutexLock lock(&mu_);
  // The smallest cached block of at least `size` that wastes at most a quarter of itself.
  auto it = free_.lower_bound(size);
  if (it != free_.end() && size >= it->first - it->first / 4) {
    void* p = it->second;
    const size_t block = it->first;
    free_.erase(it);
    in_use_[p] = block;
    stats_.allocated_bytes += static_cast<int64_t>(block);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    ++stats_.cache_hits;
    return p;
  }
  absl::StatusOr<void*> p = memory_->Malloc(size);
  if (!p.ok() && absl::IsResourceExhausted(p.status()) && !free_.empty()) {
    ReleaseCachedLocked();
    p = memory_->Malloc(size);
  }
  if (!p.ok()) {
    if (!absl::IsResourceExhausted(p.status())) return p.status();
    return absl::ResourceExhaustedError(
        absl::StrCat(device_.DebugString(), " is out of memory: asked for ", bytes, " bytes (",
                     Mib(bytes), "), the device has ", Mib(memory_->FreeBytes()),
                     " free; moetrain holds ", Mib(stats_.allocated_bytes), " in tensors (peak ",
                     Mib(stats_.peak_allocated_bytes), "): ", p.status().message()));
  }
  in_use_[*p] = size;
  ++stats_.device_mallocs;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return *p;
}

void CachingAllocator::Deallocate(void* data) {
  if (data == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = in_use_.find(data);
  if (it == in_use_.end()) return;  // not ours: ignored rather than corrupting the cache
  stats_.allocated_bytes -= static_cast<int64_t>(it->second);
  free_.emplace(it->second, data);
  in_use_.erase(it);
}

CachingAllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  absl::MutexLock lock(&mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::ReleaseCached() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  if (free_.empty()) return;
  // A cached block may still be read by kernels queued before it was freed.
  memory_->WaitForDevice();
  for (const auto& [size, p] : free_) {
    memory_->Free(p);
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  free_.clear();
}

}  // namespace moetrain::cuda
