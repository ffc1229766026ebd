// The router against a float64 reference (router_reference.h), for every variant: scores,
// selection, combine weights, losses and d_logits; the reference's gradient and the engine's
// against central differences; edge cases; and determinism. Invalid arguments are in
// router_errors_test.cc, the expert-bias update in update_expert_bias_test.cc.
#include "engine/ops/router/router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/router/router_reference.h"
#include "tests/engine/ops/router/router_test_util.h"

namespace moetrain::router_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

template <typename A, typename B>
double RelErr(const A& a, const B& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

double ScalarRelErr(double a, double b) { return b != 0.0 ? std::fabs(a - b) / std::fabs(b) : a; }

double Norm(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

struct EngineResult {
  RouterOutput out;
  std::vector<float> d_logits;  // (T, E)
};

absl::Status RunEngine(Problem& p, EngineResult* result) {
  const RouterArgs args = ArgsOf(p);
  absl::Status status = RouterForward(p.config, args, &result->out);
  if (!status.ok()) return status;
  result->d_logits.assign(p.tokens * p.config.num_experts, -1.0f);
  return RouterBackward(
      p.config, args, result->out,
      TensorView(p.d_weights.data(), DType::kF32, {p.tokens, p.config.top_k}),
      TensorView(result->d_logits.data(), DType::kF32, {p.tokens, p.config.num_experts}));
}

template <typename T>
std::vector<T> Contents(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// ---------------------------------------------------------------------------------------------
// Every router variant against the reference.
// ---------------------------------------------------------------------------------------------

struct Case {
  std::string name;
  MoeConfig config;
  int64_t tokens;
  int64_t tokens_per_sequence = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> ReferenceCases() {
  return {
      {"SoftmaxPreNorm", Softmax(8, 2), 300},
      {"SoftmaxPreNoNorm", With(Softmax(16, 4), NoNorm), 257},
      {"SoftmaxPreNormRho", With(Softmax(8, 3), Rho(1.7f)), 130},
      {"SoftmaxPreNoNormRho", With(With(Softmax(8, 3), NoNorm), Rho(2.5f)), 129},
      {"SoftmaxPreBias", With(Softmax(12, 3), Bias), 200},
      {"SoftmaxPost", With(Softmax(16, 4), Post), 200},
      {"SoftmaxPostBiasRho", With(With(With(Softmax(16, 2), Post), Bias), Rho(2.0f)), 150},
      {"SigmoidBiasNorm", With(Sigmoid(64, 6), Rho(2.5f)), 150},
      {"SigmoidBiasNoNorm", With(With(Sigmoid(32, 4), NoNorm), Rho(0.5f)), 140},
      {"SigmoidNoBias", With(Sigmoid(16, 3), [](MoeConfig& c) { c.expert_bias = false; }), 100},
      {"GroupSoftmax", With(Softmax(16, 4), Groups(4, 2)), 130},
      {"GroupSoftmaxPost", With(With(Softmax(16, 4), Post), Groups(8, 3)), 100},
      {"GroupSigmoidOneMember", With(Sigmoid(24, 5), Groups(6, 3)), 120},
      {"DeepSeekV3", DeepSeekV3(), 96},
      {"DeepSeekV3SeqAux", With(DeepSeekV3(), SeqAux), 96, 32},
      {"SwitchSoftmax", With(Softmax(8, 2), SwitchAux), 256},
      {"SwitchSoftmaxPost", With(With(Softmax(8, 2), Post), SwitchAux), 100},
      {"SwitchSigmoid", With(Sigmoid(16, 4), SwitchAux), 200},
      {"SequenceSoftmax", With(Softmax(8, 2), SeqAux), 96, 24},
      {"SequenceSoftmaxPost", With(With(Softmax(8, 3), Post), SeqAux), 60, 5},
      {"SequenceSigmoid", With(Sigmoid(16, 4), SeqAux), 120, 8},
      {"SequenceOneTokenEach", With(Softmax(8, 2), SeqAux), 20, 1},
      {"SequenceZeroMeansAll", With(Softmax(8, 2), SeqAux), 50, 0},
      {"ZLossSoftmax", With(Softmax(8, 2), ZLossTerm), 100},
      {"ZLossSoftmaxPost", With(With(Softmax(8, 2), Post), ZLossTerm), 100},
      {"ZLossSigmoid", With(Sigmoid(16, 2), ZLossTerm), 100},
      {"AllLosses", With(With(With(DeepSeekV3(), SwitchAux), ZLossTerm), Rho(1.0f)), 70},
      {"OneToken", With(Sigmoid(64, 6), ZLossTerm), 1},
      {"OneTokenSoftmax", With(Softmax(8, 2), SwitchAux), 1},
      // k = E: every n_e = T, so the switch loss is the constant α (its gradient is 0).
      {"KEqualsE", With(With(Softmax(6, 6), SwitchAux), ZLossTerm), 50},
      {"KEqualsENoNorm", With(Softmax(6, 6), NoNorm), 50},
      {"KEqualsESigmoid", Sigmoid(5, 5), 40},
      {"KEqualsEPost", With(Softmax(4, 4), Post), 40},
      {"OneExpert", With(With(Softmax(1, 1), SwitchAux), ZLossTerm), 20},
      {"OneExpertSigmoid", With(Sigmoid(1, 1), NoNorm), 20},
      {"RaggedSixtyFive", With(Sigmoid(16, 2), SwitchAux), 65},
  };
}

class RouterReferenceTest : public testing::TestWithParam<Case> {};

// Forward outputs against the reference; returns the reference.
Reference CheckForward(const Problem& p, const RouterOutput& out) {
  const int64_t T = p.tokens, E = p.config.num_experts, k = p.config.top_k;
  const Reference ref = RefForward(p, ToDouble(p.logits));
  EXPECT_EQ(out.scores.dim(0), T);
  EXPECT_EQ(out.scores.dim(1), E);
  EXPECT_EQ(out.topk_experts.dim(1), k);
  EXPECT_LT(RelErr(Contents<float>(out.scores), ref.scores), 1e-6);
  const std::vector<int32_t> experts = Contents<int32_t>(out.topk_experts);
  int mismatches = 0;
  for (int64_t i = 0; i < T * k; ++i) {
    if (experts[i] != ref.experts[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "token " << i / k << " slot " << i % k << ": engine chose " << experts[i]
                    << ", reference " << ref.experts[i];
    }
  }
  if (mismatches == 0) {
    EXPECT_LT(RelErr(Contents<float>(out.topk_weights), ref.weights), 1e-6);
    EXPECT_EQ(Counts(out), ref.counts);
    EXPECT_LT(ScalarRelErr(AuxLoss(out), ref.aux_loss), 1e-5)
        << AuxLoss(out) << " vs " << ref.aux_loss;
    EXPECT_LT(ScalarRelErr(ZLoss(out), ref.z_loss), 1e-5) << ZLoss(out) << " vs " << ref.z_loss;
  }
  const std::vector<int64_t> counts = Counts(out);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), T * k);
  if (p.config.aux_loss == AuxLossType::kNone) {
    EXPECT_EQ(AuxLoss(out), 0.0f);
  }
  if (p.config.z_loss_coeff == 0.0f) {
    EXPECT_EQ(ZLoss(out), 0.0f);
  }
  return ref;
}

TEST_P(RouterReferenceTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  Problem p = MakeProblem(c.config, c.tokens, c.tokens_per_sequence, 1234);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok()) << RunEngine(p, &engine);
  const Reference ref = CheckForward(p, engine.out);
  if (HasFailure()) return;

  // Best-first order, distinct experts, and (group-limited) at most group_top_k groups.
  const int64_t k = p.config.top_k;
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::set<int> distinct, groups;
    for (int64_t j = 0; j < k; ++j) {
      const int e = engine.out.topk_experts.data<int32_t>()[t * k + j];
      distinct.insert(e);
      groups.insert(e / p.config.experts_per_group());
    }
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), k);
    EXPECT_LE(static_cast<int64_t>(groups.size()), p.config.group_top_k);
  }

  EXPECT_LT(RelErr(engine.d_logits, RefGradient(p)), 1e-5);

  // The losses alone: with d_weights = 0 only aux and z-loss reach the logits.
  if (p.config.aux_loss != AuxLossType::kNone || p.config.z_loss_coeff != 0.0f) {
    std::fill(p.d_weights.begin(), p.d_weights.end(), 0.0f);
    ASSERT_TRUE(RunEngine(p, &engine).ok());
    const std::vector<double> ref_grad = RefGradient(p);
    EXPECT_LT(RelErr(engine.d_logits, ref_grad), 1e-5);
    if (p.config.num_experts > 1) {
      EXPECT_GT(Norm(ref_grad), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RouterReferenceTest, testing::ValuesIn(ReferenceCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Finite differences of the reference loss, at tiny sizes, for every variant.
// ---------------------------------------------------------------------------------------------

std::vector<Case> FiniteDifferenceCases() {
  auto losses = [](AuxLossType aux) {
    return [aux](MoeConfig& c) {
      c.aux_loss = aux;
      c.aux_loss_coeff = 0.5f;
      c.z_loss_coeff = 0.1f;
    };
  };
  auto no_norm = [](MoeConfig& c) { c.normalize_topk_weights = false; };
  auto post = [](MoeConfig& c) { c.softmax_before_topk = false; };
  auto rho = [](MoeConfig& c) { c.routed_scaling_factor = 2.5f; };
  auto groups = [](MoeConfig& c) {
    c.num_groups = 4;
    c.group_top_k = 2;
  };
  return {
      {"SoftmaxPreNorm", Softmax(6, 2), 4},
      {"SoftmaxPreNoNormRho", With(With(Softmax(6, 2), no_norm), rho), 4},
      {"SoftmaxPost", With(With(Softmax(5, 3), post), rho), 3},
      {"SigmoidNorm", With(Sigmoid(8, 3), rho), 4},
      {"SigmoidNoNorm", With(Sigmoid(6, 2), no_norm), 5},
      {"GroupSigmoid", With(Sigmoid(8, 4), groups), 4},
      {"GroupSoftmax", With(Softmax(8, 2), groups), 4},
      {"SwitchZSoftmax", With(Softmax(6, 2), losses(AuxLossType::kSwitch)), 4},
      {"SwitchZSoftmaxPost", With(With(Softmax(6, 2), post), losses(AuxLossType::kSwitch)), 4},
      {"SwitchZSigmoid", With(Sigmoid(6, 2), losses(AuxLossType::kSwitch)), 5},
      {"SequenceZSoftmax", With(Softmax(4, 2), losses(AuxLossType::kSequence)), 4, 2},
      {"SequenceZSigmoidNoNorm", With(With(Sigmoid(6, 3), no_norm), losses(AuxLossType::kSequence)),
       6, 3},
      {"AllGroupSigmoid",
       With(With(With(Sigmoid(8, 4), groups), rho), losses(AuxLossType::kSequence)), 4, 2},
      {"KEqualsE", With(Softmax(4, 4), losses(AuxLossType::kSwitch)), 3},
  };
}

class RouterFiniteDifferenceTest : public testing::TestWithParam<Case> {};

// Central differences of RefLoss at p.logits; false if some perturbation changes the top-k.
bool FiniteDifferenceGradient(const Problem& p, std::vector<double>* fd) {
  constexpr double kStep = 1e-6;
  const std::vector<double> z = ToDouble(p.logits);
  const std::vector<int> selection = RefForward(p, z).experts;
  fd->resize(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    std::vector<double> plus = z, minus = z;
    plus[i] += kStep;
    minus[i] -= kStep;
    if (RefForward(p, plus).experts != selection || RefForward(p, minus).experts != selection) {
      return false;
    }
    (*fd)[i] = (RefLoss(p, plus) - RefLoss(p, minus)) / (2 * kStep);
  }
  return true;
}

// The reference's analytic gradient within 1e-6 of the central differences (both in double),
// the engine's f32 gradient within 1e-5 (it is near 1e-7 in practice; 1e-3 would be enough).
void CheckAgainstFiniteDifferences(Problem& p, const std::vector<double>& fd) {
  EXPECT_LT(RelErr(RefGradient(p), fd), 1e-6);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_LT(RelErr(engine.d_logits, fd), 1e-5);
}

TEST_P(RouterFiniteDifferenceTest, GradientsMatchCentralDifferences) {
  const Case& c = GetParam();
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    Problem p = MakeProblem(c.config, c.tokens, c.tokens_per_sequence, seed);
    std::vector<double> fd;
    if (!FiniteDifferenceGradient(p, &fd)) continue;  // near a top-k boundary: another draw
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    CheckAgainstFiniteDifferences(p, fd);
    // The losses alone (d_weights do not move the selection, so it stays stable).
    if (c.config.aux_loss != AuxLossType::kNone || c.config.z_loss_coeff != 0.0f) {
      std::fill(p.d_weights.begin(), p.d_weights.end(), 0.0f);
      ASSERT_TRUE(FiniteDifferenceGradient(p, &fd));
      CheckAgainstFiniteDifferences(p, fd);
    }
    return;
  }
  FAIL() << "no draw had a selection stable under perturbation";
}

INSTANTIATE_TEST_SUITE_P(Variants, RouterFiniteDifferenceTest,
                         testing::ValuesIn(FiniteDifferenceCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Edges.
// ---------------------------------------------------------------------------------------------

TEST(RouterTest, ExpertThatNoTokenChooses) {
  MoeConfig config = With(Softmax(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.1f;
  });
  Problem p = MakeProblem(config, 100, 0, 7);
  for (int64_t t = 0; t < p.tokens; ++t) p.logits[t * 8 + 5] = -8.0f;
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_EQ(Counts(engine.out)[5], 0);
  CheckForward(p, engine.out);
  EXPECT_LT(RelErr(engine.d_logits, RefGradient(p)), 1e-5);
}

TEST(RouterTest, ZeroTokens) {
  MoeConfig config = With(Sigmoid(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.1f;
    c.z_loss_coeff = 0.1f;
  });
  // Non-null pointers: views of zero rows, not absent ones.
  std::vector<float> logits(1), bias(8), d_weights(1), d_logits(1);
  const RouterArgs args{TensorView(logits.data(), DType::kF32, {0, 8}),
                        TensorView(bias.data(), DType::kF32, {8}), 0};
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, args, &out).ok()) << RouterForward(config, args, &out);
  EXPECT_EQ(out.scores.dim(0), 0);
  EXPECT_EQ(out.topk_experts.dim(0), 0);
  EXPECT_EQ(Counts(out), std::vector<int64_t>(8, 0));
  EXPECT_EQ(AuxLoss(out), 0.0f);
  EXPECT_EQ(ZLoss(out), 0.0f);
  EXPECT_TRUE(RouterBackward(config, args, out, TensorView(d_weights.data(), DType::kF32, {0, 2}),
                             TensorView(d_logits.data(), DType::kF32, {0, 8}))
                  .ok());
}

TEST(RouterTest, OneExpertTakesEverything) {
  Problem p = MakeProblem(Softmax(1, 1), 10, 0, 3);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  for (int64_t t = 0; t < p.tokens; ++t) {
    EXPECT_EQ(engine.out.topk_experts.data<int32_t>()[t], 0);
    EXPECT_EQ(engine.out.topk_weights.data<float>()[t], 1.0f);
    EXPECT_EQ(engine.d_logits[t], 0.0f);  // softmax over one logit is constant
  }
}

TEST(RouterTest, BiasSelectsButDoesNotWeigh) {
  MoeConfig config = Sigmoid(8, 2);
  Problem p = MakeProblem(config, 50, 0, 11);
  p.bias.assign(8, 0.0f);
  p.bias[6] = 10.0f;  // expert 6 wins every token on selection, whatever its score
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int32_t* chosen = engine.out.topk_experts.data<int32_t>() + t * 2;
    const float* s = engine.out.scores.data<float>() + t * 8;
    ASSERT_EQ(chosen[0], 6);
    const float expected = s[6] / (s[6] + s[chosen[1]]);
    EXPECT_NEAR(engine.out.topk_weights.data<float>()[t * 2], expected, 1e-6f);
  }
}

TEST(RouterTest, TiesGoToTheLowerExpertIndex) {
  MoeConfig config = Softmax(6, 3);
  Problem p = MakeProblem(config, 2, 0, 5);
  p.logits = {1, 2, 2, 0, 2, 1,   // experts 1, 2, 4 tie at the top
              0, 0, 0, 0, 0, 0};  // all tie
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{1, 2, 4, 0, 1, 2}));

  // Tied groups too: groups {0,1} {2,3} {4,5} all score 0 → the first two groups.
  config = With(Softmax(6, 2), [](MoeConfig& c) {
    c.num_groups = 3;
    c.group_top_k = 2;
  });
  Problem q = MakeProblem(config, 1, 0, 5);
  q.logits = {0, 0, 0, 0, 0, 0};
  ASSERT_TRUE(RunEngine(q, &engine).ok());
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{0, 1}));
}

