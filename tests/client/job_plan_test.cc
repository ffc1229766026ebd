// The plan of a spec where the CLI acts on it (client/job_plan.h): the conversion `moetrain plan`
// and `moetrain submit` share, one rank's device memory, and how submit completes a spec with it.
#include "client/job_plan.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"
#include "tests/integration/tiny_spec.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A small MoE spec; `resources` is its resources section (indented two spaces).
v1::JobSpec Spec(const std::string& resources, const std::string& parallel = "") {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(testutil::PlannedSpecYaml("small", 16, absl::StrCat(resources, parallel)));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

JobMemoryPlan MustPlan(const v1::JobSpec& spec) {
  absl::StatusOr<JobMemoryPlan> plan = PlanJobMemory(spec);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : JobMemoryPlan();
}

TEST(PlanTrainerConfigTest, TurnsEachGpuIntoAOneRankWorkerAtTheSpecsLayout) {
  // resources.workers unset: its default (1) before the GPUs are counted, so 8 ranks.
  const v1::JobSpec spec =
      Spec("  device: CUDA\n  devices_per_worker: 8\n", "parallel:\n  expert_parallel: 4\n");
  absl::StatusOr<TrainerConfig> config = PlanTrainerConfig(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->device.is_cpu());
  EXPECT_EQ(config->parallel.world_size(), 8);
  EXPECT_EQ(config->parallel.expert_parallel, 4);
  EXPECT_EQ(config->parallel.data_parallel, 2);
  // The spec's per-rank micro-batch (16 / 8 = 2), counted over all ranks.
  EXPECT_EQ(config->micro_batch_size, 16);
}

// More GPUs than a spec may have workers (2^20): the plan once rewrote the spec into one CPU
// worker per rank and refused it as "resources.workers = 2097152 must be at most 1048576", the
// rank count under the name of a field the user set to 2048.
TEST(PlanTrainerConfigTest, KeepsTheSpecsOwnWorkersAndDevices) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(testutil::PlannedSpecYaml(
      "wide", int64_t{1} << 21, "  device: CUDA\n  workers: 2048\n  devices_per_worker: 1024\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainerConfig> config = PlanTrainerConfig(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->device.is_cpu());
  EXPECT_EQ(config->parallel.world_size(), 1 << 21);
  EXPECT_EQ(config->micro_batch_size, int64_t{1} << 21);

  // An error names the spec's own fields and values.
  spec->mutable_parallel()->set_expert_parallel(3);
  const absl::Status refused = PlanTrainerConfig(*spec).status();
  EXPECT_THAT(refused.message(),
              HasSubstr("(resources.workers = 2048 x resources.devices_per_worker = 1024)"))
      << refused;
}

TEST(PlanJobMemoryTest, PutsTheWholeEstimateOnTheDeviceForACudaJobOnly) {
  const JobMemoryPlan cuda = MustPlan(Spec("  device: CUDA\n"));
  EXPECT_EQ(cuda.device, v1::ResourceConfig::CUDA);
  EXPECT_GT(cuda.estimate.total(), 0);
  EXPECT_EQ(cuda.device_bytes, cuda.estimate.total());
  EXPECT_EQ(cuda.DeviceBytesNeeded(), static_cast<int64_t>(std::ceil(cuda.estimate.total())));

  const JobMemoryPlan cpu = MustPlan(Spec("  device: CPU\n"));
  EXPECT_EQ(cpu.estimate.total(), cuda.estimate.total());
  EXPECT_EQ(cpu.device_bytes, 0);
  EXPECT_EQ(cpu.DeviceBytesNeeded(), 0);
}

TEST(PlanJobMemoryTest, DeviceBytesNeededRoundsUpAndCaps) {
  JobMemoryPlan plan;
  plan.device_bytes = 10.25;
  EXPECT_EQ(plan.DeviceBytesNeeded(), 11);
  plan.device_bytes = 1e30;
  EXPECT_EQ(plan.DeviceBytesNeeded(), std::numeric_limits<int64_t>::max());
  plan.device_bytes = std::numeric_limits<double>::infinity();
  EXPECT_EQ(plan.DeviceBytesNeeded(), std::numeric_limits<int64_t>::max());
}

TEST(PlanJobMemoryTest, ABadSpecNamesTheField) {
  v1::JobSpec spec = Spec("  device: CUDA\n");
  spec.mutable_model()->mutable_moe()->set_top_k(9);
  const absl::StatusOr<JobMemoryPlan> plan = PlanJobMemory(spec);
  EXPECT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("model.moe.top_k"));
}

TEST(PlanJobMemoryTest, HintsOnlyAtWhatTheSpecCanChange) {
  // One sample a rank, every expert on its own rank and activations recomputed: only the
  // model's size is left.
  v1::JobSpec narrow = Spec("  device: CUDA\n  workers: 8\n", "parallel:\n  expert_parallel: 8\n");
  narrow.mutable_train()->set_batch_size(8);
  narrow.mutable_train()->set_recompute(v1::TrainConfig::FULL);
  const JobMemoryPlan plan = MustPlan(narrow);
  EXPECT_EQ(plan.hint, "make the model smaller");
  const JobMemoryPlan wide = MustPlan(Spec("  device: CUDA\n"));
  EXPECT_THAT(wide.hint, HasSubstr("lower train.micro_batch_size (16 a rank now"));
  EXPECT_THAT(wide.hint, HasSubstr("raise parallel.expert_parallel (1 now, at most "
                                   "model.moe.num_experts = 8"));
  EXPECT_THAT(wide.hint, HasSubstr("recompute activations (train.recompute: FULL"));
  EXPECT_THAT(wide.hint, HasSubstr(", or make the model smaller"));
}

TEST(CompleteDeviceMemoryTest, FillsACudaJobsNeedFromThePlan) {
  v1::JobSpec spec = Spec("  device: CUDA\n");
  const JobMemoryPlan plan = MustPlan(spec);
  const std::string note = CompleteDeviceMemory(&spec);
  EXPECT_EQ(spec.resources().device_memory_bytes(), plan.DeviceBytesNeeded());
  EXPECT_GT(spec.resources().device_memory_bytes(), 0);
  EXPECT_EQ(note, absl::StrCat("planned device memory per rank: ", plan.estimate.DebugString()));
  // The completed spec is still valid, and completing it again changes nothing.
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  const v1::JobSpec once = spec;
  EXPECT_EQ(CompleteDeviceMemory(&spec), "");
  EXPECT_EQ(spec.resources().device_memory_bytes(), once.resources().device_memory_bytes());
}

TEST(CompleteDeviceMemoryTest, KeepsAStatedNeedAndLeavesCpuJobsAlone) {
  v1::JobSpec stated = Spec("  device: CUDA\n  device_memory_bytes: 12345\n");
  EXPECT_EQ(CompleteDeviceMemory(&stated), "");
  EXPECT_EQ(stated.resources().device_memory_bytes(), 12345);

  v1::JobSpec cpu = Spec("  device: CPU\n");
  EXPECT_EQ(CompleteDeviceMemory(&cpu), "");
  EXPECT_EQ(cpu.resources().device_memory_bytes(), 0);
  EXPECT_FALSE(cpu.resources().has_devices_per_worker());
}

TEST(CompleteDeviceMemoryTest, SaysWhyWhenTheSpecCannotBePlanned) {
  v1::JobSpec spec = Spec("  device: CUDA\n");
  spec.mutable_model()->mutable_moe()->set_top_k(9);
  const std::string note = CompleteDeviceMemory(&spec);
  EXPECT_THAT(note, StartsWith("cannot plan the device memory per rank ("));
  EXPECT_THAT(note, HasSubstr("model.moe.top_k = 9"));
  EXPECT_THAT(note, HasSubstr("submitting without resources.device_memory_bytes"));
  EXPECT_EQ(spec.resources().device_memory_bytes(), 0);
}

}  // namespace
}  // namespace moetrain
