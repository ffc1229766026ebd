// The learning-rate schedule: exact values at every boundary, each decay type against a float64
// evaluation of the documented formula, monotonicity, and invalid configs.
#include "engine/train/lr_schedule.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

LrScheduleConfig Schedule(DecayType decay, int64_t warmup_steps, int64_t total_steps) {
  LrScheduleConfig config;
  config.decay = decay;
  config.warmup_steps = warmup_steps;
  config.total_steps = total_steps;
  return config;
}

// The formula of the header, in f64.
double Reference(const LrScheduleConfig& config, int64_t step) {
  const double lr = config.lr, min_lr = config.min_lr;
  const double warmup = static_cast<double>(config.warmup_steps);
  const double s = static_cast<double>(step < 0 ? 0 : step);
  if (s < warmup) return lr * (s + 1.0) / warmup;
  if (config.decay == DecayType::kConstant) return lr;
  double p = (s - warmup) / std::max(1.0, static_cast<double>(config.total_steps) - warmup);
  p = std::min(1.0, std::max(0.0, p));
  if (config.decay == DecayType::kCosine) {
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  }
  return lr - (lr - min_lr) * p;
}

void ExpectInvalid(const LrScheduleConfig& config, const std::string& text) {
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

class LrScheduleTest : public ::testing::TestWithParam<DecayType> {};

TEST_P(LrScheduleTest, ExactAtTheBoundaries) {
  const LrScheduleConfig config = Schedule(GetParam(), 10, 100);
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  const float lr = config.lr;
  const float floor = GetParam() == DecayType::kConstant ? lr : config.min_lr;
  EXPECT_EQ(LearningRate(config, 0), static_cast<float>(lr / 10.0));
  EXPECT_EQ(LearningRate(config, 4), static_cast<float>(lr * 5.0 / 10.0));
  EXPECT_EQ(LearningRate(config, 9), lr);   // last warmup step: the peak
  EXPECT_EQ(LearningRate(config, 10), lr);  // first decay step: progress 0
  EXPECT_EQ(LearningRate(config, 100), floor);
  EXPECT_EQ(LearningRate(config, 101), floor);
  EXPECT_EQ(LearningRate(config, std::numeric_limits<int64_t>::max()), floor);
  EXPECT_EQ(LearningRate(config, -5), LearningRate(config, 0));
  // Step total − 1 is 1/90 short of the end of the decay: still above min_lr.
  EXPECT_EQ(LearningRate(config, 99), static_cast<float>(Reference(config, 99)));
  if (GetParam() != DecayType::kConstant) {
    EXPECT_GT(LearningRate(config, 99), config.min_lr);
  }
}

TEST_P(LrScheduleTest, MatchesTheFormulaAtEveryStep) {
  for (const auto& [warmup, total] :
       {std::pair<int64_t, int64_t>(0, 1000), {7, 50}, {1, 2}, {0, 1}, {5, 5}, {3, 4}}) {
    const LrScheduleConfig config = Schedule(GetParam(), warmup, total);
    ASSERT_TRUE(config.Validate().ok()) << config.Validate();
    for (int64_t step = 0; step <= total + 3; ++step) {
      const double expected = Reference(config, step);
      EXPECT_NEAR(LearningRate(config, step), expected, 1e-7 * expected)
          << "warmup " << warmup << ", total " << total << ", step " << step;
    }
  }
}

TEST_P(LrScheduleTest, WarmupRisesThenDecayFalls) {
  const LrScheduleConfig config = Schedule(GetParam(), 20, 300);
  for (int64_t step = 1; step < 20; ++step) {
    EXPECT_GT(LearningRate(config, step), LearningRate(config, step - 1)) << step;
  }
  for (int64_t step = 21; step <= 320; ++step) {
    if (GetParam() == DecayType::kConstant) {
      EXPECT_EQ(LearningRate(config, step), config.lr) << step;
    } else if (step <= 300) {
      EXPECT_LT(LearningRate(config, step), LearningRate(config, step - 1)) << step;
    } else {
      EXPECT_EQ(LearningRate(config, step), config.min_lr) << step;
    }
  }
}

TEST_P(LrScheduleTest, NoWarmupStartsAtThePeak) {
  const LrScheduleConfig config = Schedule(GetParam(), 0, 1000);
  EXPECT_EQ(LearningRate(config, 0), config.lr);
  EXPECT_EQ(LearningRate(config, 1000),
            GetParam() == DecayType::kConstant ? config.lr : config.min_lr);
}

INSTANTIATE_TEST_SUITE_P(DecayTypes, LrScheduleTest,
                         ::testing::Values(DecayType::kCosine, DecayType::kLinear,
                                           DecayType::kConstant),
                         [](const ::testing::TestParamInfo<DecayType>& info) {
                           switch (info.param) {
                             case DecayType::kCosine:
                               return "cosine";
                             case DecayType::kLinear:
                               return "linear";
                             case DecayType::kConstant:
                               return "constant";
                           }
                           return "unknown";
                         });

TEST(LrScheduleShapeTest, CosineAndLinearMidpoints) {
  // Halfway through the decay both are at the middle of [min_lr, lr]; a quarter of the way, the
  // cosine is still at (2 + √2)/4 of the range and the linear at 3/4.
  LrScheduleConfig cosine = Schedule(DecayType::kCosine, 0, 100);
  cosine.lr = 1.0f;
  cosine.min_lr = 0.0f;
  LrScheduleConfig linear = cosine;
  linear.decay = DecayType::kLinear;
  EXPECT_NEAR(LearningRate(cosine, 50), 0.5, 1e-7);
  EXPECT_EQ(LearningRate(linear, 50), 0.5f);
  EXPECT_NEAR(LearningRate(cosine, 25), (2.0 + std::sqrt(2.0)) / 4.0, 1e-7);
  EXPECT_EQ(LearningRate(linear, 25), 0.75f);
  // min_lr = lr: flat after warmup.
  LrScheduleConfig flat = Schedule(DecayType::kCosine, 4, 40);
  flat.min_lr = flat.lr;
  for (int64_t step = 3; step < 50; ++step) EXPECT_EQ(LearningRate(flat, step), flat.lr) << step;
}

TEST(LrScheduleConfigTest, DefaultsAreValid) { EXPECT_TRUE(LrScheduleConfig().Validate().ok()); }

TEST(LrScheduleConfigTest, InvalidFieldsAreNamed) {
  LrScheduleConfig config;
  config.min_lr = 1.0f;
  ExpectInvalid(config, "train.optimizer.min_lr = 1 exceeds train.optimizer.lr = 0.0003");

  config = LrScheduleConfig();
  config.lr = 0.0f;
  ExpectInvalid(config, "train.optimizer.lr = 0 must be positive and finite");
  config.lr = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(config, "train.optimizer.lr = nan");
  config.lr = std::numeric_limits<float>::infinity();
  ExpectInvalid(config, "train.optimizer.lr = inf");

  config = LrScheduleConfig();
  config.min_lr = -1e-5f;
  ExpectInvalid(config, "train.optimizer.min_lr = -1e-05 must be non-negative and finite");
  config.min_lr = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(config, "train.optimizer.min_lr = nan");

  config = LrScheduleConfig();
  config.warmup_steps = -1;
  ExpectInvalid(config, "train.optimizer.warmup_steps = -1 must not be negative");
  config.warmup_steps = 1001;
  ExpectInvalid(config, "train.optimizer.warmup_steps = 1001 exceeds train.steps = 1000");

  config = LrScheduleConfig();
  config.total_steps = 0;
  ExpectInvalid(config, "train.steps = 0 must be at least 1");

  config = LrScheduleConfig();
  config.decay = static_cast<DecayType>(7);
  ExpectInvalid(config, "train.optimizer.decay = 7 is not a decay type");
}

}  // namespace
}  // namespace moetrain
