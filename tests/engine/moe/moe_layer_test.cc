// The MoE layer against a float64 reference (moe_reference.h): forward output, every gradient and
// the stats, for each router variant, in f32 and bf16; accumulation into existing grads,
// determinism, and reuse of a layer across batch sizes. The reference itself is checked against
// central differences in moe_layer_gradient_test.cc, invalid inputs in moe_layer_errors_test.cc.
#include "engine/moe/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/moe_reference.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

// ---------------------------------------------------------------------------------------------
// The engine's grads and runs, and the reference for a problem.

// The grads' tensors in a fixed order (the shared ones only when present), and their names.
std::vector<const Tensor*> GradList(const EngineGrads& g) {
  std::vector<const Tensor*> list = {&g.router, &g.expert_gate_up, &g.expert_down};
  if (!g.shared_gate_up.empty()) {
    list.push_back(&g.shared_gate_up);
    list.push_back(&g.shared_down);
  }
  return list;
}

const char* GradName(size_t i) {
  static constexpr const char* kNames[] = {"d_router", "d_expert_gate_up", "d_expert_down",
                                           "d_shared_gate_up", "d_shared_down"};
  return kNames[i];
}

void CopyGrads(const EngineGrads& from, const EngineGrads& to) {
  const std::vector<const Tensor*> a = GradList(from), b = GradList(to);
  for (size_t i = 0; i < a.size(); ++i) {
    std::memcpy(b[i]->data<float>(), a[i]->data<float>(), a[i]->numel() * sizeof(float));
  }
}

struct EngineRun {
  Tensor out;  // (T, D) compute dtype
  Tensor d_x;  // (T, D) compute dtype
  MoeStats stats;
};

absl::Status ForwardBackward(MoeLayer& layer, const Problem& p, const EngineInputs& in,
                             const EngineGrads& grads, EngineRun* run) {
  run->out = NanTensor(p.dtype, {p.tokens, p.hidden});
  run->d_x = NanTensor(p.dtype, {p.tokens, p.hidden});
  absl::Status status =
      layer.Forward(in.weights(), in.x, p.tokens_per_sequence, run->out, &run->stats);
  if (!status.ok()) return status;
  MoeGrads g = grads.view();
  return layer.Backward(in.weights(), in.d_out, run->d_x, &g);
}

// The sorted set of experts each token chose.
std::vector<std::vector<int>> ChosenSets(const reference::Routing& r, int64_t k) {
  std::vector<std::vector<int>> sets(r.experts.size() / k);
  for (size_t t = 0; t < sets.size(); ++t) {
    sets[t].assign(r.experts.begin() + t * k, r.experts.begin() + (t + 1) * k);
    std::sort(sets[t].begin(), sets[t].end());
  }
  return sets;
}

// Experts that compute at least one pair (chosen and not dropped).
std::vector<char> ExpertsWithRows(const reference::Routing& r, int64_t num_experts) {
  std::vector<char> has(num_experts, 0);
  for (size_t i = 0; i < r.experts.size(); ++i) {
    if (r.kept[i]) has[r.experts[i]] = 1;
  }
  return has;
}

struct Reference {
  reference::Weights weights;
  std::vector<double> x, d_out;
  reference::ForwardResult forward;
  reference::Grads grads;
};

Reference ComputeReference(const Problem& p) {
  Reference ref;
  ref.weights = ToReference(p);
  ref.x = ToDoubles(p.x);
  ref.d_out = ToDoubles(p.d_out);
  ref.forward = reference::Forward(p.config, ref.weights, ref.x, p.tokens, p.tokens_per_sequence);
  ref.grads = reference::Backward(p.config, ref.weights, ref.x, p.tokens, p.tokens_per_sequence,
                                  ref.forward, ref.d_out);
  return ref;
}