TEST(RouterTest, GroupLimitExcludesTheBestExpertOfAWeakGroup) {
  // E = 8 in 4 groups of 2, k = 4 from the best 2 groups; a group scores the sum of its
  // k / group_top_k = 2 members, i.e. both.
  MoeConfig config = With(Softmax(8, 4), [](MoeConfig& c) {
    c.num_groups = 4;
    c.group_top_k = 2;
  });
  Problem p = MakeProblem(config, 1, 0, 5);
  p.logits = {3.0f, -5.0f, 1.0f, 1.0f, 0.9f, 0.9f, -5.0f, -5.0f};
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  // Sums: group 0 = e^3 + e^-5, group 1 = 2e, group 2 = 2e^0.9: groups 0 and 1 win.
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{0, 2, 3, 1}));
  p.logits = {1.2f, -5.0f, 1.0f, 1.0f, 0.9f, 0.9f, -5.0f, -5.0f};
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  // Now group 0 (e^1.2 + e^-5) loses to group 2 (2e^0.9) although expert 0 is the best.
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{2, 3, 4, 5}));
}

TEST(RouterTest, LargeLogitsStayFinite) {
  for (MoeConfig config : {Softmax(8, 2), Sigmoid(8, 2), With(Softmax(8, 2), [](MoeConfig& c) {
                             c.softmax_before_topk = false;
                           })}) {
    config.z_loss_coeff = 1e-4f;
    config.aux_loss = AuxLossType::kSwitch;
    config.aux_loss_coeff = 0.01f;
    Problem p = MakeProblem(config, 4, 0, 9);
    for (float& z : p.logits) z *= 300.0f;
    EngineResult engine;
    ASSERT_TRUE(RunEngine(p, &engine).ok());
    for (float v : Contents<float>(engine.out.scores)) ASSERT_TRUE(std::isfinite(v));
    for (float v : Contents<float>(engine.out.topk_weights)) ASSERT_TRUE(std::isfinite(v));
    for (float v : engine.d_logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(std::isfinite(ZLoss(engine.out)));
    EXPECT_TRUE(std::isfinite(AuxLoss(engine.out)));
  }
}

TEST(RouterTest, StridedViewsGiveTheSameResults) {
  MoeConfig config = With(DeepSeekV3(), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 1e-3f;
  });
  Problem p = MakeProblem(config, 70, 0, 21);
  EngineResult dense;
  ASSERT_TRUE(RunEngine(p, &dense).ok());

  const int64_t T = p.tokens, E = 256, k = 8, pad = 3;
  std::vector<float> logits((E + pad) * T), d_weights(2 * k * T), d_logits((E + pad) * T, 7.0f);
  std::vector<float> bias(2 * E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) logits[t * (E + pad) + e] = p.logits[t * E + e];
    for (int64_t j = 0; j < k; ++j) d_weights[(t * k + j) * 2] = p.d_weights[t * k + j];
  }
  for (int64_t e = 0; e < E; ++e) bias[2 * e] = p.bias[e];
  const RouterArgs args{TensorView(logits.data(), DType::kF32, {T, E}, {E + pad, 1}),
                        TensorView(bias.data(), DType::kF32, {E}, {2}), 0};
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, args, &out).ok());
  ASSERT_TRUE(RouterBackward(config, args, out,
                             TensorView(d_weights.data(), DType::kF32, {T, k}, {2 * k, 2}),
                             TensorView(d_logits.data(), DType::kF32, {T, E}, {E + pad, 1}))
                  .ok());
  EXPECT_EQ(Contents<int32_t>(out.topk_experts), Contents<int32_t>(dense.out.topk_experts));
  EXPECT_EQ(Contents<float>(out.topk_weights), Contents<float>(dense.out.topk_weights));
  EXPECT_EQ(AuxLoss(out), AuxLoss(dense.out));
  EXPECT_EQ(ZLoss(out), ZLoss(dense.out));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      ASSERT_EQ(d_logits[t * (E + pad) + e], dense.d_logits[t * E + e]);
    }
    for (int64_t e = E; e < E + pad; ++e) ASSERT_EQ(d_logits[t * (E + pad) + e], 7.0f);
  }
}

