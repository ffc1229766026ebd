#include "engine/fp8/fp8_recipe.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using ::moetrain::test_util::IsInvalidArgument;
using ops::Fp8Scaling;

TEST(Fp8RecipeConfigTest, DefaultsAreTransformerEnginesDelayedHybrid) {
  const Fp8RecipeConfig config;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.recipe, Fp8RecipeKind::kDelayed);
  EXPECT_TRUE(config.hybrid);
  EXPECT_EQ(config.amax_history_len, 1024);
  EXPECT_EQ(config.margin, 0);
  EXPECT_FALSE(config.amax_most_recent);
  EXPECT_TRUE(config.has_state());
}

TEST(Fp8RecipeConfigTest, ValidateNamesTheFieldAndValue) {
  Fp8RecipeConfig config;
  config.amax_history_len = 0;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_history_len = 0"));
  config.amax_history_len = -3;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_history_len = -3"));
  config.amax_history_len = 1;
  EXPECT_TRUE(config.Validate().ok());

  // The bounds of fp8_recipe.h, each just past its limit (values this accepted before): a history
  // of 2^20 floats a slot, a margin whose scales' inverses can be infinite, an epsilon that
  // dominates every amax.
  config.amax_history_len = int64_t{1} << 20;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_history_len = 1048576"));
  config.amax_history_len = kMaxAmaxHistoryLen + 1;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_history_len = 4097"));
  config.amax_history_len = kMaxAmaxHistoryLen;
  EXPECT_TRUE(config.Validate().ok());

  config.margin = -1;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.margin = -1"));
  config.margin = 64;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.margin = 64 must be in [0, 8]"));
  config.margin = kMaxFp8Margin + 1;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.margin = 9"));
  config.margin = kMaxFp8Margin;
  EXPECT_TRUE(config.Validate().ok());
  config.margin = 0;

  config.amax_epsilon = -0.5f;
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_epsilon = -0.5"));
  config.amax_epsilon = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_epsilon = inf"));
  config.amax_epsilon = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.amax_epsilon = nan"));
  config.amax_epsilon = 1e30f;
  EXPECT_TRUE(
      IsInvalidArgument(config.Validate(), "train.fp8.amax_epsilon = 1e+30 must be in [0, 1]"));
  config.amax_epsilon = 1e-12f;
  EXPECT_TRUE(config.Validate().ok());
  config.amax_epsilon = kMaxAmaxEpsilon;
  EXPECT_TRUE(config.Validate().ok());

  config.recipe = static_cast<Fp8RecipeKind>(9);
  EXPECT_TRUE(IsInvalidArgument(config.Validate(), "train.fp8.recipe = 9"));
}

TEST(Fp8RecipeConfigTest, Names) {
  EXPECT_EQ(Fp8RecipeName(Fp8RecipeKind::kDelayed), "delayed");
  EXPECT_EQ(Fp8RecipeName(Fp8RecipeKind::kCurrent), "current");
  EXPECT_EQ(Fp8RecipeName(Fp8RecipeKind::kBlockwise), "blockwise");
  EXPECT_EQ(Fp8RecipeName(Fp8RecipeKind::kMxfp8), "mxfp8");
}

TEST(Fp8RecipeConfigTest, ScalingOfEachRole) {
  struct Case {
    Fp8RecipeKind recipe;
    Fp8Scaling input, weight, grad;
    bool has_state;
  };
  const Case cases[] = {
      {Fp8RecipeKind::kDelayed, Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Scaling::kTensor,
       true},
      {Fp8RecipeKind::kCurrent, Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Scaling::kTensor,
       false},
      {Fp8RecipeKind::kBlockwise, Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock128x128,
       Fp8Scaling::kBlock1x128, false},
      {Fp8RecipeKind::kMxfp8, Fp8Scaling::kMx1x32, Fp8Scaling::kMx1x32, Fp8Scaling::kMx1x32, false},
  };
  for (const Case& c : cases) {
    Fp8RecipeConfig config;
    config.recipe = c.recipe;
    SCOPED_TRACE(std::string(Fp8RecipeName(c.recipe)));
    EXPECT_EQ(config.scaling(Fp8Role::kInput), c.input);
    EXPECT_EQ(config.scaling(Fp8Role::kWeight), c.weight);
    EXPECT_EQ(config.scaling(Fp8Role::kGrad), c.grad);
    EXPECT_EQ(config.has_state(), c.has_state);
  }
}

TEST(Fp8RecipeConfigTest, FormatOfEachRole) {
  Fp8RecipeConfig config;
  EXPECT_EQ(config.format(Fp8Role::kInput), Fp8Format::kE4M3);
  EXPECT_EQ(config.format(Fp8Role::kWeight), Fp8Format::kE4M3);
  EXPECT_EQ(config.format(Fp8Role::kGrad), Fp8Format::kE5M2);
  config.hybrid = false;
  EXPECT_EQ(config.format(Fp8Role::kGrad), Fp8Format::kE4M3);
}

}  // namespace
}  // namespace moetrain
