// Shape of the decoder-only MoE transformer. Field names and defaults mirror JobSpec.model.
#ifndef MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_
#define MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/moe/moe_config.h"

namespace moetrain {

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 256;        // D
  int64_t num_layers = 4;           // transformer blocks
  int64_t num_heads = 4;            // H query heads
  int64_t num_kv_heads = 4;         // Hkv key/value heads; divides H (H = Hkv: multi-head)
  int64_t head_dim = 0;             // Dh; 0 = hidden_size / num_heads
  int64_t ffn_dim = 1024;           // intermediate size of the dense SwiGLU blocks
  int64_t first_dense_layers = 1;   // blocks [0, first_dense_layers) use a dense FFN, then MoE
  int64_t max_seq_len = 256;        // training sequence length (RoPE positions 0..S-1)
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  bool tie_embeddings = false;      // lm_head shares the embedding matrix
  float init_std = 0.02f;           // normal(0, init_std) for every linear weight and embedding
  MoeConfig moe;                    // the MoE FFN of blocks [first_dense_layers, num_layers)

  // OK, or InvalidArgument naming the field ("model.num_kv_heads = 3 does not divide
  // model.num_heads = 4"); also validates `moe`.
  absl::Status Validate() const;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_
