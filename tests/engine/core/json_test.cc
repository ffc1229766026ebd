#include "engine/core/json.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testutil::NestedJsonArrays;

TEST(ParseJsonTest, ParsesWhatNestsUpToTheLimit) {
  ASSERT_OK_AND_ASSIGN(const nlohmann::json arrays,
                       ParseJson(NestedJsonArrays(kMaxJsonDepth), "arrays.json"));
  const nlohmann::json* inner = &arrays;
  for (int level = 1; level < kMaxJsonDepth; ++level) inner = &inner->at(0);
  EXPECT_EQ(*inner, nlohmann::json::array({0}));
  // Objects and arrays count alike.
  std::string mixed = "0";
  for (int level = 0; level < kMaxJsonDepth; ++level) {
    mixed = level % 2 == 0 ? "{\"k\": " + mixed + "}" : "[" + mixed + "]";
  }
  EXPECT_OK(ParseJson(mixed, "mixed.json"));
  EXPECT_EQ(*ParseJson(R"({"a": [1, {"b": null}], "c": "d"})", "x"),
            nlohmann::json({{"a", {1, {{"b", nullptr}}}}, {"c", "d"}}));
}

TEST(ParseJsonTest, RefusesOneLevelMoreNamingTheSourceAndTheLimit) {
  const absl::Status status =
      ParseJson(NestedJsonArrays(kMaxJsonDepth + 1), "/ckpt/step-00000004/manifest.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "/ckpt/step-00000004/manifest.json nests JSON arrays and objects deeper than 64 "
            "levels");
  std::string objects = "0";
  for (int level = 0; level <= kMaxJsonDepth; ++level) objects = "{\"k\": " + objects + "}";
  EXPECT_THAT(ParseJson(objects, "config.json").status().message(),
              HasSubstr("config.json nests JSON arrays and objects deeper than 64 levels"));
}

// The input of the issue: 2 MB nested 10^6 deep. Refused as it parses, so nothing here recurses.
TEST(ParseJsonTest, RefusesAMillionLevels) {
  const std::string deep = "{\"model_config\": " + NestedJsonArrays(1000000) + "}";
  EXPECT_THAT(ParseJson(deep, "manifest.json").status().message(),
              HasSubstr("deeper than 64 levels"));
}

TEST(ParseJsonTest, InvalidJsonNamesTheSourceAndTheByte) {
  const absl::Status status = ParseJson("{\"a\": tru}", "index.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("index.json is not valid JSON (at byte 10): "));
  EXPECT_THAT(status.message(), Not(HasSubstr("[json.exception")));
  EXPECT_THAT(ParseJson("[1e400]", "n.json").status().message(),
              HasSubstr("n.json is not valid JSON: number overflow"));
  // The reason quotes the token the parser stopped in, cut: here the rest of a 1 MB file.
  const std::string unterminated = "[\"" + std::string(1 << 20, 'x');
  const absl::Status cut = ParseJson(unterminated, "big.json").status();
  EXPECT_THAT(cut.message(), HasSubstr("big.json is not valid JSON"));
  EXPECT_LT(cut.message().size(), 400u);
}

TEST(JsonExcerptTest, QuotesShortValuesWholeAndCutsLongOnes) {
  EXPECT_EQ(JsonExcerpt(nlohmann::json({1, "a"})), "[1,\"a\"]");
  const nlohmann::json long_array = nlohmann::json(std::vector<int>(1000, 7));
  const std::string whole = long_array.dump();
  EXPECT_EQ(JsonExcerpt(long_array), whole.substr(0, kJsonExcerptBytes) + "... (" +
                                         std::to_string(whole.size()) + " bytes)");
  // Never half a character: "é" is 2 bytes, and byte 64 would split one.
  const nlohmann::json accents = std::string(40, 'a') + std::string(20, 'x') + "\xC3\xA9\xC3\xA9";
  // "\"" + 60 ASCII = 61 bytes; the first é takes bytes 61-62, the second 63-64.
  EXPECT_EQ(JsonExcerpt(accents),
            "\"" + std::string(40, 'a') + std::string(20, 'x') + "\xC3\xA9... (66 bytes)");
  EXPECT_EQ(JsonExcerpt(*ParseJson(NestedJsonArrays(kMaxJsonDepth), "x")).size(),
            kJsonExcerptBytes + std::string("... (129 bytes)").size());
}

}  // namespace
}  // namespace moetrain
