// The whole model: config validation, the parameter table, initialisation, determinism, bf16,
// loss scaling, expert-bias updates and a few SGD steps.
#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "gtest/gtest.h"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::transformer_test {
namespace {

// ---------------------------------------------------------------------------------------------
// ModelConfig::Validate

TEST(ModelConfigTest, DefaultsAreValid) { EXPECT_TRUE(ModelConfig().Validate().ok()); }

TEST(ModelConfigTest, ErrorsNameTheFieldAndValue) {
  struct Case {
    void (*mutate)(ModelConfig&);
    std::string message;
  };
  const Case cases[] = {
      {[](ModelConfig& c) { c.num_kv_heads = 3; },
       "model.num_kv_heads = 3 does not divide model.num_heads = 4"},
      {[](ModelConfig& c) { c.vocab_size = 0; }, "model.vocab_size = 0"},
      {[](ModelConfig& c) { c.hidden_size = -2; }, "model.hidden_size = -2"},
      {[](ModelConfig& c) { c.num_layers = 0; }, "model.num_layers = 0"},
      {[](ModelConfig& c) { c.num_heads = 0; }, "model.num_heads = 0"},
      {[](ModelConfig& c) { c.num_kv_heads = 0; }, "model.num_kv_heads = 0"},
      {[](ModelConfig& c) { c.hidden_size = 250; },
       "model.hidden_size = 250 is not a multiple of model.num_heads = 4"},
      {[](ModelConfig& c) { c.head_dim = 7; }, "model.head_dim = 7 must be even"},
      {[](ModelConfig& c) { c.hidden_size = 12; }, "model.hidden_size = 12"},  // Dh = 3, odd
      {[](ModelConfig& c) { c.head_dim = -1; }, "model.head_dim = -1"},
      {[](ModelConfig& c) { c.ffn_dim = 0; }, "model.ffn_dim = 0"},
      {[](ModelConfig& c) { c.first_dense_layers = 5; },
       "model.first_dense_layers = 5 must be in [0, model.num_layers = 4]"},
      {[](ModelConfig& c) { c.max_seq_len = 0; }, "model.max_seq_len = 0"},
      {[](ModelConfig& c) { c.rope_theta = 0.0f; }, "model.rope_theta = 0"},
      {[](ModelConfig& c) { c.rms_norm_eps = -1e-6f; }, "model.rms_norm_eps = -1e-06"},
      {[](ModelConfig& c) { c.init_std = NAN; }, "model.init_std = nan"},
      {[](ModelConfig& c) {
         c.moe.num_experts = 8;
         c.moe.top_k = 9;
       },
       "model.moe.top_k = 9 exceeds model.moe.num_experts = 8"},
      {[](ModelConfig& c) { c.moe.expert_ffn_dim = 0; }, "model.moe.expert_ffn_dim = 0"},
  };
  for (const Case& c : cases) {
    ModelConfig config;
    c.mutate(config);
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(status.message().find(c.message), std::string::npos)
        << "got: " << status << "\nwant: " << c.message;
  }
}

TEST(ModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  ModelConfig c;
  c.hidden_size = 250;
  c.head_dim = 64;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_EQ(c.resolved_head_dim(), 64);
}

TEST(TransformerTest, CreateRejectsBadConfigAndDtype) {
  ModelConfig c = TinyConfig();
  c.num_kv_heads = 3;
  EXPECT_EQ(Transformer::Create(c, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Transformer::Create(TinyConfig(), DType::kF8E4M3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The parameter table

// The Hugging Face names, spelled out independently of the engine.
std::vector<std::string> ExpectedNames(const ModelConfig& c) {
  std::vector<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!c.tie_embeddings) names.push_back("lm_head.weight");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm.weight", "self_attn.q_proj.weight",
                          "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "post_attention_layernorm.weight"}) {
      names.push_back(p + n);
    }
    if (i < c.first_dense_layers) {
      for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
        names.push_back(p + n);
      }
      continue;
    }
    names.push_back(p + "mlp.gate.weight");
    if (c.moe.expert_bias) names.push_back(p + "mlp.gate.e_score_correction_bias");
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
        names.push_back(p + "mlp.experts." + std::to_string(e) + "." + n);
      }
    }
    if (c.moe.num_shared_experts > 0) {
      for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
        names.push_back(p + "mlp.shared_experts." + n);
      }
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

void ExpectNames(const ModelConfig& config) {
  absl::StatusOr<Transformer> model = Transformer::Create(config, DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> names;
  for (const NamedParameter& p : model->parameters()) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate names";
  EXPECT_EQ(names, ExpectedNames(config));
}

TEST(TransformerTest, ParameterNamesAreTheHuggingFaceOnes) {
  ExpectNames(TinyConfig());             // 2 layers, untied, expert bias, a shared expert
  ExpectNames(TinySoftmaxTiedConfig());  // tied: no lm_head.weight; no bias
  ModelConfig c = TinyConfig();
  c.num_layers = 4;
  c.first_dense_layers = 0;
  c.moe.num_shared_experts = 0;
  ExpectNames(c);  // all MoE, no shared experts
  c.first_dense_layers = 4;
  ExpectNames(c);  // all dense
}

TEST(TransformerTest, ParameterShapesFlagsAndViews) {
  const ModelConfig c = TinyConfig();
  absl::StatusOr<Transformer> model = Transformer::Create(c, DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t d = 8, v = 11, f = 12, fe = 6;
  std::set<const void*> starts;
  int64_t total = 0;
  for (const NamedParameter& p : model->parameters()) {
    SCOPED_TRACE(p.name);
    ASSERT_EQ(p.value.dtype(), DType::kF32);
    ASSERT_EQ(p.grad.dtype(), DType::kF32);
    EXPECT_EQ(p.value.shape(), p.grad.shape());
    EXPECT_TRUE(p.value.is_contiguous());
    EXPECT_TRUE(starts.insert(p.value.raw()).second) << "two parameters share memory";
    total += p.value.numel();
    auto shape = [&](std::vector<int64_t> want) {
      EXPECT_EQ(std::vector<int64_t>(p.value.shape().begin(), p.value.shape().end()), want);
    };
    const bool is_norm = p.name.find("norm") != std::string::npos;
    const bool is_bias = p.name.find("e_score_correction_bias") != std::string::npos;
    EXPECT_EQ(p.weight_decay, !is_norm && !is_bias);
    EXPECT_EQ(p.trainable, !is_bias);
    if (p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight") shape({v, d});
    if (is_norm) shape({d});
    if (is_bias) shape({4});
    if (p.name == "model.layers.0.self_attn.q_proj.weight") shape({8, d});
    if (p.name == "model.layers.0.self_attn.k_proj.weight") shape({4, d});
    if (p.name == "model.layers.0.self_attn.o_proj.weight") shape({d, 8});
    if (p.name == "model.layers.0.mlp.up_proj.weight") shape({f, d});
    if (p.name == "model.layers.0.mlp.down_proj.weight") shape({d, f});
    if (p.name == "model.layers.1.mlp.gate.weight") shape({4, d});
    if (p.name == "model.layers.1.mlp.experts.3.gate_proj.weight") shape({fe, d});
    if (p.name == "model.layers.1.mlp.experts.3.down_proj.weight") shape({d, fe});
    if (p.name == "model.layers.1.mlp.shared_experts.up_proj.weight") shape({fe, d});
    if (p.name == "model.layers.1.mlp.shared_experts.down_proj.weight") shape({d, fe});
  }
  EXPECT_LE(total, model->master_buffer().numel());
  EXPECT_EQ(model->master_buffer().numel(), model->grad_buffer().numel());

  // An expert's up_proj follows its gate_proj in the fused (E, 2F, D) tensor.
  auto find = [&](const std::string& name) -> const NamedParameter& {
    for (const NamedParameter& p : model->parameters()) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no " << name;
    return model->parameters().front();
  };
  const NamedParameter& gate = find("model.layers.1.mlp.experts.2.gate_proj.weight");
  const NamedParameter& up = find("model.layers.1.mlp.experts.2.up_proj.weight");
  const NamedParameter& next_gate = find("model.layers.1.mlp.experts.3.gate_proj.weight");
  EXPECT_EQ(gate.value.data<float>() + fe * d, up.value.data<float>());
  EXPECT_EQ(up.value.data<float>() + fe * d, next_gate.value.data<float>());
}

// ---------------------------------------------------------------------------------------------
// Initialisation

TEST(TransformerTest, InitIsDeterministicAndFollowsTheRules) {
  const ModelConfig c = TinyConfig();
  Transformer a = MakeModel(c, DType::kF32, 7), b = MakeModel(c, DType::kF32, 7);
  Transformer other = MakeModel(c, DType::kF32, 8);
  ASSERT_EQ(a.master_buffer().numel(), b.master_buffer().numel());
  EXPECT_EQ(std::memcmp(a.master_buffer().raw(), b.master_buffer().raw(),
                        a.master_buffer().numel() * sizeof(float)),
            0);
  EXPECT_NE(Copy(a.master_buffer()), Copy(other.master_buffer()));
  std::set<std::vector<float>> distinct;
  for (const NamedParameter& p : a.parameters()) {
    SCOPED_TRACE(p.name);
    const std::vector<float> values = Copy(p.value);
    if (p.name.find("norm") != std::string::npos) {
      EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float x) { return x == 1.0f; }));
    } else if (!p.trainable) {
      EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](float x) { return x == 0.0f; }));
    } else {
      // Each parameter draws from its own stream.
      EXPECT_TRUE(distinct.insert(values).second);
    }
  }
}

