// The caching allocator's policy on the CPU: the device's calls come from a DeviceMemory over
// host memory with a byte budget, which counts its calls. The CUDA backend runs the same class
// over cudaMalloc (exec_context_test checks that where a GPU is).
#include "engine/backend/cuda/caching_allocator.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moetrain::cuda {
namespace {

// Host memory standing in for a device of `budget` bytes.
class BudgetMemory final : public DeviceMemory {
 public:
  explicit BudgetMemory(size_t budget) : budget_(budget) {}
  absl::StatusOr<void*> Malloc(size_t bytes) override {
    if (fail_other_) return absl::InternalError("driver fault");
    if (used_ + bytes > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat("budget of ", budget_, " bytes"));
    }
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    used_ += bytes;
    sizes_[p] = bytes;
    ++mallocs_;
    return p;
  }
  void WaitForDevice() override { ++waits_; }
  void Free(void* p) override {
    frees_after_wait_ += waits_ > 0;
    used_ -= sizes_.at(p);
    sizes_.erase(p);
    ++frees_;
    std::free(p);
  }
  size_t FreeBytes() override { return budget_ - used_; }

  size_t budget_;
  size_t used_ = 0;
  bool fail_other_ = false;
  int mallocs_ = 0;
  int frees_ = 0;
  int waits_ = 0;
  int frees_after_wait_ = 0;
  std::map<void*, size_t> sizes_;
};

struct Fixture {
  explicit Fixture(size_t budget) {
    auto owned = std::make_unique<BudgetMemory>(budget);
    memory = owned.get();
    allocator = std::make_unique<CachingAllocator>(Device::Cuda(0), std::move(owned));
  }
  BudgetMemory* memory;
  std::unique_ptr<CachingAllocator> allocator;
};

constexpr size_t kMiB = size_t{1} << 20;

TEST(CachingAllocatorTest, SizeClassesAre512BytesBelowOneMibAndTwoMibAbove) {
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(kMiB - 1), kMiB);
  EXPECT_EQ(CachingAllocator::RoundSize(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::RoundSize(2 * kMiB + 1), 4 * kMiB);
  EXPECT_EQ(CachingAllocator::RoundSize(size_t{5} << 30), size_t{5} << 30);
}

TEST(CachingAllocatorTest, AFreedBlockServesTheNextRequestOfItsClassWithoutTheDevice) {
  Fixture f(64 * kMiB);
  absl::StatusOr<void*> a = f.allocator->Allocate(3000);
  ASSERT_TRUE(a.ok()) << a.status();
  f.allocator->Deallocate(*a);
  absl::StatusOr<void*> b = f.allocator->Allocate(2900);  // same 3072-byte class
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(f.memory->mallocs_, 1);
  const CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(stats.device_mallocs, 1);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.allocated_bytes, 3072);
  EXPECT_EQ(stats.reserved_bytes, 3072);
}

// A much larger cached block is not handed out for a small request (it would waste most of
// itself); one at most a quarter larger is.
TEST(CachingAllocatorTest, ABlockServesASmallerRequestOnlyWhenItWastesAtMostAQuarter) {
  Fixture f(256 * kMiB);
  void* big = *f.allocator->Allocate(16 * kMiB);
  f.allocator->Deallocate(big);
  void* small = *f.allocator->Allocate(4 * kMiB);
  EXPECT_NE(small, big);
  void* near = *f.allocator->Allocate(13 * kMiB);  // 14 MiB class, within a quarter of 16
  EXPECT_EQ(near, big);
  EXPECT_EQ(f.memory->mallocs_, 2);
}

TEST(CachingAllocatorTest, PeaksFollowTheHighestUseUntilReset) {
  Fixture f(64 * kMiB);
  void* a = *f.allocator->Allocate(4 * kMiB);
  void* b = *f.allocator->Allocate(2 * kMiB);
  f.allocator->Deallocate(a);
  CachingAllocatorStats stats = f.allocator->stats();
  EXPECT_EQ(stats.allocated_bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(stats.peak_allocated_bytes, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(stats.reserved_bytes, static_cast<int64_t>(6 * kMiB));
  f.allocator->ResetPeak();
  EXPECT_EQ(f.allocator->stats().peak_allocated_bytes, static_cast<int64_t>(2 * kMiB));
  f.allocator->Deallocate(b);
  f.allocator->ReleaseCached();
  stats = f.allocator->stats();
  EXPECT_EQ(stats.reserved_bytes, 0);
  EXPECT_EQ(f.memory->used_, 0u);
}

// Out of room: the cache goes back to the device and the request is tried again.
TEST(CachingAllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  Fixture f(10 * kMiB);
  void* a = *f.allocator->Allocate(6 * kMiB);
  f.allocator->Deallocate(a);  // cached: 6 MiB of the 10 held
  absl::StatusOr<void*> b = f.allocator->Allocate(8 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(f.memory->frees_, 1);
  // Kernels queued before the block was freed may still read it: the device is waited for first.
  EXPECT_EQ(f.memory->waits_, 1);
  EXPECT_EQ(f.memory->frees_after_wait_, 1);
  EXPECT_EQ(f.allocator->stats().reserved_bytes, static_cast<int64_t>(8 * kMiB));
}

TEST(CachingAllocatorTest, OutOfMemoryNamesTheBytesAskedForAndTheBytesFree) {
  Fixture f(10 * kMiB);
  void* held = *f.allocator->Allocate(4 * kMiB);
  const absl::StatusOr<void*> p = f.allocator->Allocate(7 * kMiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(p.status().message());
  EXPECT_NE(message.find("cuda:0 is out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("asked for 7340032 bytes (7.0 MiB)"), std::string::npos) << message;
  EXPECT_NE(message.find("the device has 6.0 MiB free"), std::string::npos) << message;
  EXPECT_NE(message.find("moetrain holds 4.0 MiB in tensors"), std::string::npos) << message;
  f.allocator->Deallocate(held);
}

TEST(CachingAllocatorTest, OtherDeviceErrorsPassThroughUnchanged) {
  Fixture f(10 * kMiB);
  f.memory->fail_other_ = true;
  const absl::StatusOr<void*> p = f.allocator->Allocate(100);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(p.status().message(), "driver fault");
}

TEST(CachingAllocatorTest, ZeroBytesAreRefusedAndForeignPointersIgnored) {
  Fixture f(kMiB);
  EXPECT_EQ(f.allocator->Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  int on_stack = 0;
  f.allocator->Deallocate(&on_stack);
  f.allocator->Deallocate(nullptr);
  EXPECT_EQ(f.allocator->stats().allocated_bytes, 0);
}

// Blocks handed out at the same time never overlap, whatever threads ask.
TEST(CachingAllocatorTest, ConcurrentUseHandsOutDistinctBlocks) {
  Fixture f(512 * kMiB);
  std::vector<std::thread> threads;
  std::vector<std::vector<void*>> held(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<void*> p = f.allocator->Allocate(1000 + 37 * i);
        ASSERT_TRUE(p.ok());
        held[t].push_back(*p);
        if (i % 3 == 0) {
          f.allocator->Deallocate(held[t].front());
          held[t].erase(held[t].begin());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<void*> distinct;
  size_t total = 0;
  for (const auto& h : held) {
    distinct.insert(h.begin(), h.end());
    total += h.size();
  }
  EXPECT_EQ(distinct.size(), total);
}

}  // namespace
}  // namespace moetrain::cuda