TEST(RouterTest, OutputTensorsAreReallocatedWhenShapesChange) {
  MoeConfig config = Softmax(8, 2);
  RouterOutput out;
  for (int64_t tokens : {10, 10, 300, 3}) {
    Problem p = MakeProblem(config, tokens, 0, tokens);
    ASSERT_TRUE(RouterForward(config, ArgsOf(p), &out).ok());
    CheckForward(p, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism.
// ---------------------------------------------------------------------------------------------

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data<char>(), b.data<char>(), a.numel() * DTypeSize(a.dtype())) == 0;
}

TEST(RouterTest, SameInputTwiceIsBitIdentical) {
  MoeConfig config = With(DeepSeekV3(), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 1e-2f;
    c.z_loss_coeff = 1e-3f;
  });
  Problem p = MakeProblem(config, 1000, 250, 99);
  EngineResult first, second;
  ASSERT_TRUE(RunEngine(p, &first).ok());
  ASSERT_TRUE(RunEngine(p, &second).ok());
  EXPECT_TRUE(SameBits(first.out.scores, second.out.scores));
  EXPECT_TRUE(SameBits(first.out.topk_experts, second.out.topk_experts));
  EXPECT_TRUE(SameBits(first.out.topk_weights, second.out.topk_weights));
  EXPECT_EQ(Counts(first.out), Counts(second.out));
  EXPECT_TRUE(SameBits(first.out.losses, second.out.losses));
  EXPECT_EQ(std::memcmp(first.d_logits.data(), second.d_logits.data(),
                        first.d_logits.size() * sizeof(float)),
            0);
}