TEST(TransformerTest, InitStdIsRespected) {
  ModelConfig c = TinyConfig();
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.ffn_dim = 128;
  c.moe.expert_ffn_dim = 32;
  c.init_std = 0.05f;
  Transformer model = MakeModel(c, DType::kF32, 1);
  double sum = 0.0, sum_sq = 0.0;
  int64_t n = 0;
  for (const NamedParameter& p : model.parameters()) {
    if (p.value.rank() < 2) continue;
    for (float x : Copy(p.value)) {
      sum += x;
      sum_sq += double{x} * x;
      ++n;
    }
  }
  ASSERT_GT(n, 100000);
  const double mean = sum / n, stddev = std::sqrt(sum_sq / n - mean * mean);
  EXPECT_LT(std::abs(mean), 5.0 * 0.05 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(stddev, 0.05, 0.05 * 0.01);
}

// ---------------------------------------------------------------------------------------------
// Steps

TEST(TransformerTest, TheSameStepTwiceIsBitIdentical) {
  const ModelConfig c = TinyConfig();
  const Tensor tokens = RandomTokens(3, 7, c.vocab_size, 5);
  Transformer a = MakeModel(c, DType::kF32, 11), b = MakeModel(c, DType::kF32, 11);
  std::vector<float> first_grads;
  float first_loss = 0.0f;
  for (Transformer* model : {&a, &a, &b}) {
    // A larger batch in between regrows every activation buffer: no state may leak from it.
    ASSERT_TRUE(model->Evaluate(RandomTokens(5, 8, c.vocab_size, 6)).ok());
    EXPECT_TRUE(model->ZeroGrads().ok());
    absl::StatusOr<StepResult> r = model->ForwardBackward(tokens);
    ASSERT_TRUE(r.ok()) << r.status();
    if (first_grads.empty()) {
      first_grads = Copy(model->grad_buffer());
      first_loss = r->loss;
      continue;
    }
    EXPECT_EQ(r->loss, first_loss);
    EXPECT_EQ(std::memcmp(first_grads.data(), model->grad_buffer().raw(),
                          first_grads.size() * sizeof(float)),
              0);
  }
}

TEST(TransformerTest, StepResultReportsLossesAndLoad) {
  const ModelConfig c = TinyConfig();
  Transformer model = MakeModel(c, DType::kF32, 2);
  const Tensor tokens = RandomTokens(2, 6, c.vocab_size, 8);
  absl::StatusOr<StepResult> r = model.ForwardBackward(tokens);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens, 12);
  // Near-uniform predictions at init.
  EXPECT_NEAR(r->loss, std::log(11.0), 0.1);
  ASSERT_EQ(r->moe_layers.size(), 1u);
  const MoeStats& s = r->moe_layers[0];
  ASSERT_EQ(s.tokens_per_expert.size(), 4u);
  int64_t pairs = 0;
  for (int64_t n : s.tokens_per_expert) pairs += n;
  EXPECT_EQ(pairs, 12 * 2);
  EXPECT_GE(s.max_mean_load_ratio, 1.0f);
  EXPECT_EQ(s.dropped_tokens, 0);
  EXPECT_GT(r->aux_loss, 0.0f);
  EXPECT_GT(r->z_loss, 0.0f);
  EXPECT_EQ(r->aux_loss, s.aux_loss);

  // Evaluate: the same cross-entropy, no grads.
  std::vector<float> grads = Copy(model.grad_buffer());
  absl::StatusOr<float> eval = model.Evaluate(tokens);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(*eval, r->loss);
  EXPECT_EQ(Copy(model.grad_buffer()), grads);
}

