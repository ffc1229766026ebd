// TrainerConfigFromSpec: the job spec's fields reach the engine's TrainerConfig (defaults resolved,
// the micro-batch counted over all ranks, the parallel layout), and what the engine cannot run
// yet is refused naming the field.
#include "worker/job_config.h"

#include <string>

#include "absl/status/status.h"
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

TEST(JobConfigTest, WhatTheEngineCannotRunIsRefusedNamingTheField) {
  absl::StatusOr<TrainerConfig> fp8 =
      TrainerConfigFromSpec(Spec("name: x\ntrain: {precision: FP8}\n"));
  EXPECT_TRUE(absl::IsUnimplemented(fp8.status())) << fp8.status();
  EXPECT_NE(fp8.status().message().find("train.precision = FP8"), std::string::npos);
  absl::StatusOr<TrainerConfig> cuda =
      TrainerConfigFromSpec(Spec("name: x\nresources: {device: CUDA}\n"));
  EXPECT_TRUE(absl::IsUnimplemented(cuda.status())) << cuda.status();
  EXPECT_NE(cuda.status().message().find("resources.device = CUDA"), std::string::npos);
  absl::StatusOr<TrainerConfig> invalid = TrainerConfigFromSpec(
      Spec("name: x\nresources: {workers: 3}\nparallel: {expert_parallel: 2}\n"));
  EXPECT_TRUE(absl::IsInvalidArgument(invalid.status())) << invalid.status();
  EXPECT_NE(invalid.status().message().find("parallel.expert_parallel = 2"), std::string::npos);
}

}  // namespace
}  // namespace moetrain