// Per-token outputs do not depend on which other tokens share the call (and so on how a call's
// tokens are split among threads): one call of T tokens equals T calls of one token, bit for bit.
TEST(RouterTest, OneCallEqualsOneCallPerToken) {
  for (const MoeConfig& config :
       {DeepSeekV3(), With(Softmax(16, 4), [](MoeConfig& c) { c.softmax_before_topk = false; })}) {
    const int64_t T = 333, E = config.num_experts, k = config.top_k;
    Problem p = MakeProblem(config, T, 0, 42);
    EngineResult batched;
    ASSERT_TRUE(RunEngine(p, &batched).ok());
    for (int64_t t = 0; t < T; ++t) {
      Problem one = p;
      one.tokens = 1;
      one.logits.assign(p.logits.begin() + t * E, p.logits.begin() + (t + 1) * E);
      one.d_weights.assign(p.d_weights.begin() + t * k, p.d_weights.begin() + (t + 1) * k);
      EngineResult single;
      ASSERT_TRUE(RunEngine(one, &single).ok());
      ASSERT_EQ(std::memcmp(single.out.scores.data<float>(),
                            batched.out.scores.data<float>() + t * E, E * sizeof(float)),
                0);
      ASSERT_EQ(std::memcmp(single.out.topk_experts.data<int32_t>(),
                            batched.out.topk_experts.data<int32_t>() + t * k, k * sizeof(int32_t)),
                0);
      ASSERT_EQ(std::memcmp(single.out.topk_weights.data<float>(),
                            batched.out.topk_weights.data<float>() + t * k, k * sizeof(float)),
                0);
      ASSERT_EQ(
          std::memcmp(single.d_logits.data(), batched.d_logits.data() + t * E, E * sizeof(float)),
          0);
    }
  }
}

}  // namespace
}  // namespace moetrain::router_test