TEST(TransformerTest, LossScaleScalesEveryGradientIncludingAuxLosses) {
  ModelConfig c = TinyConfig();
  c.init_std = 0.3f;
  c.moe.aux_loss_coeff = 0.5f;  // large, so that a wrongly scaled aux gradient shows
  c.moe.z_loss_coeff = 0.1f;
  Transformer model = MakeModel(c, DType::kF32, 6);
  const Tensor tokens = RandomTokens(2, 5, c.vocab_size, 3);
  EXPECT_TRUE(model.ZeroGrads().ok());
  absl::StatusOr<StepResult> once = model.ForwardBackward(tokens, 1.0f);
  ASSERT_TRUE(once.ok()) << once.status();
  const std::vector<float> full = Copy(model.grad_buffer());

  // Four micro-batches at 1/4 each add up to the same gradient; the report stays unscaled.
  EXPECT_TRUE(model.ZeroGrads().ok());
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<StepResult> r = model.ForwardBackward(tokens, 0.25f);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->loss, once->loss);
    EXPECT_NEAR(r->aux_loss, once->aux_loss, 1e-6 * once->aux_loss);
    EXPECT_NEAR(r->z_loss, once->z_loss, 1e-6 * once->z_loss);
  }
  const std::vector<float> summed = Copy(model.grad_buffer());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < full.size(); ++i) {
    err = std::max(err, std::abs(double{summed[i]} - full[i]));
    scale = std::max(scale, std::abs(double{full[i]}));
  }
  EXPECT_LT(err, 1e-5 * scale);

  EXPECT_EQ(model.ForwardBackward(tokens, 0.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransformerTest, Bf16LossIsCloseToF32) {
  const ModelConfig c = TinyConfig();
  ModelConfig larger = c;
  larger.vocab_size = 64;
  larger.hidden_size = 32;
  larger.init_std = 0.1f;
  for (const ModelConfig& config : {c, larger}) {
    Transformer f32 = MakeModel(config, DType::kF32, 21);
    Transformer bf16 = MakeModel(config, DType::kBF16, 21);
    const Tensor tokens = RandomTokens(2, 8, config.vocab_size, 4);
    absl::StatusOr<StepResult> a = f32.ForwardBackward(tokens);
    absl::StatusOr<StepResult> b = bf16.ForwardBackward(tokens);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_NEAR(b->loss, a->loss, 1e-2 * a->loss);
    EXPECT_NE(b->loss, a->loss);  // it did compute in bf16
    // Gradients point the same way.
    const std::vector<float> ga = Copy(f32.grad_buffer()), gb = Copy(bf16.grad_buffer());
    double dot = 0.0, na = 0.0, nb = 0.0;
    for (size_t i = 0; i < ga.size(); ++i) {
      dot += double{ga[i]} * gb[i];
      na += double{ga[i]} * ga[i];
      nb += double{gb[i]} * gb[i];
    }
    EXPECT_GT(dot / std::sqrt(na * nb), 0.99);
  }
}

TEST(TransformerTest, Bf16ComputeWeightsFollowSync) {
  const ModelConfig c = TinyConfig();
  Transformer model = MakeModel(c, DType::kBF16, 1);
  const Tensor tokens = RandomTokens(2, 5, c.vocab_size, 1);
  absl::StatusOr<float> before = model.Evaluate(tokens);
  ASSERT_TRUE(before.ok()) << before.status();
  for (NamedParameter& p : model.parameters()) {
    if (p.name != "lm_head.weight") continue;
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data<float>()[i] *= 4.0f;
  }
  absl::StatusOr<float> stale = model.Evaluate(tokens);
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(*stale, *before);  // the compute copy is refreshed only by Sync
  EXPECT_TRUE(model.SyncComputeWeights().ok());
  absl::StatusOr<float> synced = model.Evaluate(tokens);
  ASSERT_TRUE(synced.ok());
  EXPECT_NE(*synced, *before);
}

TEST(TransformerTest, SgdOnARepetitiveSequenceReducesTheLoss) {
  ModelConfig c = TinyConfig();
  c.vocab_size = 16;
  c.hidden_size = 32;
  c.init_std = 0.1f;
  c.moe.expert_ffn_dim = 16;
  Transformer model = MakeModel(c, DType::kF32, 5);
  Tensor tokens = Tensor::Empty(DType::kI32, {4, 9});
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i % 9 + i / 9) % 5);
  }
  std::vector<float> losses;
  for (int step = 0; step < 30; ++step) {
    EXPECT_TRUE(model.ZeroGrads().ok());
    absl::StatusOr<StepResult> r = model.ForwardBackward(tokens);
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
    for (NamedParameter& p : model.parameters()) {
      if (!p.trainable) continue;
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        p.value.data<float>()[i] -= 0.5f * p.grad.data<float>()[i];
      }
    }
    std::vector<std::vector<int64_t>> counts;
    for (const MoeStats& s : r->moe_layers) counts.push_back(s.tokens_per_expert);
    ASSERT_OK(model.UpdateExpertBiases(counts));
    EXPECT_TRUE(model.SyncComputeWeights().ok());
  }
  EXPECT_LT(losses.back(), 0.5f * losses.front())
      << "first " << losses.front() << ", last " << losses.back();
}

