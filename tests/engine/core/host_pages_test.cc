// DiscardHostRange and ResidentHostBytes on real allocations: the pages inside a discarded range
// leave memory (mincore says so), everything in it reads zero, and the bytes around it, on the
// pages it shares with them, keep their values.
#include "engine/core/host_pages.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "engine/core/allocator.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

class HostPagesTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(HostPagesTest, DiscardedPagesLeaveMemoryAndReadZero) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t pages = GetParam();
  const int64_t bytes = pages * page;
  // One page more, so that `data` can start on a page boundary.
  absl::StatusOr<void*> allocated = CpuAllocator().Allocate(bytes + page);
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  auto* data = static_cast<uint8_t*>(*allocated);
  data += (page - reinterpret_cast<uintptr_t>(data) % page) % page;
  std::memset(data, 0xAB, bytes);
  absl::StatusOr<int64_t> before = ResidentHostBytes(data, bytes);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, bytes);

  // From 100 bytes into the second page to 7 bytes into the second-to-last: pages - 4 whole pages.
  const int64_t begin = page + 100, end = (pages - 2) * page + 7;
  ASSERT_TRUE(DiscardHostRange(data + begin, end - begin).ok());
  absl::StatusOr<int64_t> after = ResidentHostBytes(data, bytes);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*before - *after, (pages - 4) * page);
  for (int64_t i = 0; i < bytes; ++i) {
    ASSERT_EQ(data[i], i >= begin && i < end ? 0 : 0xAB) << "byte " << i;
  }
  // Used again: the pages come back (one at least; a huge page may bring more), zero until written.
  data[2 * page] = 1;
  EXPECT_EQ(data[2 * page + 1], 0);
  absl::StatusOr<int64_t> touched = ResidentHostBytes(data, bytes);
  ASSERT_TRUE(touched.ok());
  EXPECT_GE(*touched, *after + page);
  CpuAllocator().Deallocate(*allocated);
}

// A few pages (from the C heap) and many (an anonymous mapping of their own).
INSTANTIATE_TEST_SUITE_P(Sizes, HostPagesTest, ::testing::Values(8, 4096));

TEST(HostPagesTest, ARangeWithinOnePageIsZeroedInPlace) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  absl::StatusOr<void*> allocated = CpuAllocator().Allocate(2 * page);
  ASSERT_TRUE(allocated.ok());
  auto* data = static_cast<uint8_t*>(*allocated);
  std::memset(data, 7, 2 * page);
  ASSERT_TRUE(DiscardHostRange(data + 10, 20).ok());
  ASSERT_TRUE(DiscardHostRange(data + 40, 0).ok());
  for (int64_t i = 0; i < 2 * page; ++i) ASSERT_EQ(data[i], i >= 10 && i < 30 ? 0 : 7) << i;
  CpuAllocator().Deallocate(data);
}

}  // namespace
}  // namespace moetrain
