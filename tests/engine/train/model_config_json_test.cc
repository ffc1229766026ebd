// ModelConfig ⇄ JSON (model_config_json.h): the round trip, and ReadJsonKey's refusal of numbers
// its field cannot hold (found by tests/fuzz/model_config_fuzz: nlohmann converted them unchecked,
// and past the field's range that conversion is undefined behaviour).
#include "engine/train/model_config_json.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using Json = nlohmann::json;

TEST(ModelConfigJsonTest, RoundTripsAndReadsTheManifestsModel) {
  const ModelConfig config = transformer_test::TinyMlaConfig(6);
  ASSERT_OK_AND_ASSIGN(const ModelConfig read, ModelConfigFromJson(ModelConfigToJson(config)));
  EXPECT_EQ(ModelConfigToJson(read), ModelConfigToJson(config));
  ASSERT_OK_AND_ASSIGN(
      const ModelConfig from_manifest,
      ManifestModelConfig({{"step", 3}, {"model_config", ModelConfigToJson(config)}}));
  EXPECT_EQ(ModelConfigToJson(from_manifest), ModelConfigToJson(config));
  EXPECT_EQ(ManifestModelConfig({{"step", 3}}).status().message(),
            "model config: expected an object with a 'moe' object");
}

TEST(ModelConfigJsonTest, NumbersAFieldCannotHoldAreRefusedNamingTheKey) {
  const Json json = {{"a", 32.5},
                     {"b", 1e30},
                     {"c", 9223372036854775807},
                     {"d", 9223372036854775808u},
                     {"e", -1},
                     {"f", 1e300},
                     {"g", 3.5},
                     {"h", "7"}};
  int64_t i64 = 0;
  EXPECT_EQ(ReadJsonKey(json, "config.json: ", "a", &i64).message(),
            "config.json: a = 32.5 is not an integer");
  EXPECT_EQ(ReadJsonKey(json, "config.json: ", "b", &i64).message(),
            "config.json: b = 1e+30 is out of range: an integer written as a floating-point "
            "number must be at most 2^53 in magnitude");
  ASSERT_OK(ReadJsonKey(json, "config.json: ", "c", &i64));
  EXPECT_EQ(i64, INT64_MAX);
  EXPECT_EQ(ReadJsonKey(json, "x: ", "d", &i64).message(),
            "x: d = 9223372036854775808 is out of range (at most 2^63 - 1)");
  uint32_t u32 = 0;
  EXPECT_EQ(ReadJsonKey(json, "x: ", "e", &u32).message(),
            "x: e = -1 is out of the range of an unsigned 32-bit integer");
  float f32 = 0;
  EXPECT_EQ(ReadJsonKey(json, "x: ", "f", &f32).message(),
            "x: f = 1e+300 is out of a 32-bit float's range");
  ASSERT_OK(ReadJsonKey(json, "x: ", "g", &f32));
  EXPECT_EQ(f32, 3.5f);
  ASSERT_OK(ReadJsonKey(json, "x: ", "c", &f32));  // an integer is a number
  EXPECT_EQ(ReadJsonKey(json, "x: ", "h", &i64).message(),
            "x: h must be an integer, not a JSON string");
  EXPECT_EQ(ReadJsonKey(json, "x: ", "z", &i64).message(), "x: z is missing");

  // Through the model: a field of a manifest's or an export's model_config.
  Json model = ModelConfigToJson(transformer_test::TinyMlaConfig(6));
  model["moe"]["num_shared_experts"] = 5.5e84;
  EXPECT_EQ(
      ModelConfigFromJson(model).status().message(),
      "model config: moe.num_shared_experts = 5.5e+84 is out of range: an integer written as a "
      "floating-point number must be at most 2^53 in magnitude");
}

}  // namespace
}  // namespace moetrain