// What each case claims to exercise, checked on the reference: otherwise a passing test proves
// less than its name says.
void CheckPremises(const LayerCase& c, const Problem& p, const Reference& ref) {
  const reference::Routing& r = ref.forward.routing;
  const int64_t T = p.tokens, E = p.experts(), k = p.config.top_k;
  const bool ties = c.init == Init::kZeroRouter || c.init == Init::kGroupTies;
  if (!ties) {
    // f32 logits differ from the float64 ones by ~1e-7: no decision may be closer than that.
    EXPECT_GT(r.selection_margin, 1e-5) << "seed " << c.seed << " gives a near-tie in top-k";
    EXPECT_GT(r.capacity_margin, 1e-5) << "seed " << c.seed << " gives a near-tie at capacity";
  }
  switch (c.init) {
    case Init::kRandom:
      break;
    case Init::kDeadAndSingleExpert:
      EXPECT_EQ(r.tokens_per_expert[E - 1], 0);
      EXPECT_EQ(r.tokens_per_expert[E - 2], 1);
      break;
    case Init::kZeroRouter:
      for (int64_t e = 0; e < E; ++e) EXPECT_EQ(r.tokens_per_expert[e], e < k ? T : 0);
      break;
    case Init::kGroupTies:
      EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{T, T, T, T, 0, 0, 0, 0}));
      break;
  }
  if (p.config.capacity_factor > 0.0f) {
    EXPECT_GT(r.dropped, 0) << "no pair was dropped";
  }
  if (p.config.aux_loss != AuxLossType::kNone) {
    EXPECT_GT(r.aux_loss, 0.0);
  }
  if (p.config.z_loss_coeff > 0.0f) {
    EXPECT_GT(r.z_loss, 0.0);
  }
  if (c.init == Init::kRandom && p.config.expert_bias) {
    MoeConfig no_bias = p.config;
    no_bias.expert_bias = false;
    const reference::Routing unbiased =
        reference::Route(no_bias, ref.weights, ref.x, T, p.tokens_per_sequence);
    EXPECT_NE(ChosenSets(unbiased, k), ChosenSets(r, k)) << "the bias changes no selection";
  }
  if (c.init == Init::kRandom && p.config.num_groups > 1) {
    MoeConfig ungrouped = p.config;
    ungrouped.num_groups = 1;
    ungrouped.group_top_k = 1;
    const reference::Routing plain =
        reference::Route(ungrouped, ref.weights, ref.x, T, p.tokens_per_sequence);
    EXPECT_NE(ChosenSets(plain, k), ChosenSets(r, k)) << "the group limit changes no selection";
  }
}

// ---------------------------------------------------------------------------------------------
// The configurations. T×D×F = 37×24×20 unless stated: no size is a multiple of a tile.

std::vector<LayerCase> LayerCases() {
  using enum ScoreFunction;
  using enum AuxLossType;
  return {
      {.name = "SoftmaxTopkNormalized",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20}},
      {.name = "SoftmaxTopkUnnormalizedScaled",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .normalize_topk_weights = false,
                  .routed_scaling_factor = 1.5f},
       .seed = 2},
      {.name = "SoftmaxAfterTopk",
       .config = {.num_experts = 8,
                  .top_k = 3,
                  .expert_ffn_dim = 20,
                  .softmax_before_topk = false,
                  .routed_scaling_factor = 1.5f},
       .seed = 3},
      {.name = "SigmoidBiasNormalizedScaled",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .expert_bias = true},
       .seed = 4},
      {.name = "SigmoidUnnormalized",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .normalize_topk_weights = false},
       .seed = 5},
      {.name = "GroupLimitedDeepSeekV3",
       .config = {.num_experts = 256,
                  .top_k = 8,
                  .expert_ffn_dim = 12,
                  .num_shared_experts = 1,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .num_groups = 8,
                  .group_top_k = 4,
                  .expert_bias = true},
       .hidden = 16,
       .seed = 6},
      {.name = "TopKEqualsNumExperts",
       .config = {.num_experts = 4, .top_k = 4, .expert_ffn_dim = 20},
       .seed = 7},
      {.name = "SingleExpert",
       .config = {.num_experts = 1, .top_k = 1, .expert_ffn_dim = 20},
       .seed = 8},
      {.name = "SingleToken",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20},
       .tokens = 1,
       .seed = 9},
      {.name = "ExpertWithNoTokensAndExpertWithOne",
       .config = {.num_experts = 6, .top_k = 2, .expert_ffn_dim = 20},
       .init = Init::kDeadAndSingleExpert,
       .seed = 10},
      {.name = "SharedExperts",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20, .num_shared_experts = 2},
       .seed = 11},
      {.name = "SharedExpertsWithAuxAndZLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .num_shared_experts = 2,
                  .score_function = kSigmoid,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .z_loss_coeff = 0.05f},
       .seed = 12},
      {.name = "SwitchAuxLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f},
       .seed = 13},
      {.name = "SequenceAuxLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.5f},
       .tokens = 35,
       .tokens_per_sequence = 7,
       .seed = 14},
      {.name = "ZLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .softmax_before_topk = false,
                  .z_loss_coeff = 0.1f},
       .seed = 15},
      {.name = "CapacityByProbability",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .capacity_factor = 0.75f,
                  .drop_policy = DropPolicy::kProbability},
       .seed = 16},
      {.name = "CapacityByPosition",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .capacity_factor = 0.75f,
                  .drop_policy = DropPolicy::kPosition},
       .seed = 17},
      {.name = "TiesGoToLowerExperts",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20},
       .init = Init::kZeroRouter,
       .seed = 18},
      {.name = "GroupTiesGoToLowerGroups",
       .config = {.num_experts = 8,
                  .top_k = 4,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .expert_bias = true},
       .init = Init::kGroupTies,
       .seed = 19},
      {.name = "LargeThreaded",
       .config = {.num_experts = 16,
                  .top_k = 4,
                  .expert_ffn_dim = 96,
                  .num_shared_experts = 1,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .z_loss_coeff = 0.05f},
       .tokens = 512,
       .hidden = 64,
       .seed = 20},
  };
}

