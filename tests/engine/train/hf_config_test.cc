// Which Hugging Face class config.json names (hf_config.h): each way a model can compute another
// function than DeepSeek-V3's code is listed, and a config.json of DeepSeek-V3's keys that the
// engine would compute differently, or one nested too deep, is refused on import.
#include "engine/train/hf_config.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/train/hf_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

// A scaled-down DeepSeek-V3: MLA, sigmoid with bias, 4 groups of 2 experts, top 4 from 2 groups.
ModelConfig DeepseekLike() {
  ModelConfig c = transformer_test::TinyMlaConfig(5);
  c.moe.num_experts = 8;
  c.moe.top_k = 4;
  c.moe.num_groups = 4;
  c.moe.group_top_k = 2;
  return c;
}

bool Lists(const std::vector<std::string>& differences, const std::string& part) {
  for (const std::string& d : differences) {
    if (d.find(part) != std::string::npos) return true;
  }
  return false;
}

TEST(HfConfigTest, ADeepseekLikeModelIsDeepseekV3) {
  const ModelConfig c = DeepseekLike();
  EXPECT_TRUE(DeepseekV3Differences(c, nullptr).empty());
  const nlohmann::json json = HuggingFaceConfig(c, 16);
  EXPECT_EQ(json["architectures"][0], kDeepseekV3Architecture);
  EXPECT_EQ(json["head_dim"], c.mla.qk_rope_head_dim);
  EXPECT_EQ(json["n_group"], 4);
  EXPECT_FALSE(json.contains("moetrain_differences"));
}

TEST(HfConfigTest, EveryOtherFunctionIsListedAndNamedMoetrain) {
  struct Case {
    const char* what;
    void (*change)(ModelConfig*);
    const char* listed;
  };
  const Case cases[] = {
      {"no bias", [](ModelConfig* c) { c->moe.expert_bias = false; }, "expert_bias"},
      {"dropping", [](ModelConfig* c) { c->moe.capacity_factor = 1.25f; }, "capacity_factor"},
      {"eps", [](ModelConfig* c) { c->rms_norm_eps = 1e-5f; }, "eps 1e-6"},
      {"softmax", [](ModelConfig* c) { c->moe.score_function = ScoreFunction::kSoftmax; },
       "softmax"},
      {"GQA", [](ModelConfig* c) { c->attention = AttentionType::kGqa; }, "grouped-query"},
      {"groups of one",
       [](ModelConfig* c) {
         c->moe.num_groups = 8;
         c->moe.group_top_k = 4;
       },
       "groups of 1 expert"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.what);
    ModelConfig c = DeepseekLike();
    test.change(&c);
    const std::vector<std::string> differences = DeepseekV3Differences(c, nullptr);
    EXPECT_TRUE(Lists(differences, test.listed)) << differences.size();
    const nlohmann::json json = HuggingFaceConfig(c, 16, /*force_deepseek_v3=*/true);
    EXPECT_EQ(json["architectures"][0], kMoetrainArchitecture);
  }
}

TEST(HfConfigTest, EveryGroupChosenIsWrittenAsOneGroup) {
  ModelConfig c = DeepseekLike();
  c.moe.num_groups = 8;  // one expert a group, all chosen: no group limit at all
  c.moe.group_top_k = 8;
  EXPECT_TRUE(DeepseekV3Differences(c, nullptr).empty());
  const nlohmann::json json = HuggingFaceConfig(c, 16);
  EXPECT_EQ(json["n_group"], 1);
  EXPECT_EQ(json["topk_group"], 1);
}

// DeepSeek-V3's own keys (no moetrain_model_config): read, or refused naming the key.
TEST(HfConfigTest, ImportReadsDeepseekKeysAndRefusesWhatItWouldComputeDifferently) {
  nlohmann::json json = HuggingFaceConfig(DeepseekLike(), 16);
  json.erase("moetrain_model_config");
  json["initializer_range"] = 0.006;
  int64_t seq_len = 0;
  absl::StatusOr<ModelConfig> read = ModelConfigFromHuggingFace(json, &seq_len);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(seq_len, 16);
  EXPECT_FLOAT_EQ(read->init_std, 0.006f);
  EXPECT_EQ(read->mla.q_lora_rank, 5);
  EXPECT_EQ(read->moe.num_groups, 4);

  for (const auto& [key, value] : {std::pair<const char*, nlohmann::json>{"rms_norm_eps", 1e-5},
                                   {"num_key_value_heads", 1},
                                   {"rope_scaling", {{"type", "yarn"}, {"factor", 40}}},
                                   {"rope_interleave", false}}) {
    SCOPED_TRACE(key);
    nlohmann::json changed = json;
    changed[key] = value;
    const absl::Status status = ModelConfigFromHuggingFace(changed, &seq_len).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(status.message()).find(key), std::string::npos) << status;
  }
}

