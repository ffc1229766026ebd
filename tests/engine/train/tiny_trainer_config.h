// The tiny job the trainer tests run: a 2-block MoE transformer (one dense block, one MoE block
// of 4 experts, top-2, a shared expert, sigmoid routing with the expert bias and the switch aux
// loss) on a synthetic source, 8 sequences a step in micro-batches of 4, 8 steps, a checkpoint
// every 4.
#ifndef MOETRAIN_TESTS_ENGINE_TRAIN_TINY_TRAINER_CONFIG_H_
#define MOETRAIN_TESTS_ENGINE_TRAIN_TINY_TRAINER_CONFIG_H_

#include <string>

#include "engine/train/trainer.h"

namespace moetrain::testing_config {

inline TrainerConfig TinyTrainerConfig(const std::string& checkpoint_dir) {
  TrainerConfig c;
  c.job_id = "tiny";
  c.model.vocab_size = 32;
  c.model.hidden_size = 32;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.ffn_dim = 64;
  c.model.first_dense_layers = 1;
  c.model.max_seq_len = 32;
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.model.moe.expert_ffn_dim = 32;
  c.model.moe.num_shared_experts = 1;
  c.model.moe.score_function = ScoreFunction::kSigmoid;
  c.model.moe.expert_bias = true;
  c.model.moe.aux_loss = AuxLossType::kSwitch;
  c.model.moe.aux_loss_coeff = 1e-3f;
  c.data.format = DataConfig::Format::kSynthetic;
  c.data.vocab_size = 32;
  c.data.synthetic_vocab_size = 32;
  c.data.seq_len = 32;
  c.data.batch_size = 8;
  c.data.seed = 5;
  c.micro_batch_size = 4;
  c.steps = 8;
  c.schedule.lr = 3e-3f;
  c.schedule.min_lr = 3e-4f;
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = 8;
  c.seed = 17;
  c.log_every = 1;
  c.checkpoint_dir = checkpoint_dir;
  c.checkpoint_every = 4;
  c.keep_last = 5;
  return c;
}

}  // namespace moetrain::testing_config

#endif  // MOETRAIN_TESTS_ENGINE_TRAIN_TINY_TRAINER_CONFIG_H_
