// What the transformer tests share: two tiny configs, random token batches, and models built and
// initialised from a config.
#ifndef MOETRAIN_TESTS_ENGINE_MODEL_TRANSFORMER_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_MODEL_TRANSFORMER_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"

namespace moetrain::transformer_test {

// V = 11, D = 8, two blocks (dense, then MoE with E = 4, k = 2 and a shared expert), H = 2 query
// heads over Hkv = 1 key/value head of Dh = 4.
inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.ffn_dim = 12;
  c.first_dense_layers = 1;
  c.max_seq_len = 8;
  c.init_std = 0.02f;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_ffn_dim = 6;
  c.moe.num_shared_experts = 1;
  c.moe.score_function = ScoreFunction::kSigmoid;
  c.moe.expert_bias = true;
  c.moe.aux_loss = AuxLossType::kSequence;
  c.moe.aux_loss_coeff = 0.05f;
  c.moe.z_loss_coeff = 0.01f;
  return c;
}

// The same size with softmax routing, the switch aux loss, multi-head attention and a tied
// LM head.
inline ModelConfig TinySoftmaxTiedConfig() {
  ModelConfig c = TinyConfig();
  c.num_kv_heads = 2;
  c.tie_embeddings = true;
  c.moe.score_function = ScoreFunction::kSoftmax;
  c.moe.expert_bias = false;
  c.moe.aux_loss = AuxLossType::kSwitch;
  return c;
}

// TinyConfig with Multi-head Latent Attention: query compression (q_lora_rank > 0) or not,
// values narrower than the keys.
inline ModelConfig TinyMlaConfig(int64_t q_lora_rank) {
  ModelConfig c = TinyConfig();
  c.attention = AttentionType::kMla;
  c.num_kv_heads = c.num_heads;
  c.mla = {.q_lora_rank = q_lora_rank,
           .kv_lora_rank = 6,
           .qk_nope_head_dim = 4,
           .qk_rope_head_dim = 4,
           .v_head_dim = 6};
  return c;
}

inline Tensor RandomTokens(int64_t batch, int64_t seq_len, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  Tensor t = Tensor::Empty(DType::kI32, {batch, seq_len + 1});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = token(rng);
  return t;
}

inline std::vector<float> Copy(const TensorView& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

inline Transformer MakeModel(const ModelConfig& config, DType dtype, uint64_t seed) {
  absl::StatusOr<Transformer> model = Transformer::Create(config, dtype);
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->Initialize(seed).ok());
  return std::move(model).value();
}

}  // namespace moetrain::transformer_test

#endif  // MOETRAIN_TESTS_ENGINE_MODEL_TRANSFORMER_TEST_UTIL_H_
