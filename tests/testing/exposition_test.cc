// The tests' reader of the text exposition format (exposition.h): what it reads, and that it
// refuses what is not the format, so that the tests built on it can fail.
#include "tests/testing/exposition.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain::testutil {
namespace {

TEST(ExpositionTest, ReadsFamiliesAndSamples) {
  absl::StatusOr<Exposition> parsed = ParseExposition(
      "# HELP moetrain_a_total Line\\none \\\\ two.\n"
      "# TYPE moetrain_a_total counter\n"
      "moetrain_a_total{code=\"OK\",path=\"a\\\"b\\\\c\\nd\"} 3\n"
      "moetrain_a_total{path=\"x\",code=\"OK\",} 1.5 1700000000000\n"
      "# a comment\n"
      "\n"
      "moetrain_b -Inf\n"
      "moetrain_c Nan\n"
      "moetrain_d_bucket{le=\"+Inf\"} 1e+20\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->help.at("moetrain_a_total"), "Line\none \\ two.");
  EXPECT_EQ(parsed->TypeOf("moetrain_a_total"), "counter");
  EXPECT_EQ(parsed->TypeOf("moetrain_b"), "");
  EXPECT_EQ(parsed->Value("moetrain_a_total", {{"path", "a\"b\\c\nd"}, {"code", "OK"}}), 3);
  EXPECT_EQ(parsed->Value("moetrain_a_total", {{"code", "OK"}, {"path", "x"}}), 1.5);
  EXPECT_EQ(parsed->Value("moetrain_a_total", {{"code", "OK"}}), std::nullopt);
  EXPECT_EQ(parsed->Value("moetrain_b"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(parsed->Value("moetrain_c").value_or(0)));
  EXPECT_EQ(parsed->Histogram("moetrain_d").buckets,
            (std::map<std::string, double>{{"+Inf", 1e20}}));
  EXPECT_EQ(SeriesValue(*parsed, R"(moetrain_a_total{path="x",code="OK"})"), 1.5);
  EXPECT_EQ(parsed->WithLabel("code", "OK").size(), 2u);
  EXPECT_EQ(parsed->samples.size(), 5u);
}

TEST(ExpositionTest, RefusesWhatIsNotTheFormat) {
  for (const char* bad : {
           "moetrain_a\n",                                        // no value
           "moetrain_a 1x\n",                                     // not a number
           "moetrain_a{b=\"1\" 1\n",                              // unterminated label set
           "moetrain_a{b=\"1} 1\n",                               // unterminated value
           "moetrain_a{b=1} 1\n",                                 // unquoted value
           "moetrain_a{b=\"\\q\"} 1\n",                           // unknown escape
           "moetrain_a{b=\"1\",b=\"2\"} 1\n",                     // a label twice
           "{b=\"1\"} 1\n",                                       // no name
           "# TYPE moetrain_a gauge\n# TYPE moetrain_a gauge\n",  // two TYPEs
           "moetrain_a{b=\"1\",c=\"2\"} 1\nmoetrain_a{c=\"2\",b=\"1\"} 2\n",  // a series twice
       }) {
    EXPECT_FALSE(ParseExposition(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace moetrain::testutil
