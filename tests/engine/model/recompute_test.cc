// Activation recompute (train.recompute = SELECTIVE or FULL): the same bits as keeping every
// block's activations, in the gradients, the losses, the MoE statistics and the FP8 statistics,
// while the activation buffers shrink (FULL: to one block's).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::transformer_test {
namespace {

struct Case {
  std::string name;
  ModelConfig config;
  DType dtype;
  std::optional<Fp8RecipeConfig> fp8;
  // Norm weights of 1000, so that the delayed recipe's first scales (1) saturate the FP8 inputs:
  // a recomputed forward that recorded its quantisations would count them twice.
  bool saturate = false;
};

// Four blocks (one dense), so that a recomputed block finds its buffers overwritten by others.
ModelConfig Deeper(ModelConfig c) {
  c.num_layers = 4;
  return c;
}

std::vector<Case> Cases() {
  ModelConfig mla_mtp = Deeper(TinyMlaConfig(/*q_lora_rank=*/6));
  mla_mtp.mtp_depth = 2;  // module 1's forward overwrites module 0's buffers before its backward
  ModelConfig no_dense = Deeper(TinySoftmaxTiedConfig());
  no_dense.first_dense_layers = 0;
  Fp8RecipeConfig current;
  current.recipe = Fp8RecipeKind::kCurrent;
  Fp8RecipeConfig delayed;
  delayed.amax_history_len = 4;
  return {
      {"gqa_f32", Deeper(TinyConfig()), DType::kF32, std::nullopt},
      {"gqa_bf16", Deeper(TinyConfig()), DType::kBF16, std::nullopt},
      {"all_moe_softmax_tied_f32", no_dense, DType::kF32, std::nullopt},
      {"mla_mtp2_f32", mla_mtp, DType::kF32, std::nullopt},
      {"mla_mtp2_bf16", mla_mtp, DType::kBF16, std::nullopt},
      {"gqa_fp8_current", Deeper(TinyConfig()), DType::kBF16, current},
      {"mla_mtp2_fp8_delayed", mla_mtp, DType::kBF16, delayed, /*saturate=*/true},
  };
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Transformer Make(const Case& c, Recompute recompute) {
  absl::StatusOr<Transformer> model =
      Transformer::Create(c.config, c.dtype, {}, ExecContext::Cpu(), c.fp8, recompute);
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(model->Initialize(31).ok());
  if (c.saturate) {  // until the first step's end
    for (const NamedParameter& p : model->parameters()) {
      if (p.name.find("norm.weight") == std::string::npos) continue;
      for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data<float>()[i] = 1000.0f;
    }
    EXPECT_TRUE(model->SyncComputeWeights().ok());
  }
  return std::move(model).value();
}

class RecomputeTest : public ::testing::TestWithParam<Case> {};

// Three steps of two micro-batches each (the optimizer's place taken by a fixed nudge of the
// masters, so that later steps see other weights): everything the step reports and accumulates
// is bit-identical with `mode` as without recompute.
void ExpectRecomputeGivesTheSameBits(const Case& c, Recompute mode) {
  Transformer keep = Make(c, Recompute::kNone);
  Transformer redo = Make(c, mode);
  EXPECT_EQ(redo.recompute(), mode);
  const int64_t seq = 7;  // not a power of two
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ASSERT_OK(keep.ZeroGrads());
    ASSERT_OK(redo.ZeroGrads());
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor tokens = RandomTokens(3, seq + c.config.mtp_depth, c.config.vocab_size,
                                         static_cast<uint32_t>(100 * step + micro));
      absl::StatusOr<StepResult> a = keep.ForwardBackward(tokens.view(), 0.5f);
      absl::StatusOr<StepResult> b = redo.ForwardBackward(tokens.view(), 0.5f);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->loss, b->loss);
      EXPECT_EQ(a->mtp_loss, b->mtp_loss);
      EXPECT_EQ(a->aux_loss, b->aux_loss);
      EXPECT_EQ(a->z_loss, b->z_loss);
      // One entry per MoE layer: the recomputed forwards report nothing more.
      ASSERT_EQ(a->moe_layers.size(), b->moe_layers.size());
      for (size_t l = 0; l < a->moe_layers.size(); ++l) {
        EXPECT_EQ(a->moe_layers[l].tokens_per_expert, b->moe_layers[l].tokens_per_expert);
        EXPECT_EQ(a->moe_layers[l].aux_loss, b->moe_layers[l].aux_loss);
      }
    }
    ASSERT_EQ(Copy(keep.grad_buffer()), Copy(redo.grad_buffer()));
    if (c.fp8.has_value()) {
      // The recomputed forwards record no amax and no saturation a second time.
      ASSERT_OK(keep.fp8_state()->EndStep(nullptr));
      ASSERT_OK(redo.fp8_state()->EndStep(nullptr));
      const auto& linears = keep.fp8_state()->linears();
      int64_t saturated = 0;
      for (int i = 0; i < static_cast<int>(linears.size()); ++i) {
        SCOPED_TRACE(linears[i].name);
        const auto& x = keep.fp8_state()->last_stats(i);
        const auto& y = redo.fp8_state()->last_stats(i);
        ASSERT_EQ(x.size(), y.size());
        for (size_t g = 0; g < x.size(); ++g) {
          EXPECT_EQ(x[g].amax, y[g].amax);
          EXPECT_EQ(x[g].saturated, y[g].saturated);
          EXPECT_EQ(x[g].scale, y[g].scale);
          for (int64_t count : x[g].saturated) saturated += count;
        }
      }
      if (c.saturate && step == 0) EXPECT_GT(saturated, 0);
    }
    // Move the weights alike in both, through the masters and their compute copies (the
    // saturating case: its norms back to 1, the saturated step's gradients being unusable).
    for (Transformer* m : {&keep, &redo}) {
      if (c.saturate) {
        for (const NamedParameter& p : m->parameters()) {
          if (p.name.find("norm.weight") == std::string::npos) continue;
          for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data<float>()[i] = 1.0f;
        }
        ASSERT_OK(m->SyncComputeWeights());
        continue;
      }
      float* w = m->master_buffer().data<float>();
      const float* g = m->grad_buffer().data<float>();
      for (int64_t i = 0; i < m->master_buffer().numel(); ++i) w[i] -= 1e-3f * g[i];
      ASSERT_OK(m->SyncComputeWeights());
    }
  }
  // Evaluation after a recomputed backward is unaffected.
  const Tensor eval = RandomTokens(2, seq + c.config.mtp_depth, c.config.vocab_size, 999);
  absl::StatusOr<float> ea = keep.Evaluate(eval.view());
  absl::StatusOr<float> eb = redo.Evaluate(eval.view());
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_EQ(*ea, *eb);
  // The shared buffers hold less than every block's own.
  EXPECT_LT(redo.activation_bytes(), keep.activation_bytes());
}

