#include "engine/backend/exec_context.h"

#include <string>

#include "engine/backend/device_query.h"
#include "engine/core/tensor.h"
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

// Without a usable GPU (or without the CUDA backend in this build), asking for one names the
// device and why: Unavailable when the backend is there but the device is not, InvalidArgument
// when the build has no backend.
TEST(ExecContextTest, AGpuThatCannotBeUsedIsRefusedWithTheReason) {
  const DeviceReport report = QueryDevices();
  if (!report.gpus.empty()) GTEST_SKIP() << "this machine has a GPU: " << DescribeDevices(report);
  const absl::StatusOr<ExecContext> gpu = ExecContext::ForDevice(Device::Cuda(0));
  ASSERT_FALSE(gpu.ok());
  EXPECT_TRUE(gpu.status().code() == absl::StatusCode::kUnavailable ||
              gpu.status().code() == absl::StatusCode::kInvalidArgument)
      << gpu.status();
  EXPECT_NE(std::string(gpu.status().message()).find("cuda:0"), std::string::npos) << gpu.status();
}

// Where a GPU is, its context runs on it: allocations are device memory of that device, and
// Synchronize waits for the stream.
TEST(ExecContextTest, AGpuContextAllocatesOnItsDevice) {
  const DeviceReport report = QueryDevices();
  if (report.gpus.empty()) GTEST_SKIP() << "no GPU: " << report.no_gpu_reason;
  absl::StatusOr<ExecContext> gpu = ExecContext::ForDevice(Device::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->device(), Device::Cuda(0));
  EXPECT_EQ(gpu->allocator().device(), Device::Cuda(0));
  ASSERT_NE(gpu->runtime(), nullptr);
  absl::StatusOr<Tensor> t = Tensor::Allocate(gpu->allocator(), DType::kF32, {1000});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->device(), Device::Cuda(0));
  EXPECT_TRUE(gpu->Synchronize().ok());
}

}  // namespace
}  // namespace moetrain
