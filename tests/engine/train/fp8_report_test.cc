// FillFp8Report: the per-layer and per-expert aggregation of an Fp8State's last-step statistics,
// over a hand-built state (two layers, one with routed experts) whose slots the test sets.
#include "engine/train/fp8_report.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

constexpr int kInput = static_cast<int>(Fp8Role::kInput);
constexpr int kWeight = static_cast<int>(Fp8Role::kWeight);
constexpr int kGrad = static_cast<int>(Fp8Role::kGrad);

TEST(Fp8LayerOfLinearTest, ReadsTheLayerOfModelLayersNames) {
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.0.self_attn.q_proj"), 0);
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.17.mlp.experts.gate_up_proj"), 17);
  EXPECT_EQ(Fp8LayerOfLinear("mlp.experts.gate_up_proj"), std::nullopt);  // the bench's layer
  EXPECT_EQ(Fp8LayerOfLinear("model.layers..q_proj"), std::nullopt);
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.x.q_proj"), std::nullopt);
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.-1.q_proj"), std::nullopt);
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.2x.q_proj"), std::nullopt);
  EXPECT_EQ(Fp8LayerOfLinear("model.layers.3"), std::nullopt);
  EXPECT_EQ(Fp8LayerOfLinear("lm_head"), std::nullopt);
}

Fp8State::SlotStats Stats(std::array<float, 3> amax, std::array<float, 3> scale,
                          std::array<int64_t, 3> saturated) {
  Fp8State::SlotStats stats;
  stats.amax = amax;
  stats.scale = scale;
  stats.saturated = saturated;
  return stats;
}

TEST(AggregateFp8StatsTest, MaxAmaxMinMaxScaleAndSummedSaturationsPerLayerAndExpert) {
  const std::vector<Fp8State::LinearInfo> linears = {
      {"model.layers.0.self_attn.q_proj", 1},
      {"model.layers.0.mlp.gate_up_proj", 1},
      {"model.layers.1.self_attn.q_proj", 1},
      {"model.layers.1.mlp.experts.gate_up_proj", 3},
      {"model.layers.1.mlp.experts.down_proj", 3},
      {"model.layers.1.mlp.shared_experts.down_proj", 1},
      {"lm_head", 1},  // not in a layer: left out
  };
  const std::vector<std::vector<Fp8State::SlotStats>> stats = {
      {Stats({1, 2, 3}, {10, 20, 30}, {0, 1, 2})},
      {Stats({4, 0.5f, 1}, {5, 40, 60}, {3, 0, 0})},
      {Stats({1, 1, 1}, {7, 7, 7}, {0, 0, 0})},
      // Expert 1 has a NaN input amax; expert 2 had no tokens (zero amaxes), so its scales
      // were not used this step and are left out.
      {Stats({2, 3, 4}, {8, 9, 10}, {1, 0, 0}),
       Stats({std::numeric_limits<float>::quiet_NaN(), 1, 1}, {6, 6, 6}, {0, 0, 5}),
       Stats({0, 2, 0}, {9, 9, 9}, {0, 0, 0})},
      {Stats({5, 1, 2}, {3, 4, 5}, {2, 2, 2}), Stats({1, 8, 1}, {2, 2, 2}, {0, 1, 0}),
       Stats({0, 1, 0}, {1, 1, 1}, {0, 0, 0})},
      {Stats({0.25f, 0.25f, 0.25f}, {100, 100, 100}, {0, 0, 7})},
      {Stats({1000, 1000, 1000}, {0.001f, 0.001f, 0.001f}, {99, 99, 99})},
  };
  std::vector<Fp8LayerStats> layers;
  std::vector<Fp8ExpertStats> experts;
  AggregateFp8Stats(linears, stats, &layers, &experts);

  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0].layer, 0);
  EXPECT_EQ(layers[0].roles[kInput].amax, 4);
  EXPECT_EQ(layers[0].roles[kWeight].amax, 2);
  EXPECT_EQ(layers[0].roles[kGrad].amax, 3);
  EXPECT_EQ(layers[0].roles[kInput].scale_min, 5);
  EXPECT_EQ(layers[0].roles[kInput].scale_max, 10);
  EXPECT_EQ(layers[0].roles[kWeight].scale_min, 20);
  EXPECT_EQ(layers[0].roles[kWeight].scale_max, 40);
  EXPECT_EQ(layers[0].roles[kInput].saturated, 3);
  EXPECT_EQ(layers[0].roles[kWeight].saturated, 1);
  EXPECT_EQ(layers[0].roles[kGrad].saturated, 2);

  EXPECT_EQ(layers[1].layer, 1);
  EXPECT_TRUE(std::isnan(layers[1].roles[kInput].amax)) << "a NaN anywhere shows";
  EXPECT_EQ(layers[1].roles[kWeight].amax, 8);
  EXPECT_EQ(layers[1].roles[kGrad].amax, 4);
  EXPECT_EQ(layers[1].roles[kInput].scale_min, 2);
  EXPECT_EQ(layers[1].roles[kInput].scale_max, 100);
  EXPECT_EQ(layers[1].roles[kGrad].scale_min, 2);
  EXPECT_EQ(layers[1].roles[kGrad].scale_max, 100);
  EXPECT_EQ(layers[1].roles[kInput].saturated, 3);
  EXPECT_EQ(layers[1].roles[kWeight].saturated, 3);
  EXPECT_EQ(layers[1].roles[kGrad].saturated, 14);

  // Experts: the groups of the linears with groups > 1, gate_up and down together.
  ASSERT_EQ(experts.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(experts[e].layer, 1);
    EXPECT_EQ(experts[e].expert, e);
  }
  EXPECT_EQ(experts[0].roles[kInput].amax, 5);
  EXPECT_EQ(experts[0].roles[kWeight].amax, 3);
  EXPECT_EQ(experts[0].roles[kInput].scale_min, 3);
  EXPECT_EQ(experts[0].roles[kInput].scale_max, 8);
  EXPECT_EQ(experts[0].roles[kInput].saturated, 3);
  EXPECT_EQ(experts[0].roles[kGrad].saturated, 2);
  EXPECT_TRUE(std::isnan(experts[1].roles[kInput].amax));
  EXPECT_EQ(experts[1].roles[kWeight].amax, 8);
  EXPECT_EQ(experts[1].roles[kGrad].saturated, 5);
  EXPECT_EQ(experts[2].roles[kInput].amax, 0);
  EXPECT_EQ(experts[2].roles[kWeight].amax, 2);
  EXPECT_EQ(experts[2].roles[kInput].scale_min, 0);
  EXPECT_EQ(experts[2].roles[kInput].scale_max, 0);
  EXPECT_EQ(experts[2].roles[kWeight].scale_min, 1);  // its weights were quantised
}

