#include "engine/moe/moe_config.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

// The status is InvalidArgument and its message contains `text`.
void ExpectInvalid(const MoeConfig& config, const std::string& text) {
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

TEST(MoeConfigTest, DefaultsAreValid) { EXPECT_TRUE(MoeConfig().Validate().ok()); }

TEST(MoeConfigTest, DeepSeekV3ShapeIsValid) {
  MoeConfig config;
  config.num_experts = 256;
  config.top_k = 8;
  config.num_groups = 8;
  config.group_top_k = 4;
  config.score_function = ScoreFunction::kSigmoid;
  config.expert_bias = true;
  config.routed_scaling_factor = 2.5f;
  config.num_shared_experts = 1;
  config.aux_loss = AuxLossType::kSequence;
  config.aux_loss_coeff = 1e-4f;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.experts_per_group(), 32);
  EXPECT_EQ(config.group_score_members(), 2);
}

TEST(MoeConfigTest, GroupScoreMembersIsAtLeastOne) {
  MoeConfig config;
  config.num_experts = 16;
  config.top_k = 2;
  config.num_groups = 4;
  config.group_top_k = 3;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.group_score_members(), 1);
}

TEST(MoeConfigTest, TopKEqualToNumExpertsIsValid) {
  MoeConfig config;
  config.num_experts = 4;
  config.top_k = 4;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
}

TEST(MoeConfigTest, TopKExceedsNumExperts) {
  MoeConfig config;
  config.num_experts = 8;
  config.top_k = 9;
  ExpectInvalid(config, "model.moe.top_k = 9 exceeds model.moe.num_experts = 8");
}

TEST(MoeConfigTest, NonPositiveSizes) {
  MoeConfig config;
  config.num_experts = 0;
  ExpectInvalid(config, "model.moe.num_experts = 0");
  config = MoeConfig();
  config.top_k = 0;
  ExpectInvalid(config, "model.moe.top_k = 0");
  config = MoeConfig();
  config.expert_ffn_dim = -4;
  ExpectInvalid(config, "model.moe.expert_ffn_dim = -4");
  config = MoeConfig();
  config.num_shared_experts = -1;
  ExpectInvalid(config, "model.moe.num_shared_experts = -1");
}

TEST(MoeConfigTest, NumGroupsMustDivideNumExperts) {
  MoeConfig config;
  config.num_experts = 8;
  config.num_groups = 3;
  ExpectInvalid(config, "model.moe.num_groups = 3 does not divide model.moe.num_experts = 8");
  config.num_groups = 0;
  ExpectInvalid(config, "model.moe.num_groups = 0");
}

TEST(MoeConfigTest, GroupTopKBounds) {
  MoeConfig config;
  config.num_experts = 16;
  config.num_groups = 4;
  config.group_top_k = 5;
  ExpectInvalid(config, "model.moe.group_top_k = 5 must be in [1, model.moe.num_groups = 4]");
  config.group_top_k = 0;
  ExpectInvalid(config, "model.moe.group_top_k = 0");
}

TEST(MoeConfigTest, TopKExceedsExpertsOfAllowedGroups) {
  MoeConfig config;
  config.num_experts = 16;
  config.num_groups = 4;
  config.group_top_k = 1;
  config.top_k = 5;  // one group of 4 experts cannot supply 5
  ExpectInvalid(config, "model.moe.top_k = 5 exceeds the 4 experts");
}

TEST(MoeConfigTest, RoutedScalingFactorMustBePositiveAndFinite) {
  MoeConfig config;
  config.routed_scaling_factor = 0.0f;
  ExpectInvalid(config, "model.moe.routed_scaling_factor = 0");
  config.routed_scaling_factor = -2.0f;
  ExpectInvalid(config, "model.moe.routed_scaling_factor = -2");
  config.routed_scaling_factor = std::numeric_limits<float>::infinity();
  ExpectInvalid(config, "model.moe.routed_scaling_factor = inf");
  config.routed_scaling_factor = std::nanf("");
  ExpectInvalid(config, "model.moe.routed_scaling_factor = nan");
}

TEST(MoeConfigTest, NegativeOrNonFiniteCoefficients) {
  MoeConfig config;
  config.aux_loss_coeff = -0.5f;
  ExpectInvalid(config, "model.moe.aux_loss_coeff = -0.5 must be non-negative and finite");
  config = MoeConfig();
  config.z_loss_coeff = -0.001f;
  ExpectInvalid(config, "model.moe.z_loss_coeff = -0.001 must be non-negative and finite");
  config = MoeConfig();
  config.z_loss_coeff = std::nanf("");
  ExpectInvalid(config, "model.moe.z_loss_coeff = nan");
  config = MoeConfig();
  config.expert_bias_update_rate = -1.0f;
  ExpectInvalid(config, "model.moe.expert_bias_update_rate = -1");
}

TEST(MoeConfigTest, CapacityFactor) {
  MoeConfig config;
  config.capacity_factor = -1.0f;
  ExpectInvalid(config, "model.moe.capacity_factor = -1 must be non-negative and finite");
  config.capacity_factor = std::numeric_limits<float>::infinity();
  ExpectInvalid(config, "model.moe.capacity_factor = inf");
  config.capacity_factor = 1.25f;
  EXPECT_TRUE(config.Validate().ok());
  config.capacity_factor = 0.0f;  // dropless
  EXPECT_TRUE(config.Validate().ok());
}

TEST(MoeConfigTest, EnumsOutOfRange) {
  MoeConfig config;
  config.score_function = static_cast<ScoreFunction>(7);
  ExpectInvalid(config, "model.moe.score_function = 7");
  config = MoeConfig();
  config.aux_loss = static_cast<AuxLossType>(9);
  ExpectInvalid(config, "model.moe.aux_loss = 9");
  config = MoeConfig();
  config.drop_policy = static_cast<DropPolicy>(3);
  ExpectInvalid(config, "model.moe.drop_policy = 3");
}

TEST(MoeConfigTest, NumExpertsMustFitInt32) {
  // Chosen experts are stored as i32.
  MoeConfig config;
  config.num_experts = int64_t{1} << 31;
  ExpectInvalid(config, "model.moe.num_experts = 2147483648");
}

}  // namespace
}  // namespace moetrain