using LayerParam = std::tuple<LayerCase, DType>;

std::string LayerParamName(const ::testing::TestParamInfo<LayerParam>& info) {
  return std::get<0>(info.param).name + "_" + std::string(DTypeName(std::get<1>(info.param)));
}

class MoeLayerTest : public ::testing::TestWithParam<LayerParam> {
 protected:
  double Tolerance() const { return std::get<1>(GetParam()) == DType::kBF16 ? 3e-2 : 1e-5; }
};

TEST_P(MoeLayerTest, MatchesFloat64Reference) {
  const auto& [c, dtype] = GetParam();
  const Problem p = MakeProblem(c, dtype);
  const Reference ref = ComputeReference(p);
  CheckPremises(c, p, ref);
  const reference::Routing& r = ref.forward.routing;

  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, dtype);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const EngineInputs in = ToEngine(p);
  const EngineGrads grads = MakeGrads(p, nullptr);
  EngineRun run;
  ASSERT_OK(ForwardBackward(*layer, p, in, grads, &run));

  struct Compared {
    const char* name;
    std::vector<double> actual;
    const std::vector<double>* expected;
  };
  std::vector<Compared> compared = {
      {"out", ToDoubles(run.out), &ref.forward.out},
      {"d_x", ToDoubles(run.d_x), &ref.grads.x},
      {"d_router", ToDoubles(grads.router), &ref.grads.router},
      {"d_expert_gate_up", ToDoubles(grads.expert_gate_up), &ref.grads.expert_gate_up},
      {"d_expert_down", ToDoubles(grads.expert_down), &ref.grads.expert_down},
  };
  if (p.shared_ffn() > 0) {
    compared.push_back(
        {"d_shared_gate_up", ToDoubles(grads.shared_gate_up), &ref.grads.shared_gate_up});
    compared.push_back({"d_shared_down", ToDoubles(grads.shared_down), &ref.grads.shared_down});
  }
  std::string report;
  for (const Compared& cmp : compared) {
    const double error = RelativeError(cmp.actual, *cmp.expected);
    EXPECT_LT(error, Tolerance()) << cmp.name;
    char line[64];
    std::snprintf(line, sizeof(line), " %s=%.1e", cmp.name, error);
    report += line;
  }
  std::printf("[ rel err  ]%s\n", report.c_str());

  // An expert that computes nothing leaves its gradient untouched (here: exactly zero).
  const int64_t D = p.hidden, F = p.ffn();
  const std::vector<char> has_rows = ExpertsWithRows(r, p.experts());
  for (int64_t e = 0; e < p.experts(); ++e) {
    if (has_rows[e]) continue;
    for (int64_t i = 0; i < 2 * F * D; ++i) {
      ASSERT_EQ(grads.expert_gate_up.data<float>()[e * 2 * F * D + i], 0.0f) << "expert " << e;
    }
    for (int64_t i = 0; i < D * F; ++i) {
      ASSERT_EQ(grads.expert_down.data<float>()[e * D * F + i], 0.0f) << "expert " << e;
    }
  }

  // Stats. The router runs in f32 in both compute dtypes.
  const MoeStats& stats = run.stats;
  EXPECT_EQ(stats.tokens_per_expert, r.tokens_per_expert);
  EXPECT_EQ(stats.dropped_tokens, r.dropped);
  EXPECT_NEAR(stats.aux_loss, r.aux_loss, 1e-5 * std::abs(r.aux_loss) + 1e-7);
  EXPECT_NEAR(stats.z_loss, r.z_loss, 1e-5 * std::abs(r.z_loss) + 1e-7);
  const double mean_load = static_cast<double>(p.tokens * p.config.top_k) / p.experts();
  const double max_load = *std::max_element(r.tokens_per_expert.begin(), r.tokens_per_expert.end());
  EXPECT_NEAR(stats.max_mean_load_ratio, max_load / mean_load, 1e-6 * max_load / mean_load);
}