TEST(AggregateFp8StatsTest, BlockScalingsReportNoScale) {
  const std::vector<Fp8State::LinearInfo> linears = {{"model.layers.2.self_attn.o_proj", 1},
                                                     {"model.layers.2.mlp.down_proj", 1}};
  const std::vector<std::vector<Fp8State::SlotStats>> stats = {
      {Stats({1, 2, 3}, {0, 0, 0}, {0, 0, 0})}, {Stats({3, 2, 1}, {0, 0, 0}, {1, 1, 1})}};
  std::vector<Fp8LayerStats> layers;
  std::vector<Fp8ExpertStats> experts = {{}};  // cleared
  AggregateFp8Stats(linears, stats, &layers, &experts);
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].layer, 2);
  const float amax[] = {3, 2, 3};
  for (int role = 0; role < kNumFp8Roles; ++role) {
    EXPECT_EQ(layers[0].roles[role].amax, amax[role]);
    EXPECT_EQ(layers[0].roles[role].scale_min, 0);
    EXPECT_EQ(layers[0].roles[role].scale_max, 0);
    EXPECT_EQ(layers[0].roles[role].saturated, 1);
  }
  EXPECT_TRUE(experts.empty());
}

TEST(AggregateFp8StatsTest, NoStatisticsYetReportsNothing) {
  const std::vector<Fp8State::LinearInfo> linears = {{"model.layers.0.self_attn.q_proj", 1},
                                                     {"model.layers.1.mlp.experts.down_proj", 4}};
  const std::vector<std::vector<Fp8State::SlotStats>> stats = {{}, {}};
  std::vector<Fp8LayerStats> layers;
  std::vector<Fp8ExpertStats> experts;
  AggregateFp8Stats(linears, stats, &layers, &experts);
  EXPECT_TRUE(layers.empty());
  EXPECT_TRUE(experts.empty());
}