TEST(TransformerTest, UpdateExpertBiasesMovesTowardsBalance) {
  const ModelConfig c = TinyConfig();
  Transformer model = MakeModel(c, DType::kF32, 1);
  ASSERT_OK(model.UpdateExpertBiases({{10, 0, 5, 5}}));
  const float u = c.moe.expert_bias_update_rate;
  for (const NamedParameter& p : model.parameters()) {
    if (p.trainable) continue;
    ASSERT_EQ(p.name, "model.layers.1.mlp.gate.e_score_correction_bias");
    EXPECT_EQ(Copy(p.value), (std::vector<float>{-u, u, 0.0f, 0.0f}));
  }
  EXPECT_EQ(model.UpdateExpertBiases({}).code(), absl::StatusCode::kInvalidArgument);
  // Without the bias there is nothing to update.
  Transformer no_bias = MakeModel(TinySoftmaxTiedConfig(), DType::kF32, 1);
  EXPECT_TRUE(no_bias.UpdateExpertBiases({}).ok());
}

TEST(TransformerTest, RejectsBadTokens) {
  const ModelConfig c = TinyConfig();
  Transformer model = MakeModel(c, DType::kF32, 1);
  Tensor tokens = RandomTokens(2, 5, c.vocab_size, 1);
  tokens.data<int32_t>()[1 * 6 + 5] = 11;  // the last target of the second sequence
  absl::Status status = model.ForwardBackward(tokens).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tokens[1, 5] = 11"), std::string::npos) << status;
  EXPECT_EQ(model.Evaluate(RandomTokens(1, 9, c.vocab_size, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);  // S = 9 > max_seq_len = 8
  EXPECT_EQ(model.Evaluate(Tensor::Zeros(DType::kI32, {2, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);  // S = 0
  EXPECT_EQ(model.Evaluate(Tensor::Zeros(DType::kI64, {2, 3})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransformerTest, ANonFiniteLossIsANonFiniteError) {
  const ModelConfig c = TinyConfig();
  Transformer model = MakeModel(c, DType::kF32, 1);
  for (NamedParameter& p : model.parameters()) {
    if (p.name == "lm_head.weight") p.value.data<float>()[3] = NAN;
  }
  EXPECT_TRUE(model.SyncComputeWeights().ok());
  const Tensor tokens = RandomTokens(2, 5, c.vocab_size, 1);
  const absl::Status status = model.ForwardBackward(tokens).status();
  EXPECT_TRUE(IsNonFiniteError(status)) << status;
  EXPECT_TRUE(IsNonFiniteError(model.Evaluate(tokens).status()));
  // Ranks that must keep their collectives in step go through backward and see the NaN.
  BackwardOptions options;
  options.backward_through_nonfinite_loss = true;
  int64_t stages = 0;
  options.on_stage_done = [&](int64_t) {
    ++stages;
    return absl::OkStatus();
  };
  EXPECT_TRUE(model.ZeroGrads().ok());
  const absl::StatusOr<StepResult> result = model.ForwardBackward(tokens, options);
  ASSERT_OK(result.status());
  EXPECT_TRUE(std::isnan(result->loss));
  EXPECT_EQ(stages, c.num_layers + 2);
}

TEST(TransformerTest, TrainingFlopsPerToken) {
  const ModelConfig c = TinyConfig();
  // Attention projections 2·8·8 + 2·8·4 = 192; dense FFN 3·8·12 = 288; MoE router 4·8 = 32 and
  // (k + shared) · 3·8·6 = 432; LM head 11·8 = 88. Attention core 6·2·4·(S + 1) per layer.
  const double matmul = 2 * 192 + 288 + 32 + 432 + 88;
  EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(c, 5), 6 * matmul + 2 * 6 * 2 * 4 * 6);
}

}  // namespace
}  // namespace moetrain::transformer_test
