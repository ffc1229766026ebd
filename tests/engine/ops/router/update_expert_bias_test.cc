// UpdateExpertBias: the sign rule, its invalid arguments, and that repeated updates balance a
// skewed load through the router.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/router/router_test_util.h"

namespace moetrain::router_test {
namespace {

TEST(UpdateExpertBiasTest, StepsBySignOfTheGapToTheMean) {
  std::vector<float> bias = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ASSERT_TRUE(
      UpdateExpertBias({1, 2, 3, 2, 2}, 0.25f, TensorView(bias.data(), DType::kF32, {5})).ok());
  EXPECT_EQ(bias, (std::vector<float>{0.75f, 0.5f, 0.25f, 0.5f, 0.5f}));
  // A mean that is not an integer: no expert sits on it.
  ASSERT_TRUE(UpdateExpertBias({0, 1}, 1.0f, TensorView(bias.data(), DType::kF32, {2})).ok());
  EXPECT_EQ(bias[0], 1.75f);
  EXPECT_EQ(bias[1], -0.5f);
  // Balanced load: nothing moves.
  ASSERT_TRUE(UpdateExpertBias({3, 3, 3}, 1.0f, TensorView(bias.data(), DType::kF32, {3})).ok());
  EXPECT_EQ(bias[0], 1.75f);
}

TEST(UpdateExpertBiasTest, InvalidArguments) {
  std::vector<float> bias(8);
  ExpectError(UpdateExpertBias({1, 2, 3, 4}, 0.1f, TensorView(bias.data(), DType::kF32, {8})),
              "bias: expected (4) f32, got (8) f32");
  ExpectError(UpdateExpertBias({1, 2}, -0.1f, TensorView(bias.data(), DType::kF32, {2})),
              "rate = -0.1 must be non-negative and finite");
  ExpectError(UpdateExpertBias({1, -2}, 0.1f, TensorView(bias.data(), DType::kF32, {2})),
              "tokens_per_expert[1] = -2 is negative");
  ExpectError(UpdateExpertBias({}, 0.1f, TensorView(bias.data(), DType::kF32, {0})),
              "tokens_per_expert is empty");
}

double MaxOverMean(const std::vector<int64_t>& counts) {
  const double mean =
      std::accumulate(counts.begin(), counts.end(), 0.0) / static_cast<double>(counts.size());
  return *std::max_element(counts.begin(), counts.end()) / mean;
}

TEST(UpdateExpertBiasTest, BalancesASkewedLoad) {
  // A fixed batch whose logits favour high-numbered experts; the bias alone must even it out.
  MoeConfig config = Sigmoid(16, 2);
  Problem p = MakeProblem(config, 2048, 0, 17);
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t e = 0; e < 16; ++e) p.logits[t * 16 + e] += 2.0f * e / 15.0f;
  }
  std::fill(p.bias.begin(), p.bias.end(), 0.0f);
  const RouterArgs args = ArgsOf(p);
  RouterOutput out;
  double first = 0.0, last = 0.0;
  constexpr int kSteps = 300;
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(RouterForward(config, args, &out).ok());
    const double ratio = MaxOverMean(Counts(out));
    if (step == 0) first = ratio;
    if (step >= kSteps - 20) last += ratio / 20;  // the bias oscillates about balance
    ASSERT_TRUE(UpdateExpertBias(Counts(out), 2e-3f, args.expert_bias).ok());
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last - 1.0, 0.25 * (first - 1.0)) << "max/mean load " << first << " -> " << last;
  std::printf("max/mean load: step 0 %.3f, last 20 steps %.3f\n", first, last);
}

}  // namespace
}  // namespace moetrain::router_test
