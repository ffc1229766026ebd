// Shape of the decoder-only MoE transformer. Field names and defaults mirror JobSpec.model.
#ifndef MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_
#define MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/moe/moe_config.h"

namespace moetrain {

// The attention of every block.
enum class AttentionType : uint8_t {
  kGqa,  // grouped-query (multi-head when num_kv_heads = num_heads): q/k/v/o projections
  kMla,  // DeepSeek-V3's Multi-head Latent Attention (MlaConfig)
};

// Multi-head Latent Attention, as Hugging Face's DeepSeek-V3 defines it. Per token:
//   q = q_b_proj(RMSNorm_q(q_a_proj(n))), or q_proj(n) when q_lora_rank = 0: H heads of
//       [nope | rope] features;
//   [c | k_rope] = kv_a_proj_with_mqa(n); [k_nope | v] per head = kv_b_proj(RMSNorm_kv(c));
//   k = [k_nope | k_rope] (k_rope shared by every head); RoPE on the rope features only, in the
//   interleaved layout (pairs 2i, 2i+1); softmax scale 1/√(qk_nope + qk_rope).
// The defaults are DeepSeek-V3's but q_lora_rank's (DeepSeek-V3: 1536).
struct MlaConfig {
  int64_t q_lora_rank = 0;         // query compression rank; 0 = one q_proj
  int64_t kv_lora_rank = 512;      // width of the compressed key/value latent c
  int64_t qk_nope_head_dim = 128;  // per-head query/key features without RoPE
  int64_t qk_rope_head_dim = 64;   // per-head query/key features with RoPE (k's shared); even
  int64_t v_head_dim = 128;        // per-head value width; at most qk_nope + qk_rope

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 256;       // D
  int64_t num_layers = 4;          // transformer blocks
  int64_t num_heads = 4;           // H query heads
  int64_t num_kv_heads = 4;        // Hkv key/value heads; divides H (H = Hkv: multi-head)
  int64_t head_dim = 0;            // Dh; 0 = hidden_size / num_heads
  int64_t ffn_dim = 1024;          // intermediate size of the dense SwiGLU blocks
  int64_t first_dense_layers = 1;  // blocks [0, first_dense_layers) use a dense FFN, then MoE
  int64_t max_seq_len = 256;       // training sequence length (RoPE positions 0..S-1)
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  bool tie_embeddings = false;  // lm_head shares the embedding matrix
  float init_std = 0.02f;       // normal(0, init_std) for every linear weight and embedding
  MoeConfig moe;                // the MoE FFN of blocks [first_dense_layers, num_layers)
  AttentionType attention = AttentionType::kGqa;
  MlaConfig mla;  // read only with attention = kMla (num_kv_heads, head_dim not)
  // Multi-token prediction (DeepSeek-V3): depth d adds d sequential modules, module k predicting
  // token t+k+1 from module k−1's hidden state at t and the embedding of token t+k; their mean
  // cross-entropy enters the loss with weight mtp_loss_weight. Each module's block is an MoE
  // block (Hugging Face numbers it model.layers.{num_layers + k − 1}). 0 = none.
  int64_t mtp_depth = 0;
  float mtp_loss_weight = 0.1f;

  // OK, or InvalidArgument naming the field ("model.num_kv_heads = 3 does not divide
  // model.num_heads = 4"); also validates `moe`.
  absl::Status Validate() const;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  bool is_mla() const { return attention == AttentionType::kMla; }
  // Blocks that run: the num_layers of the model, then one per MTP module.
  int64_t total_blocks() const { return num_layers + mtp_depth; }

 private:
  absl::Status ValidateGqa() const;  // num_kv_heads, head_dim
  absl::Status ValidateMla() const;  // mla
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_MODEL_CONFIG_H_
