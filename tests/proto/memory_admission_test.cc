// The device-memory admission rule the coordinator applies at submit and `moetrain submit
// --dry-run` predicts with (moetrain/v1/memory_admission.h), at its edges: numbers in, a verdict
// and a message with the numbers out.
#include "moetrain/v1/memory_admission.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

OfferedWorker Gpu(int64_t devices, int64_t memory_bytes) {
  return {.device = v1::ResourceConfig::CUDA,
          .device_count = devices,
          .device_memory_bytes = memory_bytes};
}

DeviceMemoryNeed CudaNeed(int64_t bytes, int64_t devices_per_worker = 1) {
  return {.job_name = "big",
          .device = v1::ResourceConfig::CUDA,
          .devices_per_worker = devices_per_worker,
          .bytes_per_rank = bytes};
}

TEST(DeviceMemoryNeedOfTest, ReadsTheSpecsResourcesWithTheirDefaults) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml("name: big\nresources: {device: CUDA, device_memory_bytes: 18845101261}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const DeviceMemoryNeed need = DeviceMemoryNeedOf(*spec);
  EXPECT_EQ(need.job_name, "big");
  EXPECT_EQ(need.device, v1::ResourceConfig::CUDA);
  // Unset: its default, 1.
  EXPECT_EQ(need.devices_per_worker, 1);
  EXPECT_EQ(need.bytes_per_rank, 18845101261);

  spec->mutable_resources()->set_devices_per_worker(4);
  EXPECT_EQ(DeviceMemoryNeedOf(*spec).devices_per_worker, 4);
  // Not stated: 0.
  EXPECT_EQ(DeviceMemoryNeedOf(v1::JobSpec()).bytes_per_rank, 0);
}

TEST(JudgeDeviceMemoryTest, RefusesOnlyWhenEveryMatchingWorkerIsKnownAndTooSmall) {
  // 17.55 GiB: a figure `moetrain submit` might send.
  const int64_t need = 18845101261;
  const DeviceMemoryVerdict refused =
      JudgeDeviceMemory(CudaNeed(need), {Gpu(1, 1 * kGiB), Gpu(2, 2 * kGiB)});
  EXPECT_TRUE(refused.refused());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status)) << refused.status;
  EXPECT_EQ(refused.matching_workers, 2);
  EXPECT_EQ(refused.known_memory_workers, 2);
  EXPECT_EQ(refused.enough_memory_workers, 0);
  EXPECT_EQ(refused.smallest_known_bytes, 1 * kGiB);
  EXPECT_EQ(refused.largest_known_bytes, 2 * kGiB);
  EXPECT_EQ(refused.status.message(),
            "job big needs 17.55 GiB of device memory per rank (resources.device_memory_bytes = "
            "18845101261); the largest of the 2 registered CUDA workers offers 2.00 GiB a device; "
            "lower train.micro_batch_size or raise parallel.expert_parallel, or make the model "
            "smaller; `moetrain plan SPEC` shows where the memory goes");

  // One worker that says nothing of its memory might hold it.
  EXPECT_FALSE(JudgeDeviceMemory(CudaNeed(need), {Gpu(1, kGiB), Gpu(1, 0)}).refused());
  // Exactly the need is enough; one byte less is not.
  const DeviceMemoryVerdict exact = JudgeDeviceMemory(CudaNeed(need), {Gpu(1, kGiB), Gpu(1, need)});
  EXPECT_FALSE(exact.refused()) << exact.status;
  EXPECT_EQ(exact.enough_memory_workers, 1);
  EXPECT_TRUE(JudgeDeviceMemory(CudaNeed(need), {Gpu(1, need - 1)}).refused());
  // No matching worker: the job waits for one.
  EXPECT_FALSE(JudgeDeviceMemory(CudaNeed(need), {}).refused());
}

TEST(JudgeDeviceMemoryTest, ANeedNotStatedIsNeverRefused) {
  const DeviceMemoryVerdict verdict = JudgeDeviceMemory(CudaNeed(0), {Gpu(1, 1)});
  EXPECT_FALSE(verdict.refused());
  EXPECT_EQ(verdict.matching_workers, 1);
  EXPECT_EQ(verdict.enough_memory_workers, 1);
  EXPECT_FALSE(JudgeDeviceMemory(CudaNeed(-5), {Gpu(1, 1)}).refused());
}

TEST(JudgeDeviceMemoryTest, IgnoresOtherKindsAndTooFewDevices) {
  const int64_t need = 10 * kGiB;
  const DeviceMemoryVerdict verdict =
      JudgeDeviceMemory(CudaNeed(need, /*devices_per_worker=*/2),
                        {Gpu(2, kGiB), Gpu(1, 100 * kGiB),
                         OfferedWorker{.device = v1::ResourceConfig::CPU, .device_count = 64}});
  EXPECT_EQ(verdict.matching_workers, 1);
  EXPECT_TRUE(verdict.refused());
  EXPECT_THAT(verdict.status.message(),
              HasSubstr("the only registered CUDA worker with at least 2 devices offers 1.00 GiB"));

  // Only the one-device worker is large: with none that matches, it waits.
  EXPECT_FALSE(JudgeDeviceMemory(CudaNeed(need, 2), {Gpu(1, 100 * kGiB)}).refused());
  // A large worker counts (the fleet passes LOST ones in too: they may come back).
  EXPECT_FALSE(JudgeDeviceMemory(CudaNeed(need, 2), {Gpu(2, kGiB), Gpu(2, 100 * kGiB)}).refused());
}

TEST(JudgeDeviceMemoryTest, NeverRefusesACpuJob) {
  // CPU workers advertise no device memory, so even a stated need finds none too small.
  const DeviceMemoryNeed need{
      .job_name = "cpu", .device = v1::ResourceConfig::CPU, .bytes_per_rank = 100 * kGiB};
  const DeviceMemoryVerdict verdict = JudgeDeviceMemory(
      need, {OfferedWorker{.device = v1::ResourceConfig::CPU, .device_count = 1}, Gpu(1, kGiB)});
  EXPECT_EQ(verdict.matching_workers, 1);
  EXPECT_EQ(verdict.known_memory_workers, 0);
  EXPECT_FALSE(verdict.refused());
}

TEST(FormatGiBTest, TwoDecimals) {
  EXPECT_EQ(FormatGiB(2 * kGiB), "2.00 GiB");
  EXPECT_EQ(FormatGiB(18845101261), "17.55 GiB");
  EXPECT_EQ(FormatGiB(1024 * kGiB), "1024.00 GiB");
}

}  // namespace
}  // namespace moetrain
