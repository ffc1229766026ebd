// AdamW against a float64 reference of the same formulas, its state save/restore and
// determinism; invalid config, parameters, learning rate and state.
#include "engine/train/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/core/dtype.h"
#include "engine/core/dtype_math.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/train/optimizer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::optimizer_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

// ‖a − b‖ / ‖b‖ (or ‖a − b‖ when b is zero).
template <typename A>
double RelErr(const A& a, const std::vector<double>& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += b[i] * b[i];
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

AdamW CreateOrDie(const AdamWConfig& config, const Model& model) {
  absl::StatusOr<AdamW> optimizer = AdamW::Create(Cpu(), config, model.params);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return std::move(optimizer).value();
}

// ---------------------------------------------------------------------------------------------
// The float64 reference: the formulas of the header, literally.
// ---------------------------------------------------------------------------------------------

struct ReferenceAdamW {
  AdamWConfig config;
  std::vector<bool> weight_decay;
  std::vector<std::vector<double>> p, m, v;
  int64_t t = 0;

  ReferenceAdamW(const AdamWConfig& config, const Model& model) : config(config) {
    for (const Parameter& param : model.params) {
      weight_decay.push_back(param.weight_decay);
      const std::vector<float> value = Contents(param.value);
      p.emplace_back(value.begin(), value.end());
      m.emplace_back(value.size(), 0.0);
      v.emplace_back(value.size(), 0.0);
    }
  }

  void Step(double lr, const Model& model) {
    ++t;
    const double beta1 = config.beta1, beta2 = config.beta2;
    for (size_t i = 0; i < p.size(); ++i) {
      const std::vector<float> g = Contents(model.params[i].grad);
      for (size_t j = 0; j < p[i].size(); ++j) {
        if (weight_decay[i]) p[i][j] -= lr * config.weight_decay * p[i][j];
        m[i][j] = beta1 * m[i][j] + (1.0 - beta1) * g[j];
        v[i][j] = beta2 * v[i][j] + (1.0 - beta2) * static_cast<double>(g[j]) * g[j];
        const double m_hat = m[i][j] / (1.0 - std::pow(beta1, static_cast<double>(t)));
        const double v_hat = v[i][j] / (1.0 - std::pow(beta2, static_cast<double>(t)));
        p[i][j] -= lr * m_hat / (std::sqrt(v_hat) + config.eps);
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// AdamW.
// ---------------------------------------------------------------------------------------------

struct ReferenceCase {
  const char* name;
  AdamWConfig config;
};

class AdamWReferenceTest : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(AdamWReferenceTest, MatchesFloat64ReferenceOverSteps) {
  const AdamWConfig config = GetParam().config;
  Model model = MakeModel(MixedSpecs(), 11);
  AdamW optimizer = CreateOrDie(config, model);
  ReferenceAdamW reference(config, model);
  constexpr int kSteps = 12;
  for (int step = 0; step < kSteps; ++step) {
    FillGrads(&model, 12, step);
    const float lr = 1e-2f * (1.0f + 0.1f * static_cast<float>(step % 3));
    ASSERT_TRUE(optimizer.Step(lr).ok());
    reference.Step(lr, model);
    EXPECT_EQ(optimizer.step(), step + 1);
    for (int64_t i = 0; i < optimizer.num_params(); ++i) {
      SCOPED_TRACE(testing::Message() << "step " << step << ", " << model.params[i].name);
      EXPECT_LT(RelErr(model.values[i].data<float>(), reference.p[i]), 1e-6);
      EXPECT_LT(RelErr(optimizer.exp_avg(i).data<float>(), reference.m[i]), 1e-6);
      EXPECT_LT(RelErr(optimizer.exp_avg_sq(i).data<float>(), reference.v[i]), 1e-6);
    }
  }
}

// The moments of bf16 AdamW as floats.
std::vector<float> Bf16Contents(const TensorView& t) {
  EXPECT_EQ(t.dtype(), DType::kBF16);
  std::vector<float> out(t.numel());
  const auto* bits = static_cast<const uint16_t*>(t.raw());
  for (int64_t j = 0; j < t.numel(); ++j) out[j] = BF16BitsToFloat(bits[j]);
  return out;
}

double RoundToBf16(double x) { return BF16BitsToFloat(FloatToBF16Bits(static_cast<float>(x))); }

// BF16 moments against the float64 reference that stores its moments rounded to bf16 after each
// step (and updates the weight from the unrounded ones): the weights to float rounding, the
// moments to about one bf16 step (2^-7 relative at most: an element whose f32 and f64 values
// round to neighbouring bf16 values now and then, a one-element tensor then off by that much).
TEST(AdamWTest, Bf16MomentsMatchAFloat64ReferenceThatRoundsItsStoredMoments) {
  AdamWConfig config;
  config.moment_dtype = DType::kBF16;
  Model model = MakeModel(MixedSpecs(), 13);
  AdamW optimizer = CreateOrDie(config, model);
  ReferenceAdamW reference(config, model);
  for (int step = 0; step < 12; ++step) {
    FillGrads(&model, 14, step);
    const float lr = 1e-2f;
    ASSERT_OK(optimizer.Step(lr));
    reference.Step(lr, model);
    for (auto* moments : {&reference.m, &reference.v}) {
      for (std::vector<double>& values : *moments) {
        for (double& x : values) x = RoundToBf16(x);
      }
    }
    for (int64_t i = 0; i < optimizer.num_params(); ++i) {
      SCOPED_TRACE(testing::Message() << "step " << step << ", " << model.params[i].name);
      EXPECT_EQ(optimizer.exp_avg(i).dtype(), DType::kBF16);
      EXPECT_LT(RelErr(model.values[i].data<float>(), reference.p[i]), 1e-5);
      EXPECT_LT(RelErr(Bf16Contents(optimizer.exp_avg(i)), reference.m[i]), 1e-2);
      EXPECT_LT(RelErr(Bf16Contents(optimizer.exp_avg_sq(i)), reference.v[i]), 1e-2);
    }
  }
}

// A saved f32 state restores into bf16 moments rounded to nearest even; an invalid one is still
// refused by its f32 values.
TEST(AdamWTest, SetStateRoundsIntoBf16Moments) {
  AdamWConfig config;
  config.moment_dtype = DType::kBF16;
  Model model = MakeModel({{"w", {4}, true}}, 52);
  AdamW optimizer = CreateOrDie(config, model);
  std::vector<float> m = {1.0f + 1.0f / 256, -3.0e-5f, 0.0f, 1e30f};
  std::vector<float> v = {1.0f + 3.0f / 256, 2.5e-9f, 0.0f, 7.0f};
  const TensorView m_view(m.data(), DType::kF32, {4}), v_view(v.data(), DType::kF32, {4});
  ASSERT_OK(optimizer.SetState(3, {&m_view, 1}, {&v_view, 1}));
  const std::vector<float> got_m = Bf16Contents(optimizer.exp_avg(0));
  const std::vector<float> got_v = Bf16Contents(optimizer.exp_avg_sq(0));
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(got_m[j], BF16BitsToFloat(FloatToBF16Bits(m[j]))) << j;
    EXPECT_EQ(got_v[j], BF16BitsToFloat(FloatToBF16Bits(v[j]))) << j;
  }
  EXPECT_EQ(got_m[0], 1.0f);  // a tie, to even
  v[1] = -1.0f;
  ExpectInvalid(optimizer.SetState(3, {&m_view, 1}, {&v_view, 1}), "w.exp_avg_sq[1]");
  AdamWConfig f16;
  f16.moment_dtype = DType::kI32;
  ExpectInvalid(f16.Validate(), "train.optimizer.moment_dtype = i32 must be f32 or bf16");
}

AdamWConfig Config(float beta1, float beta2, float eps, float weight_decay) {
  AdamWConfig config;
  config.beta1 = beta1;
  config.beta2 = beta2;
  config.eps = eps;
  config.weight_decay = weight_decay;
  return config;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, AdamWReferenceTest,
    ::testing::Values(ReferenceCase{"defaults", AdamWConfig()},
                      ReferenceCase{"no_momentum", Config(0.0f, 0.999f, 1e-8f, 0.0f)},
                      ReferenceCase{"large_eps_strong_decay", Config(0.5f, 0.0f, 1e-3f, 1.0f)}),
    [](const ::testing::TestParamInfo<ReferenceCase>& info) { return info.param.name; });

// With zero grads the Adam part is exactly 0 / (0 + eps): only weight decay moves anything.
TEST(AdamWTest, ZeroGradsOnlyDecayDecayingParams) {
  Model model = MakeModel(MixedSpecs(), 21);
  const Model initial = CloneModel(model);
  AdamW optimizer = CreateOrDie(AdamWConfig(), model);
  constexpr float kLr = 0.01f;
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(optimizer.Step(kLr).ok());
  const double factor = std::pow(1.0 - kLr * AdamWConfig().weight_decay, 3);
  for (size_t i = 0; i < model.params.size(); ++i) {
    SCOPED_TRACE(model.params[i].name);
    if (model.params[i].weight_decay) {
      std::vector<double> expected;
      for (float x : Contents(initial.values[i])) expected.push_back(x * factor);
      EXPECT_LT(RelErr(model.values[i].data<float>(), expected), 1e-6);
      if (model.values[i].numel() > 0) {
        EXPECT_FALSE(BitEqual(model.values[i], initial.values[i]));
      }
    } else {
      EXPECT_TRUE(BitEqual(model.values[i], initial.values[i]));
    }
    const std::vector<double> zeros(model.values[i].numel(), 0.0);
    EXPECT_EQ(RelErr(optimizer.exp_avg(i).data<float>(), zeros), 0.0);
    EXPECT_EQ(RelErr(optimizer.exp_avg_sq(i).data<float>(), zeros), 0.0);
  }
}

// Bias correction makes m̂ = g and v̂ = g² at every step of a constant gradient, so each step
// moves every weight by lr·|g|/(|g| + eps) ≈ lr against the gradient's sign; without the
// correction step 1 would move by lr·(1 − β1)/√(1 − β2) ≈ 0.45·lr.
TEST(AdamWTest, BiasCorrectionMakesEachStepOfAConstantGradientLr) {
  Model model = MakeModel({{"w", {1000}, true}, {"b", {33}, false}}, 31);
  for (Tensor& value : model.values) std::memset(value.data<float>(), 0, value.numel() * 4);
  FillGrads(&model, 32, 0);
  for (Tensor& grad : model.grads) {
    float* g = grad.data<float>();
    for (int64_t j = 0; j < grad.numel(); ++j) g[j] = std::copysign(1e-2f + std::fabs(g[j]), g[j]);
  }
  AdamWConfig config;
  config.weight_decay = 0.0f;
  AdamW optimizer = CreateOrDie(config, model);
  constexpr float kLr = 1e-3f;
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(optimizer.Step(kLr).ok());
    for (size_t i = 0; i < model.params.size(); ++i) {
      const float* p = model.values[i].data<float>();
      const float* g = model.grads[i].data<float>();
      for (int64_t j = 0; j < model.values[i].numel(); ++j) {
        ASSERT_NEAR(p[j], -step * kLr * std::copysign(1.0f, g[j]), 1e-5 * step * kLr)
            << model.params[i].name << "[" << j << "] at step " << step << ", g = " << g[j];
      }
    }
  }
}

// Runs `steps` optimizer steps on fresh grads numbered from `first_step`.
void RunSteps(AdamW* optimizer, Model* model, int first_step, int steps) {
  for (int step = first_step; step < first_step + steps; ++step) {
    FillGrads(model, 41, step);
    ASSERT_TRUE(optimizer->Step(1e-3f * static_cast<float>(1 + step)).ok());
  }
}

void ExpectSameState(const AdamW& a, const Model& model_a, const AdamW& b, const Model& model_b) {
  ASSERT_EQ(a.step(), b.step());
  for (int64_t i = 0; i < a.num_params(); ++i) {
    SCOPED_TRACE(model_a.params[i].name);
    EXPECT_TRUE(BitEqual(model_a.values[i], model_b.values[i]));
    EXPECT_TRUE(BitEqual(a.exp_avg(i), b.exp_avg(i)));
    EXPECT_TRUE(BitEqual(a.exp_avg_sq(i), b.exp_avg_sq(i)));
  }
}

TEST(AdamWTest, RestoredStateContinuesBitIdentically) {
  Model straight_model = MakeModel(MixedSpecs(), 42);
  AdamW straight = CreateOrDie(AdamWConfig(), straight_model);
  RunSteps(&straight, &straight_model, 0, 5);

  // The "checkpoint": weights, moments and step after 5 steps, into fresh objects.
  Model restored_model = CloneModel(straight_model);
  AdamW restored = CreateOrDie(AdamWConfig(), restored_model);
  std::vector<TensorView> exp_avg, exp_avg_sq;
  for (int64_t i = 0; i < straight.num_params(); ++i) {
    exp_avg.push_back(straight.exp_avg(i));
    exp_avg_sq.push_back(straight.exp_avg_sq(i));
  }
  ASSERT_TRUE(restored.SetState(straight.step(), exp_avg, exp_avg_sq).ok());
  EXPECT_EQ(restored.step(), 5);

  // The same through the writable views and SetStep, as a loader reading in place would.
  Model in_place_model = CloneModel(straight_model);
  AdamW in_place = CreateOrDie(AdamWConfig(), in_place_model);
  for (int64_t i = 0; i < straight.num_params(); ++i) {
    std::memcpy(in_place.exp_avg(i).raw(), straight.exp_avg(i).raw(),
                straight.exp_avg(i).numel() * sizeof(float));
    std::memcpy(in_place.exp_avg_sq(i).raw(), straight.exp_avg_sq(i).raw(),
                straight.exp_avg_sq(i).numel() * sizeof(float));
  }
  ASSERT_TRUE(in_place.SetStep(5).ok());

  RunSteps(&straight, &straight_model, 5, 5);
  RunSteps(&restored, &restored_model, 5, 5);
  RunSteps(&in_place, &in_place_model, 5, 5);
  EXPECT_EQ(straight.step(), 10);
  ExpectSameState(straight, straight_model, restored, restored_model);
  ExpectSameState(straight, straight_model, in_place, in_place_model);
}

// SetState reads any strides: here m and v of a (3, 5) weight come as transposed views.
TEST(AdamWTest, SetStateReadsStridedViews) {
  Model model = MakeModel({{"w", {3, 5}, true}}, 51);
  AdamW optimizer = CreateOrDie(AdamWConfig(), model);
  std::vector<float> m_t(15), v_t(15);  // (5, 3): element (r, c) of the (3, 5) state at c·3 + r
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t c = 0; c < 5; ++c) {
      m_t[c * 3 + r] = static_cast<float>(r * 5 + c) - 7.0f;
      v_t[c * 3 + r] = static_cast<float>(r * 5 + c) * 0.25f;
    }
  }
  const TensorView m(m_t.data(), DType::kF32, {3, 5}, {1, 3});
  const TensorView v(v_t.data(), DType::kF32, {3, 5}, {1, 3});
  ASSERT_TRUE(optimizer.SetState(7, {m}, {v}).ok());
  EXPECT_EQ(optimizer.step(), 7);
  for (int64_t j = 0; j < 15; ++j) {
    EXPECT_EQ(optimizer.exp_avg(0).data<float>()[j], static_cast<float>(j) - 7.0f);
    EXPECT_EQ(optimizer.exp_avg_sq(0).data<float>()[j], static_cast<float>(j) * 0.25f);
  }
}

TEST(AdamWTest, RunsAreBitIdentical) {
  Model first_model = MakeModel(MixedSpecs(), 61);
  Model second_model = CloneModel(first_model);
  AdamW first = CreateOrDie(AdamWConfig(), first_model);
  AdamW second = CreateOrDie(AdamWConfig(), second_model);
  RunSteps(&first, &first_model, 0, 4);
  RunSteps(&second, &second_model, 0, 4);
  ExpectSameState(first, first_model, second, second_model);
}

TEST(AdamWTest, NoParametersIsFine) {
  absl::StatusOr<AdamW> optimizer = AdamW::Create(Cpu(), AdamWConfig(), {});
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  EXPECT_TRUE(optimizer->Step(1e-3f).ok());
  EXPECT_EQ(optimizer->step(), 1);
  EXPECT_EQ(optimizer->num_params(), 0);
}

TEST(AdamWTest, MovedOptimizerKeepsItsState) {
  Model model = MakeModel({{"w", {8}, true}}, 71);
  AdamW optimizer = CreateOrDie(AdamWConfig(), model);
  RunSteps(&optimizer, &model, 0, 2);
  const std::vector<float> m = Contents(optimizer.exp_avg(0));
  AdamW moved = std::move(optimizer);
  EXPECT_EQ(moved.step(), 2);
  EXPECT_EQ(Contents(moved.exp_avg(0)), m);
  EXPECT_EQ(moved.param(0).name, "w");
}

// ---------------------------------------------------------------------------------------------
// AdamW: invalid input.
// ---------------------------------------------------------------------------------------------

TEST(AdamWConfigTest, DefaultsAreValid) { EXPECT_TRUE(AdamWConfig().Validate().ok()); }

TEST(AdamWConfigTest, InvalidFieldsAreNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ExpectInvalid(Config(1.5f, 0.95f, 1e-8f, 0.1f).Validate(),
                "train.optimizer.beta1 = 1.5 must be in [0, 1)");
  ExpectInvalid(Config(1.0f, 0.95f, 1e-8f, 0.1f).Validate(), "train.optimizer.beta1 = 1 ");
  ExpectInvalid(Config(-0.1f, 0.95f, 1e-8f, 0.1f).Validate(), "train.optimizer.beta1 = -0.1 ");
  ExpectInvalid(Config(nan, 0.95f, 1e-8f, 0.1f).Validate(), "train.optimizer.beta1 = nan ");
  ExpectInvalid(Config(0.9f, 1.0f, 1e-8f, 0.1f).Validate(),
                "train.optimizer.beta2 = 1 must be in [0, 1)");
  ExpectInvalid(Config(0.9f, 0.95f, 0.0f, 0.1f).Validate(),
                "train.optimizer.eps = 0 must be positive and finite");
  ExpectInvalid(Config(0.9f, 0.95f, inf, 0.1f).Validate(), "train.optimizer.eps = inf ");
  ExpectInvalid(Config(0.9f, 0.95f, 1e-8f, -0.1f).Validate(),
                "train.optimizer.weight_decay = -0.1 must be non-negative and finite");
  ExpectInvalid(Config(0.9f, 0.95f, 1e-8f, nan).Validate(), "train.optimizer.weight_decay = nan");
  // Create validates the config too.
  Model model = MakeModel({{"w", {4}, true}}, 81);
  ExpectInvalid(AdamW::Create(Cpu(), Config(0.9f, 2.0f, 1e-8f, 0.1f), model.params).status(),
                "train.optimizer.beta2 = 2");
}

TEST(AdamWTest, CreateRejectsBrokenParameters) {
  Model model = MakeModel({{"a", {4, 3}, true}, {"b", {5}, false}}, 91);
  const auto create = [&](std::vector<Parameter> params) {
    return AdamW::Create(Cpu(), AdamWConfig(), std::move(params)).status();
  };
  const Parameter a = model.params[0], b = model.params[1];

  ExpectInvalid(create({a, {"a", b.value, b.grad, false}}), "parameter a is listed more than once");
  ExpectInvalid(create({{"", a.value, a.grad, true}}), "empty name");
  ExpectInvalid(create({{"a", a.value, TensorView(), true}}), "parameter a: grad has no tensor");
  ExpectInvalid(create({{"a", TensorView(), a.grad, true}}), "parameter a: value has no tensor");
  ExpectInvalid(create({{"a", a.value, a.grad.Reshape({3, 4}), true}}),
                "parameter a: grad (3, 4) f32 does not match value (4, 3) f32");
  std::vector<BF16> bf16(12);
  ExpectInvalid(create({{"a", a.value, TensorView(bf16.data(), DType::kBF16, {4, 3}), true}}),
                "parameter a: grad must be f32, got (4, 3) bf16");
  const TensorView strided(a.value.raw(), DType::kF32, {4, 3}, {1, 4});
  ExpectInvalid(create({{"a", strided, a.grad, true}}), "parameter a: value must be contiguous");
  // A tied weight listed under two names, and a grad that is another parameter's value.
  Tensor tied_grad = Tensor::Zeros(DType::kF32, {1, 3});
  ExpectInvalid(create({a, {"tied", a.value.Slice(1, 2), tied_grad, false}}),
                "parameters a (value) and tied (value) share memory");
  ExpectInvalid(create({a, {"b", b.value, a.value.Reshape({12}).Slice(0, 5), false}}),
                "share memory");
  EXPECT_TRUE(create({a, b}).ok());
}

TEST(AdamWTest, StepRejectsABadLearningRateAndChangesNothing) {
  Model model = MakeModel({{"w", {16}, true}}, 101);
  FillGrads(&model, 102, 0);
  const Model initial = CloneModel(model);
  AdamW optimizer = CreateOrDie(AdamWConfig(), model);
  for (float lr :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1e-3f}) {
    ExpectInvalid(optimizer.Step(lr), "learning rate");
  }
  EXPECT_EQ(optimizer.step(), 0);
  EXPECT_TRUE(BitEqual(model.values[0], initial.values[0]));
  EXPECT_TRUE(optimizer.Step(0.0f).ok());  // lr = 0 is a valid (if idle) step
  EXPECT_EQ(optimizer.step(), 1);
  EXPECT_TRUE(BitEqual(model.values[0], initial.values[0]));
}