// Sets one slot's step amax and saturated count as a quantisation would.
void SetSlot(const Fp8State& state, int linear, int64_t group, Fp8Role role, float amax,
             int64_t saturated) {
  const Fp8State::Slot slot = state.slot(linear, group, role);
  ASSERT_FALSE(slot.amax.empty());
  ASSERT_TRUE(
      ops::CopyTensor(state.context(), TensorView(&amax, DType::kF32, {1}), slot.amax).ok());
  ASSERT_TRUE(
      ops::CopyTensor(state.context(), TensorView(&saturated, DType::kI64, {1}), slot.saturated)
          .ok());
}

// Through a real Fp8State under delayed scaling: the first step quantises with scale 1, the
// second with fp8_max / (the first step's amax).
TEST(FillFp8ReportTest, ReportsTheLastEndStepOfAState) {
  Fp8RecipeConfig config;
  config.recipe = Fp8RecipeKind::kDelayed;
  config.amax_history_len = 4;
  Fp8State state(config, ExecContext::Cpu());
  const int q0 = state.Register("model.layers.0.self_attn.q_proj", 1);
  const int q1 = state.Register("model.layers.1.self_attn.q_proj", 1);
  const int experts = state.Register("model.layers.1.mlp.experts.gate_up_proj", 2);
  ASSERT_TRUE(state.Allocate().ok());

  StepReport report;
  ASSERT_TRUE(state.EndStep(nullptr).ok());
  FillFp8Report(state, &report);
  ASSERT_EQ(report.fp8_layers.size(), 2u);
  ASSERT_EQ(report.fp8_experts.size(), 2u);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].amax, 0);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].scale_min, 0);  // nothing was quantised

  SetSlot(state, q0, 0, Fp8Role::kInput, 2.0f, 0);
  SetSlot(state, q1, 0, Fp8Role::kInput, 4.0f, 1);
  SetSlot(state, experts, 0, Fp8Role::kInput, 8.0f, 2);
  SetSlot(state, experts, 1, Fp8Role::kInput, 7.0f, 3);
  SetSlot(state, experts, 1, Fp8Role::kGrad, 1024.0f, 5);
  ASSERT_TRUE(state.EndStep(nullptr).ok());
  FillFp8Report(state, &report);
  ASSERT_EQ(report.fp8_layers.size(), 2u);
  EXPECT_EQ(report.fp8_layers[0].layer, 0);
  EXPECT_EQ(report.fp8_layers[0].roles[kInput].amax, 2);
  EXPECT_EQ(report.fp8_layers[0].roles[kInput].scale_max, 1);  // this step quantised with 1
  EXPECT_EQ(report.fp8_layers[1].layer, 1);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].amax, 8);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].saturated, 6);
  EXPECT_EQ(report.fp8_layers[1].roles[kGrad].amax, 1024);
  EXPECT_EQ(report.fp8_layers[1].roles[kGrad].saturated, 5);
  ASSERT_EQ(report.fp8_experts.size(), 2u);
  EXPECT_EQ(report.fp8_experts[1].expert, 1);
  EXPECT_EQ(report.fp8_experts[1].roles[kInput].amax, 7);
  EXPECT_EQ(report.fp8_experts[1].roles[kInput].saturated, 3);

  // The next step quantised with the scales those amaxes gave: E4M3 448 / amax for inputs, E5M2
  // 57344 / amax for gradients (HYBRID). Expert 1's input quantised nothing this time: its scale
  // is not reported.
  SetSlot(state, q0, 0, Fp8Role::kInput, 1.0f, 0);
  SetSlot(state, q1, 0, Fp8Role::kInput, 1.0f, 0);
  SetSlot(state, experts, 0, Fp8Role::kInput, 1.0f, 0);
  SetSlot(state, experts, 1, Fp8Role::kGrad, 1.0f, 0);
  ASSERT_TRUE(state.EndStep(nullptr).ok());
  FillFp8Report(state, &report);
  EXPECT_EQ(report.fp8_layers[0].roles[kInput].scale_min, 448.0f / 2.0f);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].scale_min, 448.0f / 8.0f);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].scale_max, 448.0f / 4.0f);
  EXPECT_EQ(report.fp8_layers[1].roles[kGrad].scale_min, 57344.0f / 1024.0f);
  EXPECT_EQ(report.fp8_layers[1].roles[kGrad].scale_max, 57344.0f / 1024.0f);
  EXPECT_EQ(report.fp8_layers[1].roles[kInput].amax, 1);
  EXPECT_EQ(report.fp8_experts[0].roles[kInput].scale_min, 448.0f / 8.0f);
}

}  // namespace
}  // namespace moetrain
