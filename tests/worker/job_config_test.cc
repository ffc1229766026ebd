// TrainerConfigFromSpec: the job spec's fields reach the engine's TrainerConfig (defaults resolved,
// the micro-batch counted over all ranks, the parallel layout, the FP8 recipe), and what the
// engine cannot run is refused naming the field.
#include "worker/job_config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/device_query.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"

namespace moetrain {
namespace {

v1::JobSpec Spec(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(JobConfigTest, FieldsAndDefaultsReachTheTrainerConfig) {
  absl::StatusOr<TrainerConfig> config = TrainerConfigFromSpec(Spec(R"(name: mapped
model: {vocab_size: 300, hidden_size: 64, num_heads: 4, num_layers: 3, first_dense_layers: 1,
        moe: {num_experts: 8, top_k: 3, expert_ffn_dim: 32}}
data: {format: SYNTHETIC, seed: 9}
train: {steps: 50, batch_size: 12, seq_len: 16, precision: BF16, seed: 5,
        optimizer: {lr: 2e-3, min_lr: 1e-4, warmup_steps: 5, decay: LINEAR, grad_clip: 0.5}}
checkpoint: {every_steps: 10, keep_last: 4, dir: /spec/dir}
)"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job_id, "mapped");
  EXPECT_EQ(config->model.vocab_size, 300);
  EXPECT_EQ(config->model.hidden_size, 64);
  EXPECT_EQ(config->model.head_dim, 16);  // resolved: hidden_size / num_heads
  EXPECT_EQ(config->model.num_layers, 3);
  EXPECT_EQ(config->model.moe.num_experts, 8);
  EXPECT_EQ(config->model.moe.top_k, 3);
  EXPECT_EQ(config->data.batch_size, 12);
  EXPECT_EQ(config->data.seq_len, 16);
  EXPECT_EQ(config->data.seed, 9u);
  EXPECT_EQ(config->compute_dtype, DType::kBF16);
  EXPECT_EQ(config->steps, 50);
  EXPECT_EQ(config->micro_batch_size, 12);  // default: the whole batch on the one rank
  EXPECT_FLOAT_EQ(config->schedule.lr, 2e-3f);
  EXPECT_EQ(config->schedule.decay, DecayType::kLinear);
  EXPECT_EQ(config->schedule.total_steps, 50);
  EXPECT_DOUBLE_EQ(config->grad_clip, 0.5);
  EXPECT_EQ(config->checkpoint_dir, "/spec/dir");
  EXPECT_EQ(config->checkpoint_every, 10);
  EXPECT_EQ(config->keep_last, 4);
  EXPECT_EQ(config->parallel.world_size(), 1);

  // A checkpoint directory given by the caller wins over the spec's.
  config = TrainerConfigFromSpec(Spec("name: x\ncheckpoint: {dir: /spec/dir}\n"), "/given");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->checkpoint_dir, "/given");
}

TEST(JobConfigTest, TheLayoutAndAPerRankMicroBatchBecomeTheTrainersGlobalOne) {
  absl::StatusOr<TrainerConfig> config = TrainerConfigFromSpec(Spec(R"(name: gang
resources: {workers: 4}
parallel: {expert_parallel: 2, overlap_chunks: 3}
train: {batch_size: 16, micro_batch_size: 2}
)"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->parallel.expert_parallel, 2);
  EXPECT_EQ(config->parallel.data_parallel, 2);  // resolved: 4 ranks / 2
  EXPECT_EQ(config->parallel.overlap_chunks, 3);
  EXPECT_EQ(config->micro_batch_size, 8);  // 2 sequences on each of 4 ranks
  EXPECT_EQ(config->data.batch_size, 16);
}

TEST(JobConfigTest, EveryDataFormatReachesTheLoader) {
  const std::vector<std::pair<std::string, DataConfig::Format>> formats = {
      {"SYNTHETIC", DataConfig::Format::kSynthetic},
      {"LLMC", DataConfig::Format::kLlmc},
      {"U16", DataConfig::Format::kU16},
      {"U32", DataConfig::Format::kU32},
      {"TEXT", DataConfig::Format::kText}};
  for (const auto& [name, format] : formats) {
    const std::string path = format == DataConfig::Format::kSynthetic ? "" : ", path: /d/t.bin";
    absl::StatusOr<TrainerConfig> config =
        TrainerConfigFromSpec(Spec(absl::StrCat("name: x\ndata: {format: ", name, path, "}\n")));
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    EXPECT_EQ(config->data.format, format) << name;
  }
}

// FP8 computes in bf16, its linear layers' GEMMs in FP8 by the recipe; each recipe gets its own
// defaults, and BF16 and FP32 get no recipe at all.
TEST(JobConfigTest, Fp8BecomesBf16ComputeWithTheRecipe) {
  absl::StatusOr<TrainerConfig> delayed =
      TrainerConfigFromSpec(Spec("name: x\ntrain: {precision: FP8}\n"));
  ASSERT_TRUE(delayed.ok()) << delayed.status();
  EXPECT_EQ(delayed->compute_dtype, DType::kBF16);
  ASSERT_TRUE(delayed->fp8.has_value());
  EXPECT_EQ(delayed->fp8->recipe, Fp8RecipeKind::kDelayed);
  EXPECT_TRUE(delayed->fp8->hybrid);
  EXPECT_EQ(delayed->fp8->amax_history_len, 1024);
  EXPECT_EQ(delayed->fp8->margin, 0);
  EXPECT_FALSE(delayed->fp8->amax_most_recent);
  EXPECT_FALSE(delayed->fp8->pow2_scales);
  EXPECT_EQ(delayed->fp8->amax_epsilon, 0.0f);
  EXPECT_FALSE(delayed->fp8->fp8_dispatch);

  absl::StatusOr<TrainerConfig> set = TrainerConfigFromSpec(Spec(R"(name: x
train: {precision: FP8, fp8: {format: E4M3, amax_history_len: 16, margin: 2,
                              amax_compute_algo: MOST_RECENT, fp8_dispatch: true}}
)"));
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->fp8.has_value());
  EXPECT_FALSE(set->fp8->hybrid);
  EXPECT_EQ(set->fp8->amax_history_len, 16);
  EXPECT_EQ(set->fp8->margin, 2);
  EXPECT_TRUE(set->fp8->amax_most_recent);
  EXPECT_TRUE(set->fp8->fp8_dispatch);

  absl::StatusOr<TrainerConfig> current = TrainerConfigFromSpec(
      Spec("name: x\ntrain: {precision: FP8, fp8: {recipe: CURRENT, amax_epsilon: 1e-12}}\n"));
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->fp8->recipe, Fp8RecipeKind::kCurrent);
  EXPECT_FALSE(current->fp8->pow2_scales);
  EXPECT_EQ(current->fp8->amax_epsilon, 1e-12f);

  absl::StatusOr<TrainerConfig> blockwise =
      TrainerConfigFromSpec(Spec("name: x\ntrain: {precision: FP8, fp8: {recipe: BLOCKWISE}}\n"));
  ASSERT_TRUE(blockwise.ok()) << blockwise.status();
  EXPECT_EQ(blockwise->fp8->recipe, Fp8RecipeKind::kBlockwise);
  EXPECT_TRUE(blockwise->fp8->pow2_scales);
  absl::StatusOr<TrainerConfig> exact_blocks = TrainerConfigFromSpec(
      Spec("name: x\ntrain: {precision: FP8, fp8: {recipe: BLOCKWISE, power_2_scales: false}}\n"));
  ASSERT_TRUE(exact_blocks.ok()) << exact_blocks.status();
  EXPECT_FALSE(exact_blocks->fp8->pow2_scales);

  absl::StatusOr<TrainerConfig> mxfp8 =
      TrainerConfigFromSpec(Spec("name: x\ntrain: {precision: FP8, fp8: {recipe: MXFP8}}\n"));
  ASSERT_TRUE(mxfp8.ok()) << mxfp8.status();
  EXPECT_EQ(mxfp8->fp8->recipe, Fp8RecipeKind::kMxfp8);

  for (const char* precision : {"FP32", "BF16"}) {
    absl::StatusOr<TrainerConfig> plain =
        TrainerConfigFromSpec(Spec(absl::StrCat("name: x\ntrain: {precision: ", precision, "}\n")));
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE(plain->fp8.has_value()) << precision;
  }
}

TEST(JobConfigTest, WhatTheEngineCannotRunIsRefusedNamingTheField) {
  // An FP8 option the recipe does not read: refused, not ignored.
  absl::StatusOr<TrainerConfig> fp8 = TrainerConfigFromSpec(
      Spec("name: x\ntrain: {precision: FP8, fp8: {recipe: MXFP8, power_2_scales: true}}\n"));
  EXPECT_TRUE(absl::IsInvalidArgument(fp8.status())) << fp8.status();
  EXPECT_NE(fp8.status().message().find("train.fp8.power_2_scales = true"), std::string::npos)
      << fp8.status();
  absl::StatusOr<TrainerConfig> invalid = TrainerConfigFromSpec(
      Spec("name: x\nresources: {workers: 3}\nparallel: {expert_parallel: 2}\n"));
  EXPECT_TRUE(absl::IsInvalidArgument(invalid.status())) << invalid.status();
  EXPECT_NE(invalid.status().message().find("parallel.expert_parallel = 2"), std::string::npos);
}

GpuInfo Gpu(int index, int64_t memory_bytes) {
  GpuInfo gpu;
  gpu.index = index;
  gpu.name = "GPU";
  gpu.memory_bytes = memory_bytes;
  return gpu;
}

DeviceReport Report(std::vector<GpuInfo> gpus, std::string no_gpu_reason = "") {
  DeviceReport report;
  report.gpus = std::move(gpus);
  report.no_gpu_reason = std::move(no_gpu_reason);
  return report;
}

TEST(JobConfigTest, ACudaSpecGetsTheFirstGpuOrFailsAtOnceWithoutOne) {
  const DeviceReport report = QueryDevices();
  absl::StatusOr<TrainerConfig> cuda =
      TrainerConfigFromSpec(Spec("name: x\nresources: {device: CUDA}\n"));
  if (!report.gpus.empty()) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ(cuda->device, Device::Cuda(0));
    return;
  }
  // No GPU here: the error names the field and says why, with the CUDA error (or the build).
  EXPECT_TRUE(absl::IsUnavailable(cuda.status())) << cuda.status();
  EXPECT_NE(
      cuda.status().message().find("resources.device = CUDA: no usable GPU on this machine ("),
      std::string::npos)
      << cuda.status();
  EXPECT_NE(cuda.status().message().find(report.no_gpu_reason), std::string::npos) << cuda.status();
  absl::StatusOr<TrainerConfig> cpu = TrainerConfigFromSpec(Spec("name: x\n"));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->device.is_cpu());
}

TEST(JobConfigTest, CheckUsableGpuNamesTheFieldAndTheReason) {
  EXPECT_TRUE(CheckUsableGpu(Report({Gpu(0, 0)})).ok());
  const absl::Status none = CheckUsableGpu(
      Report({}, "cudaGetDeviceCount failed: cudaErrorNoDevice: no CUDA-capable device"));
  EXPECT_TRUE(absl::IsUnavailable(none)) << none;
  EXPECT_EQ(none.message(),
            "resources.device = CUDA: no usable GPU on this machine (cudaGetDeviceCount failed: "
            "cudaErrorNoDevice: no CUDA-capable device)");
}

TEST(JobConfigTest, DeviceFlagParses) {
  absl::StatusOr<DeviceFlag> cpu = ParseDeviceFlag("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device, v1::ResourceConfig::CPU);
  absl::StatusOr<DeviceFlag> all = ParseDeviceFlag("cuda");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->device, v1::ResourceConfig::CUDA);
  EXPECT_TRUE(all->indexes.empty());
  absl::StatusOr<DeviceFlag> list = ParseDeviceFlag("cuda:0,2");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->device, v1::ResourceConfig::CUDA);
  EXPECT_EQ(list->indexes, (std::vector<int>{0, 2}));
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"cuda:0,0", "--devices = 'cuda:0,0': GPU 0 is listed twice"},
           {"cuda:1,-1", "'-1' is not a device index"},
           {"cuda:0,,1", "'' is not a device index"},
           {"cuda:x", "'x' is not a device index"},
           {"cuda:", "is neither 'cpu', 'cuda' (every GPU) nor 'cuda:I,J,...'"},
           {"gpu", "is neither"},
           {"CUDA", "is neither"}}) {
    absl::StatusOr<DeviceFlag> bad = ParseDeviceFlag(text);
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << text << ": " << bad.status();
    EXPECT_NE(bad.status().message().find(message), std::string::npos) << bad.status();
  }
}

