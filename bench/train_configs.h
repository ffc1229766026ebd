// The model and batch configurations of train_bench, shared with calibrate_bench (which measures
// the op throughputs `moetrain plan` takes for them). Synthetic data; see train_bench.cc's header
// for what each is.
#ifndef MOETRAIN_BENCH_TRAIN_CONFIGS_H_
#define MOETRAIN_BENCH_TRAIN_CONFIGS_H_

#include "engine/train/trainer.h"

namespace moetrain {

inline TrainerConfig DefaultConfig() {
  TrainerConfig c;
  c.model.vocab_size = 8192;
  c.model.hidden_size = 512;
  c.model.num_layers = 8;
  c.model.num_heads = 8;
  c.model.num_kv_heads = 8;
  c.model.ffn_dim = 2048;
  c.model.first_dense_layers = 1;
  c.model.max_seq_len = 512;
  c.model.moe.num_experts = 16;
  c.model.moe.top_k = 2;
  c.model.moe.expert_ffn_dim = 512;
  c.data.seq_len = 512;
  c.data.batch_size = 4;
  return c;
}

inline TrainerConfig D2048Config() {
  TrainerConfig c;
  c.model.vocab_size = 32768;
  c.model.hidden_size = 2048;
  c.model.num_layers = 8;
  c.model.num_heads = 16;
  c.model.num_kv_heads = 16;
  c.model.ffn_dim = 5632;
  c.model.first_dense_layers = 1;
  c.model.max_seq_len = 2048;
  c.model.moe.num_experts = 32;
  c.model.moe.top_k = 4;
  c.model.moe.expert_ffn_dim = 1408;
  c.model.moe.num_shared_experts = 2;
  c.data.seq_len = 2048;
  c.data.batch_size = 8;
  return c;
}

}  // namespace moetrain

#endif  // MOETRAIN_BENCH_TRAIN_CONFIGS_H_
