// The job the parallel-training tests run on every layout: the trainer tests' tiny job with the
// z-loss too, 8 sequences of 16 tokens a step in one micro-batch, 10 steps, an evaluation and a
// checkpoint every 5. Shared by the test and parallel_train_rank, so that the single-process
// reference and the ranks train the same job.
#ifndef MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_TEST_CONFIG_H_
#define MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_TEST_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/train/trainer.h"
#include "tests/engine/train/tiny_trainer_config.h"

namespace moetrain::parallel_test {

inline TrainerConfig JobConfig(const std::string& checkpoint_dir, int dp, int ep) {
  TrainerConfig c = testing_config::TinyTrainerConfig(checkpoint_dir);
  c.job_id = "parallel";
  c.model.max_seq_len = 16;
  c.model.moe.aux_loss_coeff = 1e-2f;
  c.model.moe.z_loss_coeff = 1e-3f;
  c.data.synthetic_eval_sequences = 19;  // 3 eval batches; of the last, 4 ranks get 1, 1, 1, 0
  c.data.seq_len = 16;
  c.micro_batch_size = 0;  // one micro-batch a step
  c.parallel.data_parallel = dp;
  c.parallel.expert_parallel = ep;
  // Small buckets: several all-reduces per step, started during backward.
  c.parallel.grad_bucket_bytes = 8 << 10;
  c.steps = 10;
  c.schedule.total_steps = 10;
  c.eval_every = 5;
  c.checkpoint_every = 5;
  c.keep_last = 0;
  return c;
}

// The job as DeepSeek-V3 is built: Multi-head Latent Attention (with query compression) and one
// multi-token prediction module.
inline TrainerConfig WithDeepseekV3(TrainerConfig c) {
  c.model.attention = AttentionType::kMla;
  c.model.num_kv_heads = c.model.num_heads;
  c.model.mla = {.q_lora_rank = 12,
                 .kv_lora_rank = 8,
                 .qk_nope_head_dim = 4,
                 .qk_rope_head_dim = 4,
                 .v_head_dim = 6};
  c.model.mtp_depth = 1;
  c.model.mtp_loss_weight = 0.3f;
  return c;
}

// The job in bf16 with FP8 GEMMs by `recipe` ("delayed", "current", "blockwise", "mxfp8").
inline absl::StatusOr<TrainerConfig> WithFp8(TrainerConfig c, const std::string& recipe) {
  Fp8RecipeConfig fp8;
  if (recipe == "delayed") {
    fp8.recipe = Fp8RecipeKind::kDelayed;
  } else if (recipe == "current") {
    fp8.recipe = Fp8RecipeKind::kCurrent;
  } else if (recipe == "blockwise") {
    fp8.recipe = Fp8RecipeKind::kBlockwise;
    fp8.pow2_scales = true;
  } else if (recipe == "mxfp8") {
    fp8.recipe = Fp8RecipeKind::kMxfp8;
  } else {
    return absl::InvalidArgumentError("--fp8 " + recipe + ": not a recipe");
  }
  fp8.amax_history_len = 4;
  c.compute_dtype = DType::kBF16;
  c.fp8 = fp8;
  return c;
}

}  // namespace moetrain::parallel_test

#endif  // MOETRAIN_TESTS_ENGINE_TRAIN_PARALLEL_TEST_CONFIG_H_
