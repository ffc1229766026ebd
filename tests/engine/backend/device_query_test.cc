#include "engine/backend/device_query.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

// Holds on any machine: a GPU list with complete entries, or none and a reason. On a machine
// without a CUDA driver (cudaGetDeviceCount fails with cudaErrorInsufficientDriver) or a build
// without CUDA, that is the second case.
TEST(QueryDevicesTest, ReportsGpusOrWhyThereAreNone) {
  const DeviceReport report = QueryDevices();
  const std::string text = DescribeDevices(report);
  std::printf("QueryDevices: %s\n", text.c_str());
  if (report.gpus.empty()) {
    EXPECT_FALSE(report.no_gpu_reason.empty());
    EXPECT_EQ(text, "no GPU (" + report.no_gpu_reason + ")");
    return;
  }
  EXPECT_TRUE(report.no_gpu_reason.empty()) << report.no_gpu_reason;
  for (size_t i = 0; i < report.gpus.size(); ++i) {
    const GpuInfo& gpu = report.gpus[i];
    SCOPED_TRACE("GPU " + std::to_string(i));
    EXPECT_EQ(gpu.index, static_cast<int>(i));
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.memory_bytes, 0);
    EXPECT_GE(gpu.compute_capability_major, 1);
    EXPECT_GE(gpu.compute_capability_minor, 0);
    EXPECT_GT(gpu.multiprocessors, 0);
    EXPECT_NE(text.find(gpu.name), std::string::npos) << text;
  }
  EXPECT_EQ(text.rfind(std::to_string(report.gpus.size()) + " GPU", 0), 0u) << text;
}

// A failed query must leave CUDA usable for the next one (the sticky error is cleared), and the
// answer must not change between calls.
TEST(QueryDevicesTest, RepeatedQueriesAgree) {
  const DeviceReport first = QueryDevices();
  const DeviceReport second = QueryDevices();
  EXPECT_EQ(first.gpus.size(), second.gpus.size());
  EXPECT_EQ(first.no_gpu_reason, second.no_gpu_reason);
  EXPECT_EQ(DescribeDevices(first), DescribeDevices(second));
}

GpuInfo MakeGpu(int index, std::string name, int major, int minor, int sms, int64_t bytes) {
  GpuInfo gpu;
  gpu.index = index;
  gpu.name = std::move(name);
  gpu.compute_capability_major = major;
  gpu.compute_capability_minor = minor;
  gpu.multiprocessors = sms;
  gpu.memory_bytes = bytes;
  return gpu;
}

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(DescribeDevicesTest, NoGpu) {
  DeviceReport report;
  report.no_gpu_reason = "cudaGetDeviceCount failed: cudaErrorInsufficientDriver: ...";
  EXPECT_EQ(DescribeDevices(report),
            "no GPU (cudaGetDeviceCount failed: cudaErrorInsufficientDriver: ...)");
}

TEST(DescribeDevicesTest, OneGpu) {
  DeviceReport report;
  report.gpus.push_back(MakeGpu(0, "NVIDIA H200", 9, 0, 132, 140 * kGiB));
  EXPECT_EQ(DescribeDevices(report), "1 GPU: NVIDIA H200 (sm_90, 132 SMs, 140.0 GiB)");
}

TEST(DescribeDevicesTest, TwoGpus) {
  DeviceReport report;
  report.gpus.push_back(MakeGpu(0, "NVIDIA H200", 9, 0, 132, 140 * kGiB));
  report.gpus.push_back(MakeGpu(1, "NVIDIA A100", 8, 0, 108, 80 * kGiB + kGiB / 2));
  EXPECT_EQ(DescribeDevices(report),
            "2 GPUs: NVIDIA H200 (sm_90, 132 SMs, 140.0 GiB), "
            "NVIDIA A100 (sm_80, 108 SMs, 80.5 GiB)");
}

// A report need not start at device 0 (e.g. the GPUs one worker of a node was given): the list
// is separated by position, not by CUDA index.
TEST(DescribeDevicesTest, ReportNotStartingAtDeviceZero) {
  DeviceReport report;
  report.gpus.push_back(MakeGpu(2, "GPU two", 9, 0, 132, 8 * kGiB));
  report.gpus.push_back(MakeGpu(3, "GPU three", 9, 0, 132, 8 * kGiB));
  EXPECT_EQ(DescribeDevices(report),
            "2 GPUs: GPU two (sm_90, 132 SMs, 8.0 GiB), GPU three (sm_90, 132 SMs, 8.0 GiB)");
}

}  // namespace
}  // namespace moetrain