// An integer key takes an exact integer in range, never a truncated or wrapped double (32.5 was
// read as 32, 1e30 as INT64_MIN); a float key a number a float can hold. Both name the key and the
// value; the same rule reads a moetrain export's moetrain_model_config.
TEST(HfConfigTest, IntegerKeysMustBeExactIntegersInRange) {
  nlohmann::json json = HuggingFaceConfig(DeepseekLike(), 16);
  json.erase("moetrain_model_config");
  int64_t seq_len = 0;
  const std::pair<const char*, nlohmann::json> refused[] = {
      {"hidden_size", 32.5},
      {"hidden_size", 1e30},
      {"hidden_size", true},
      {"hidden_size", nlohmann::json::array({32})},
      {"num_hidden_layers", uint64_t{1} << 63},
      {"num_hidden_layers", -1e300},
      {"rope_theta", 1e300},
      {"rope_theta", "10000"},
  };
  const char* messages[] = {
      "config.json: hidden_size = 32.5 is not an integer",
      "config.json: hidden_size = 1e+30 is out of range",
      "config.json: hidden_size must be an integer, not a JSON boolean",
      "config.json: hidden_size must be an integer, not a JSON array",
      "config.json: num_hidden_layers = 9223372036854775808 is out of range",
      "config.json: num_hidden_layers = -1e+300 is out of range",
      "config.json: rope_theta = 1e+300 is out of a 32-bit float's range",
      "config.json: rope_theta must be a number, not a JSON string",
  };
  for (size_t i = 0; i < std::size(refused); ++i) {
    const auto& [key, value] = refused[i];
    SCOPED_TRACE(value.dump());
    nlohmann::json changed = json;
    changed[key] = value;
    const absl::Status status = ModelConfigFromHuggingFace(changed, &seq_len).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), ::testing::StartsWith(messages[i]));
  }
  // Exact integers written as doubles are the integers.
  nlohmann::json exact = json;
  exact["hidden_size"] = static_cast<double>(json["hidden_size"].get<int64_t>());
  absl::StatusOr<ModelConfig> read = ModelConfigFromHuggingFace(exact, &seq_len);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->hidden_size, json["hidden_size"].get<int64_t>());

  // The same through a moetrain export's model config.
  nlohmann::json moetrain = HuggingFaceConfig(DeepseekLike(), 16);
  moetrain["moetrain_model_config"]["moe"]["num_experts"] = 8.25;
  EXPECT_EQ(ModelConfigFromHuggingFace(moetrain, &seq_len).status().message(),
            "model config: moe.num_experts = 8.25 is not an integer");
}

// A config.json nested 500,000 deep (1 MB, within import's 1 MiB cap on config.json) where import
// reads it: architectures (printed in the refusal), a key of moetrain_model_config (printed as the
// wrong type), and architectures beside a good moetrain_model_config (copied by
// ImportHuggingFace). Each overflowed the stack (SIGSEGV) and took `moetrain import` down; now
// config.json is refused as it is parsed. In a child process, so that the old crash fails only
// this test.
TEST(HfConfigTest, DeeplyNestedConfigJsonIsRefusedOnImport) {
  const testutil::TempDir dir("hf_config_test");
  nlohmann::json deepseek_keys = HuggingFaceConfig(DeepseekLike(), 16);
  deepseek_keys.erase("moetrain_model_config");
  deepseek_keys["architectures"] = "DEEP";
  nlohmann::json bad_key = HuggingFaceConfig(DeepseekLike(), 16);
  bad_key["moetrain_model_config"]["vocab_size"] = "DEEP";
  nlohmann::json moetrain_export = HuggingFaceConfig(DeepseekLike(), 16);
  moetrain_export["architectures"] = "DEEP";
  for (const nlohmann::json& config : {deepseek_keys, bad_key, moetrain_export}) {
    std::string text = config.dump();
    text.replace(text.find("\"DEEP\""), 6, testutil::NestedJsonArrays(500000));
    const std::filesystem::path hf = dir.path() / "hf";
    std::filesystem::create_directories(hf);
    std::ofstream(hf / "config.json", std::ios::trunc) << text;
    EXPECT_EXIT(testutil::ExitWithError(
                    ImportHuggingFace(hf.string(), (dir.path() / "out" / "job").string())),
                ::testing::ExitedWithCode(0),
                "hf/config.json nests JSON arrays and objects deeper than 64 levels");
  }
}

}  // namespace
}  // namespace moetrain