TEST_P(RecomputeTest, FullRecomputeGivesTheSameBits) {
  ExpectRecomputeGivesTheSameBits(GetParam(), Recompute::kFull);
}

TEST_P(RecomputeTest, SelectiveRecomputeGivesTheSameBits) {
  ExpectRecomputeGivesTheSameBits(GetParam(), Recompute::kSelective);
}

TEST(RecomputeNameTest, NamesRoundTripInAnyCase) {
  for (const Recompute mode : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    EXPECT_EQ(RecomputeFromName(RecomputeName(mode)), mode);
  }
  EXPECT_EQ(RecomputeFromName("selective"), Recompute::kSelective);
  EXPECT_EQ(RecomputeFromName("Full"), Recompute::kFull);
  EXPECT_EQ(RecomputeFromName("partial"), std::nullopt);
  EXPECT_EQ(RecomputeFromName(""), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Models, RecomputeTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Eight blocks of train_bench's default config in miniature (FFN 4·D, experts 2·D wide): the
// activation buffers of FULL are at least 5 times smaller.
TEST(RecomputeMemoryTest, FullRecomputeCutsActivationsOfEightBlocksFiveTimes) {
  ModelConfig c = TinyConfig();
  c.num_layers = 8;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.ffn_dim = 256;
  c.max_seq_len = 64;
  c.moe.num_experts = 8;
  c.moe.top_k = 4;
  c.moe.expert_ffn_dim = 128;
  const Case keep_case{"keep", c, DType::kBF16, std::nullopt};
  Transformer keep = Make(keep_case, Recompute::kNone);
  Transformer some = Make(keep_case, Recompute::kSelective);
  Transformer redo = Make(keep_case, Recompute::kFull);
  const Tensor tokens = RandomTokens(4, 64, c.vocab_size, 5);
  ASSERT_OK(keep.ForwardBackward(tokens.view()).status());
  ASSERT_OK(some.ForwardBackward(tokens.view()).status());
  ASSERT_OK(redo.ForwardBackward(tokens.view()).status());
  const double ratio =
      static_cast<double>(keep.activation_bytes()) / static_cast<double>(redo.activation_bytes());
  std::printf("activation bytes: NONE %lld, SELECTIVE %lld, FULL %lld (%.2fx)\n",
              static_cast<long long>(keep.activation_bytes()),
              static_cast<long long>(some.activation_bytes()),
              static_cast<long long>(redo.activation_bytes()), ratio);
  EXPECT_GE(ratio, 5.0);
  // Selective lets go of the norms' and SwiGLU's outputs and shares every backward scratch: it
  // lies between the two.
  EXPECT_LT(some.activation_bytes(), keep.activation_bytes());
  EXPECT_GT(some.activation_bytes(), redo.activation_bytes());
}

}  // namespace
}  // namespace moetrain::transformer_test