TEST_P(MoeLayerTest, AccumulatesGradientsAndIsDeterministic) {
  const auto& [c, dtype] = GetParam();
  const Problem p = MakeProblem(c, dtype);
  const EngineInputs in = ToEngine(p);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, dtype);
  ASSERT_TRUE(layer.ok()) << layer.status();

  // One pass from zeroed grads: the gradient g, kept in `once`.
  const EngineGrads grads = MakeGrads(p, nullptr);
  EngineRun first;
  ASSERT_OK(ForwardBackward(*layer, p, in, grads, &first));
  const EngineGrads once = MakeGrads(p, nullptr);
  CopyGrads(grads, once);

  // The same layer again into the same grads: identical out and d_x, and 2·g.
  EngineRun second;
  ASSERT_OK(ForwardBackward(*layer, p, in, grads, &second));
  EXPECT_TRUE(BitIdentical(first.out, second.out));
  EXPECT_TRUE(BitIdentical(first.d_x, second.d_x));
  const std::vector<const Tensor*> twice_list = GradList(grads), once_list = GradList(once);
  for (size_t i = 0; i < once_list.size(); ++i) {
    std::vector<double> doubled = ToDoubles(*once_list[i]);
    for (double& v : doubled) v *= 2.0;
    EXPECT_LT(RelativeError(ToDoubles(*twice_list[i]), doubled), 1e-6) << GradName(i);
  }

  // A fresh layer from zeroed grads: bit-identical out, d_x and grads.
  {
    absl::StatusOr<MoeLayer> fresh = MoeLayer::Create(p.config, p.hidden, dtype);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    const EngineGrads again = MakeGrads(p, nullptr);
    EngineRun run;
    ASSERT_OK(ForwardBackward(*fresh, p, in, again, &run));
    EXPECT_TRUE(BitIdentical(first.out, run.out));
    EXPECT_TRUE(BitIdentical(first.d_x, run.d_x));
    const std::vector<const Tensor*> again_list = GradList(again);
    for (size_t i = 0; i < once_list.size(); ++i) {
      EXPECT_TRUE(BitIdentical(*again_list[i], *once_list[i])) << GradName(i);
    }
  }

  // A fresh layer into grads holding G0: G0 + g, and experts with no rows keep G0 exactly.
  {
    absl::StatusOr<MoeLayer> fresh = MoeLayer::Create(p.config, p.hidden, dtype);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    std::mt19937 rng(c.seed + 1000);
    const EngineGrads accumulated = MakeGrads(p, &rng);
    const EngineGrads initial = MakeGrads(p, nullptr);
    CopyGrads(accumulated, initial);
    EngineRun run;
    ASSERT_OK(ForwardBackward(*fresh, p, in, accumulated, &run));
    const std::vector<const Tensor*> after = GradList(accumulated), before = GradList(initial);
    for (size_t i = 0; i < after.size(); ++i) {
      std::vector<double> expected = ToDoubles(*before[i]);
      const std::vector<double> g = ToDoubles(*once_list[i]);
      for (size_t j = 0; j < expected.size(); ++j) expected[j] += g[j];
      EXPECT_LT(RelativeError(ToDoubles(*after[i]), expected), 1e-6) << GradName(i);
    }
    const Reference ref = ComputeReference(p);
    const std::vector<char> has_rows = ExpertsWithRows(ref.forward.routing, p.experts());
    const int64_t block_gate_up = 2 * p.ffn() * p.hidden, block_down = p.hidden * p.ffn();
    for (int64_t e = 0; e < p.experts(); ++e) {
      if (has_rows[e]) continue;
      EXPECT_EQ(std::memcmp(accumulated.expert_gate_up.data<float>() + e * block_gate_up,
                            initial.expert_gate_up.data<float>() + e * block_gate_up,
                            block_gate_up * sizeof(float)),
                0)
          << "expert " << e;
      EXPECT_EQ(std::memcmp(accumulated.expert_down.data<float>() + e * block_down,
                            initial.expert_down.data<float>() + e * block_down,
                            block_down * sizeof(float)),
                0)
          << "expert " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MoeLayerTest,
                         ::testing::Combine(::testing::ValuesIn(LayerCases()),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         LayerParamName);

// The layer keeps what Backward needs from the last Forward, whatever the batch size before it.
TEST(MoeLayerReuseTest, ForwardWithAnotherBatchSizeThenBackward) {
  LayerCase big = {.name = "big",
                   .config = {.num_experts = 8,
                              .top_k = 2,
                              .expert_ffn_dim = 20,
                              .num_shared_experts = 1,
                              .aux_loss = AuxLossType::kSwitch,
                              .aux_loss_coeff = 0.5f,
                              .capacity_factor = 0.75f},
                   .tokens = 37,
                   .seed = 31};
  LayerCase small = big;
  small.tokens = 9;
  small.seed = 32;
  const Problem p_big = MakeProblem(big, DType::kF32);
  const Problem p_small = MakeProblem(small, DType::kF32);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(big.config, big.hidden, DType::kF32);
  ASSERT_TRUE(layer.ok()) << layer.status();

  const EngineInputs in_big = ToEngine(p_big);
  const EngineGrads grads_big = MakeGrads(p_big, nullptr);
  EngineRun run_big;
  ASSERT_OK(ForwardBackward(*layer, p_big, in_big, grads_big, &run_big));

  const EngineInputs in_small = ToEngine(p_small);
  Tensor out = NanTensor(DType::kF32, {p_small.tokens, p_small.hidden});
  // Stats may be null.
  ASSERT_OK(layer->Forward(in_small.weights(), in_small.x, 0, out, nullptr));
  // A second Forward of the big batch, then the small one again: Backward sees the small one.
  Tensor out_big = NanTensor(DType::kF32, {p_big.tokens, p_big.hidden});
  ASSERT_OK(layer->Forward(in_big.weights(), in_big.x, 0, out_big, nullptr));
  EXPECT_TRUE(BitIdentical(out_big, run_big.out));
  ASSERT_OK(layer->Forward(in_small.weights(), in_small.x, 0, out, nullptr));
  const EngineGrads grads = MakeGrads(p_small, nullptr);
  Tensor d_x = NanTensor(DType::kF32, {p_small.tokens, p_small.hidden});
  MoeGrads g = grads.view();
  ASSERT_OK(layer->Backward(in_small.weights(), in_small.d_out, d_x, &g));

  const Reference ref = ComputeReference(p_small);
  EXPECT_LT(RelativeError(ToDoubles(out), ref.forward.out), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(d_x), ref.grads.x), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.router), ref.grads.router), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.expert_gate_up), ref.grads.expert_gate_up), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.expert_down), ref.grads.expert_down), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.shared_gate_up), ref.grads.shared_gate_up), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.shared_down), ref.grads.shared_down), 1e-5);
}

}  // namespace
}  // namespace moetrain::moe_test