TEST(JobConfigTest, DevicesOfferedCountsGpusAndTakesTheSmallestMemory) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  const DeviceReport three = Report({Gpu(0, 80 * kGiB), Gpu(1, 40 * kGiB), Gpu(2, 80 * kGiB)});
  absl::StatusOr<OfferedDevices> all = DevicesOffered("cuda", *ParseDeviceFlag("cuda"), three);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->device, v1::ResourceConfig::CUDA);
  EXPECT_EQ(all->count, 3);
  EXPECT_EQ(all->memory_bytes, 40 * kGiB);
  // "cuda:0,2" with CUDA_VISIBLE_DEVICES=0,2: the report holds exactly the two.
  const DeviceReport two = Report({Gpu(0, 80 * kGiB), Gpu(1, 96 * kGiB)});
  absl::StatusOr<OfferedDevices> list =
      DevicesOffered("cuda:0,2", *ParseDeviceFlag("cuda:0,2"), two);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->count, 2);
  EXPECT_EQ(list->memory_bytes, 80 * kGiB);

  // The CPU never looks at the GPUs.
  absl::StatusOr<OfferedDevices> cpu = DevicesOffered("cpu", *ParseDeviceFlag("cpu"), Report({}));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device, v1::ResourceConfig::CPU);
  EXPECT_EQ(cpu->count, 1);
  EXPECT_EQ(cpu->memory_bytes, 0);
}

TEST(JobConfigTest, DevicesOfferedFailsWithoutTheGpusItAsksFor) {
  const DeviceReport none = Report({}, "cudaGetDeviceCount failed: cudaErrorNoDevice");
  for (const std::string text : {"cuda", "cuda:0", "cuda:1,3"}) {
    absl::StatusOr<OfferedDevices> offered = DevicesOffered(text, *ParseDeviceFlag(text), none);
    EXPECT_TRUE(absl::IsFailedPrecondition(offered.status())) << offered.status();
    EXPECT_EQ(offered.status().message(),
              "--devices = '" + text +
                  "': no usable GPU on this machine (cudaGetDeviceCount failed: "
                  "cudaErrorNoDevice)");
  }
  // "cuda:0,5" on a machine of 2 GPUs: CUDA shows GPU 0 and hides 5.
  const DeviceReport one = Report({Gpu(0, int64_t{80} << 30)});
  absl::StatusOr<OfferedDevices> missing =
      DevicesOffered("cuda:0,5", *ParseDeviceFlag("cuda:0,5"), one);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find(
                "--devices = 'cuda:0,5': GPU 5 does not exist on this machine or is not usable"),
            std::string::npos)
      << missing.status();
}

}  // namespace
}  // namespace moetrain
