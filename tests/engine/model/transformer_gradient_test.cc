// The whole model's gradients against central differences of its loss, aux and z losses included.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/engine/model/transformer_test_util.h"

namespace moetrain::transformer_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Gradients against central differences

struct GradCheckStats {
  int checked = 0;
  int skipped = 0;
  double worst = 0.0;  // of |analytic − numeric| / (atol + rtol·|numeric|)
};

// The full objective, as ForwardBackward defines it (grads are touched and ignored).
double Objective(Transformer& model, const Tensor& tokens, std::vector<MoeStats>* stats) {
  absl::StatusOr<StepResult> r = model.ForwardBackward(tokens);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return NAN;
  if (stats != nullptr) *stats = r->moe_layers;
  return double{r->loss} + r->aux_loss + r->z_loss +
         double{model.config().mtp_loss_weight} * r->mtp_loss;
}

bool SameRouting(const std::vector<MoeStats>& a, const std::vector<MoeStats>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tokens_per_expert != b[i].tokens_per_expert) return false;
  }
  return true;
}

GradCheckStats CheckGradients(const ModelConfig& config, uint64_t seed) {
  Transformer model = MakeModel(config, DType::kF32, seed);
  // Give the expert bias values, so that selection differs from the scores' order.
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (NamedParameter& p : model.parameters()) {
    if (p.trainable) continue;
    std::normal_distribution<float> dist(0.0f, 0.05f);
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data<float>()[i] = dist(rng);
  }
  // Windows of S + 1 + mtp_depth tokens (S = 5).
  const Tensor tokens =
      RandomTokens(/*batch=*/2, /*seq_len=*/5 + config.mtp_depth, config.vocab_size, 99);
  EXPECT_TRUE(model.ZeroGrads().ok());
  std::vector<MoeStats> base_stats;
  Objective(model, tokens, &base_stats);
  const std::vector<float> analytic = Copy(model.grad_buffer());

  // The f32 loss (~2.4) carries noise of ~1e-7, ~1e-5 of a difference over h/2 = 1e-2.
  // Richardson extrapolation of the central differences at h and h/2 cancels their O(h²)
  // truncation error. Entries whose perturbation changes the routing (the loss is only
  // piecewise smooth) are skipped: the expert loads change, or the two differences disagree.
  constexpr double kH = 2e-2, kAtol = 5e-5, kRtol = 5e-3;
  GradCheckStats stats;
  const float* base = model.master_buffer().data<float>();
  for (NamedParameter& p : model.parameters()) {
    const int64_t n = p.value.numel();
    const int64_t offset = p.value.data<float>() - base;
    if (!p.trainable) {
      // Selection only: no gradient flows into the expert bias.
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(analytic[offset + i], 0.0f) << p.name;
      continue;
    }
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    for (int sample = 0; sample < 4; ++sample) {
      const int64_t i = pick(rng);
      float* x = p.value.data<float>() + i;
      const float original = *x;
      auto difference = [&](double h, bool* routing_changed) {
        std::vector<MoeStats> plus_stats, minus_stats;
        *x = static_cast<float>(original + h);
        const double plus = Objective(model, tokens, &plus_stats);
        *x = static_cast<float>(original - h);
        const double minus = Objective(model, tokens, &minus_stats);
        *x = original;
        *routing_changed |=
            !SameRouting(plus_stats, base_stats) || !SameRouting(minus_stats, base_stats);
        // The perturbation actually applied, after rounding to f32.
        const double applied =
            (double{static_cast<float>(original + h)} - double{static_cast<float>(original - h)});
        return (plus - minus) / applied;
      };
      bool routing_changed = false;
      const double coarse = difference(kH, &routing_changed);
      const double fine = difference(kH / 2, &routing_changed);
      const double numeric = (4.0 * fine - coarse) / 3.0;
      const double tolerance = kAtol + kRtol * std::abs(numeric);
      if (routing_changed || std::abs(coarse - fine) > 10.0 * tolerance) {
        ++stats.skipped;
        continue;
      }
      const double got = analytic[offset + i];
      ++stats.checked;
      stats.worst = std::max(stats.worst, std::abs(got - numeric) / tolerance);
      EXPECT_NEAR(got, numeric, tolerance) << p.name << "[" << i << "]";
    }
  }
  return stats;
}

TEST(TransformerGradientTest, SigmoidBiasUntiedMatchesFiniteDifferences) {
  ModelConfig c = TinyConfig();
  // Larger weights than training would start from, so that every gradient is well above the
  // finite differences' noise.
  c.init_std = 0.4f;
  const GradCheckStats stats = CheckGradients(c, 3);
  EXPECT_GE(stats.checked, 80);
  EXPECT_LE(stats.skipped, stats.checked / 3);
  std::printf("checked %d, skipped %d, worst error / tolerance %.3f\n", stats.checked,
              stats.skipped, stats.worst);
}

TEST(TransformerGradientTest, SoftmaxTiedMatchesFiniteDifferences) {
  ModelConfig c = TinySoftmaxTiedConfig();
  c.init_std = 0.4f;
  const GradCheckStats stats = CheckGradients(c, 4);
  EXPECT_GE(stats.checked, 80);
  EXPECT_LE(stats.skipped, stats.checked / 3);
  std::printf("checked %d, skipped %d, worst error / tolerance %.3f\n", stats.checked,
              stats.skipped, stats.worst);
}

TEST(TransformerGradientTest, MlaMatchesFiniteDifferences) {
  for (const int64_t q_lora_rank : {0, 5}) {
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_lora_rank);
    ModelConfig c = TinyMlaConfig(q_lora_rank);
    c.init_std = 0.4f;
    const GradCheckStats stats = CheckGradients(c, 5 + q_lora_rank);
    EXPECT_GE(stats.checked, 80);
    EXPECT_LE(stats.skipped, stats.checked / 3);
    std::printf("MLA q_lora_rank %lld: checked %d, skipped %d, worst error / tolerance %.3f\n",
                static_cast<long long>(q_lora_rank), stats.checked, stats.skipped, stats.worst);
  }
}

// Multi-token prediction: one and two modules, on MLA and on grouped-query attention, with a
// weight that makes the MTP loss count as much as the main one.
TEST(TransformerGradientTest, MultiTokenPredictionMatchesFiniteDifferences) {
  for (const int64_t depth : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "mtp_depth " << depth);
    ModelConfig c = depth == 1 ? TinyMlaConfig(5) : TinyConfig();
    c.mtp_depth = depth;
    c.mtp_loss_weight = 1.0f;
    c.init_std = 0.4f;
    const GradCheckStats stats = CheckGradients(c, 7 + depth);
    EXPECT_GE(stats.checked, 80);
    EXPECT_LE(stats.skipped, stats.checked / 3);
    std::printf("MTP depth %lld: checked %d, skipped %d, worst error / tolerance %.3f\n",
                static_cast<long long>(depth), stats.checked, stats.skipped, stats.worst);
  }
}

}  // namespace
}  // namespace moetrain::transformer_test
