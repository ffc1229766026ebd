#include "engine/backend/exec_context.h"

#include <string>

#include "engine/core/thread_pool.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

TEST(ExecContextTest, TheCpuContextRunsOnTheHostWithItsPool) {
  const ExecContext ctx = ExecContext::Cpu();
  EXPECT_EQ(ctx.device(), Device::Cpu());
  EXPECT_EQ(ctx.allocator().device(), Device::Cpu());
  EXPECT_EQ(&ctx.thread_pool(), &DefaultThreadPool());
  EXPECT_TRUE(ctx.Synchronize().ok());
  ThreadPool one(1);
  const ExecContext single = ExecContext::Cpu(&one);
  EXPECT_EQ(&single.thread_pool(), &one);
  absl::StatusOr<ExecContext> by_device = ExecContext::ForDevice(Device::Cpu());
  ASSERT_TRUE(by_device.ok());
  EXPECT_EQ(by_device->device(), Device::Cpu());
}

// No backend of this build serves a CUDA device yet: asking for one names it.
TEST(ExecContextTest, ADeviceNoBackendServesIsRefused) {
  const absl::StatusOr<ExecContext> gpu = ExecContext::ForDevice(Device::Cuda(0));
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(gpu.status().message()).find("device cuda:0"), std::string::npos)
      << gpu.status();
}

}  // namespace
}  // namespace moetrain