TEST(AdamWTest, SetStateRejectsBadStateAndChangesNothing) {
  Model model = MakeModel({{"w", {2, 3}, true}, {"b", {3}, false}}, 111);
  AdamW optimizer = CreateOrDie(AdamWConfig(), model);
  RunSteps(&optimizer, &model, 0, 2);
  const std::vector<float> m0 = Contents(optimizer.exp_avg(0));
  Tensor w_m = Tensor::Zeros(DType::kF32, {2, 3}), w_v = Tensor::Zeros(DType::kF32, {2, 3});
  Tensor b_m = Tensor::Zeros(DType::kF32, {3}), b_v = Tensor::Zeros(DType::kF32, {3});
  Tensor wrong = Tensor::Zeros(DType::kF32, {3, 2});

  ExpectInvalid(optimizer.SetState(-1, {w_m, b_m}, {w_v, b_v}), "step = -1 must not be negative");
  ExpectInvalid(optimizer.SetState(3, {w_m}, {w_v, b_v}), "1 exp_avg tensors for 2 parameters");
  ExpectInvalid(optimizer.SetState(3, {w_m, b_m}, {wrong, b_v}),
                "w.exp_avg_sq: expected (2, 3) f32, got (3, 2) f32");
  ExpectInvalid(optimizer.SetState(3, {w_m, TensorView()}, {w_v, b_v}), "b.exp_avg: expected");
  b_v.data<float>()[2] = -1.0f;
  ExpectInvalid(optimizer.SetState(3, {w_m, b_m}, {w_v, b_v}),
                "b.exp_avg_sq[2] = -1 must be non-negative");
  b_v.data<float>()[2] = 0.0f;
  w_m.data<float>()[4] = std::numeric_limits<float>::infinity();
  ExpectInvalid(optimizer.SetState(3, {w_m, b_m}, {w_v, b_v}), "w.exp_avg[4] = inf is not finite");
  ExpectInvalid(optimizer.SetStep(-2), "step = -2");
  EXPECT_EQ(optimizer.step(), 2);
  EXPECT_EQ(Contents(optimizer.exp_avg(0)), m0);
}

}  // namespace
}  // namespace moetrain::optimizer_test
