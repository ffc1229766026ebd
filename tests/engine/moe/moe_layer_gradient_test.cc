// The float64 reference of the MoE layer (moe_reference.h): its hand-written backward against
// central differences of its forward, for each router variant, at tiny sizes. moe_layer_test.cc
// then holds the engine to this reference, so a wrong reference gradient would go unnoticed there.
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "engine/moe/moe_config.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/moe_reference.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

struct FdCase {
  std::string name;
  MoeConfig config;
  int64_t tokens = 4;
  int64_t tokens_per_sequence = 0;
  uint32_t seed = 1;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradientTest : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceGradientTest, BackwardMatchesCentralDifferences) {
  const FdCase& c = GetParam();
  const MoeConfig& config = c.config;
  const int64_t T = c.tokens, D = 5, E = config.num_experts, F = config.expert_ffn_dim;
  const int64_t SF = config.num_shared_experts * F;
  std::mt19937 rng(c.seed);
  auto normal = [&](size_t n, double stddev) { return ToDoubles(Normal(rng, n, stddev)); };
  reference::Weights w;
  w.num_experts = E;
  w.hidden = D;
  w.ffn = F;
  w.shared_ffn = SF;
  std::vector<double> x = normal(T * D, 1.0);
  w.router = normal(E * D, 1.0 / std::sqrt(D));
  if (config.expert_bias) w.expert_bias = normal(E, 0.2);
  w.expert_gate_up = normal(E * 2 * F * D, 1.0 / std::sqrt(D));
  w.expert_down = normal(E * D * F, 1.0 / std::sqrt(F));
  w.shared_gate_up = normal(2 * SF * D, 1.0 / std::sqrt(D));
  w.shared_down = normal(D * SF, SF > 0 ? 1.0 / std::sqrt(SF) : 1.0);
  const std::vector<double> d_out = normal(T * D, 1.0);

  const reference::ForwardResult base = reference::Forward(config, w, x, T, c.tokens_per_sequence);
  const reference::Grads grads =
      reference::Backward(config, w, x, T, c.tokens_per_sequence, base, d_out);
  if (config.aux_loss != AuxLossType::kNone) {
    EXPECT_GT(base.routing.aux_loss, 0.0);
  }
  if (config.z_loss_coeff > 0.0f) {
    EXPECT_GT(base.routing.z_loss, 0.0);
  }
  if (config.capacity_factor > 0.0f) {
    EXPECT_GT(base.routing.dropped, 0);
  }

  constexpr double kStep = 1e-5;
  int64_t checked = 0, skipped = 0;
  auto check = [&](const char* name, std::vector<double>& values,
                   const std::vector<double>& analytic) {
    ASSERT_EQ(values.size(), analytic.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      const double saved = values[i];
      double loss[2];
      bool same_routing = true;
      for (int side = 0; side < 2; ++side) {
        values[i] = saved + (side == 0 ? kStep : -kStep);
        const reference::ForwardResult f =
            reference::Forward(config, w, x, T, c.tokens_per_sequence);
        same_routing = same_routing && f.routing.experts == base.routing.experts &&
                       f.routing.kept == base.routing.kept;
        loss[side] = reference::Loss(f, d_out);
      }
      values[i] = saved;
      if (!same_routing) {
        ++skipped;
        continue;
      }
      ++checked;
      const double numeric = (loss[0] - loss[1]) / (2.0 * kStep);
      EXPECT_NEAR(analytic[i], numeric, 1e-7 + 1e-6 * std::abs(numeric)) << name << "[" << i << "]";
    }
  };
  check("x", x, grads.x);
  check("router", w.router, grads.router);
  check("expert_gate_up", w.expert_gate_up, grads.expert_gate_up);
  check("expert_down", w.expert_down, grads.expert_down);
  check("shared_gate_up", w.shared_gate_up, grads.shared_gate_up);
  check("shared_down", w.shared_down, grads.shared_down);
  EXPECT_LT(skipped, checked / 20) << "too many perturbations change the routing";
}

std::vector<FdCase> FdCases() {
  using enum ScoreFunction;
  using enum AuxLossType;
  return {
      {.name = "SoftmaxNormalizedSwitchZShared",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .num_shared_experts = 1,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f}},
      {.name = "SoftmaxUnnormalizedSequenceZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .normalize_topk_weights = false,
                  .routed_scaling_factor = 1.5f,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .tokens_per_sequence = 2,
       .seed = 2},
      {.name = "SoftmaxAfterTopkSwitchZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .softmax_before_topk = false,
                  .routed_scaling_factor = 1.5f,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .seed = 3},
      {.name = "SigmoidBiasNormalizedSequenceZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .expert_bias = true,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .tokens_per_sequence = 2,
       .seed = 4},
      {.name = "SigmoidUnnormalizedSwitch",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .normalize_topk_weights = false,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f},
       .seed = 5},
      {.name = "GroupLimitedSigmoidBiasSwitchZ",
       .config = {.num_experts = 8,
                  .top_k = 4,
                  .expert_ffn_dim = 3,
                  .num_shared_experts = 1,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .expert_bias = true,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .seed = 6},
      {.name = "GroupLimitedSoftmax",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f},
       .seed = 7},
      {.name = "CapacityByProbabilitySwitchZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f,
                  .capacity_factor = 0.5f,
                  .drop_policy = DropPolicy::kProbability},
       .seed = 8},
      {.name = "CapacityByPositionSigmoid",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .capacity_factor = 0.5f,
                  .drop_policy = DropPolicy::kPosition},
       .seed = 9},
  };
}

INSTANTIATE_TEST_SUITE_P(RouterVariants, ReferenceGradientTest, ::testing::ValuesIn(FdCases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace moetrain::moe_test
