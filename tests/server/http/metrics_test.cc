#include "server/http/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;
using testutil::Exposition;
using testutil::ExpositionSample;
using testutil::Must;
using testutil::MustParseExposition;
using testutil::PromtoolCheckMetrics;
using testutil::PromtoolResult;

Exposition Parse(const MetricsRegistry& registry) {
  return MustParseExposition(registry.Serialize());
}

TEST(MetricsRegistryTest, WritesEachKind) {
  MetricsRegistry registry;
  Family<Counter>* rpcs =
      Must(registry.AddCounter("moetrain_rpcs_total", "RPCs handled.", {"method", "code"}));
  Must(rpcs->WithLabels({"SubmitJob", "OK"}))->Increment();
  Must(rpcs->WithLabels({"GetJob", "OK"}))->Increment(2);
  Must(rpcs->WithLabels({"GetJob", "NOT_FOUND"}))->Increment(0.5);
  Family<Gauge>* learning_rate =
      Must(registry.AddGauge("moetrain_train_learning_rate", "Learning rate of the last step."));
  Must(learning_rate->WithLabels({}))->Set(0.0003);
  Family<Histogram>* step = Must(registry.AddHistogram(
      "moetrain_train_step_duration_seconds", "Wall time of a step.", {"job"}, {0.25, 1, 10}));
  Histogram* job_a = Must(step->WithLabels({"a"}));
  for (double v : {0.0625, 1.0, 3.0, 100.0}) job_a->Observe(v);
  Must(step->WithLabels({"b"}));
  // A labelled family without children is left out.
  Must(registry.AddGauge("moetrain_workers", "Workers by state.", {"state"}));

  const Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.type, (std::map<std::string, std::string>{
                             {"moetrain_rpcs_total", "counter"},
                             {"moetrain_train_learning_rate", "gauge"},
                             {"moetrain_train_step_duration_seconds", "histogram"}}));
  EXPECT_EQ(parsed.help.at("moetrain_rpcs_total"), "RPCs handled.");
  EXPECT_EQ(parsed.help.at("moetrain_train_learning_rate"), "Learning rate of the last step.");
  // prometheus-cpp writes a counter under its name as registered, without a second "_total".
  std::vector<ExpositionSample> counters;
  for (const ExpositionSample& sample : parsed.samples) {
    if (parsed.type.count(sample.name) && parsed.type.at(sample.name) == "counter") {
      counters.push_back(sample);
    }
  }
  EXPECT_EQ(counters,
            (std::vector<ExpositionSample>{
                {"moetrain_rpcs_total", {{"method", "GetJob"}, {"code", "NOT_FOUND"}}, 0.5},
                {"moetrain_rpcs_total", {{"method", "GetJob"}, {"code", "OK"}}, 2},
                {"moetrain_rpcs_total", {{"method", "SubmitJob"}, {"code", "OK"}}, 1}}));
  EXPECT_EQ(parsed.Value("moetrain_train_learning_rate"), 0.0003);

  const Exposition::HistogramSeries a =
      parsed.Histogram("moetrain_train_step_duration_seconds", {{"job", "a"}});
  EXPECT_EQ(a.buckets,
            (std::map<std::string, double>{{"0.25", 1}, {"1", 2}, {"10", 3}, {"+Inf", 4}}));
  EXPECT_EQ(a.sum, 104.0625);
  EXPECT_EQ(a.count, 4);
  const Exposition::HistogramSeries b =
      parsed.Histogram("moetrain_train_step_duration_seconds", {{"job", "b"}});
  EXPECT_EQ(b.buckets,
            (std::map<std::string, double>{{"0.25", 0}, {"1", 0}, {"10", 0}, {"+Inf", 0}}));
  EXPECT_EQ(b.sum, 0);
  EXPECT_EQ(b.count, 0);
  // 3 counters, 1 gauge, 2 histograms of 4 buckets, _sum and _count.
  EXPECT_EQ(parsed.samples.size(), 3u + 1 + 2 * 6);
}

TEST(MetricsRegistryTest, UnlabelledFamiliesStartAtZero) {
  MetricsRegistry registry;
  Family<Counter>* restarts = Must(registry.AddCounter("moetrain_restarts_total", "Restarts."));
  Must(registry.AddHistogram("moetrain_checkpoint_duration_seconds", "Checkpoint time.", {}, {1}));
  const Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.Value("moetrain_restarts_total"), 0);
  const Exposition::HistogramSeries h = parsed.Histogram("moetrain_checkpoint_duration_seconds");
  EXPECT_EQ(h.buckets, (std::map<std::string, double>{{"1", 0}, {"+Inf", 0}}));
  EXPECT_EQ(h.sum, 0);
  EXPECT_EQ(h.count, 0);
  EXPECT_EQ(parsed.samples.size(), 5u);
  EXPECT_EQ(Must(restarts->WithLabels({})), Must(restarts->WithLabels({})));
}

TEST(MetricsRegistryTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  const std::string help = "Line one\nback\\slash \"quoted\" {braces} \\n";
  Family<Gauge>* gauge = Must(registry.AddGauge("moetrain_escape_test", help, {"path"}));
  Must(gauge->WithLabels({"a\\b\"c\nd"}))->Set(1);
  Must(gauge->WithLabels({"ü€𝄞 ,=}"}))->Set(2);
  const std::string text = registry.Serialize();
  // One line each: the HELP, the TYPE and two samples.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4) << text;
  const Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.help.at("moetrain_escape_test"), help);
  EXPECT_EQ(parsed.Value("moetrain_escape_test", {{"path", "a\\b\"c\nd"}}), 1);
  EXPECT_EQ(parsed.Value("moetrain_escape_test", {{"path", "ü€𝄞 ,=}"}}), 2);
}

TEST(MetricsRegistryTest, WithLabelsChecksArityAndUtf8AndKeepsPointers) {
  MetricsRegistry registry;
  Family<Counter>* rpcs =
      Must(registry.AddCounter("moetrain_rpcs_total", "RPCs.", {"method", "code"}));
  Counter* first = Must(rpcs->WithLabels({"GetJob", "OK"}));
  for (int i = 0; i < 100; ++i) Must(rpcs->WithLabels({"Other", std::to_string(i)}));
  EXPECT_EQ(Must(rpcs->WithLabels({"GetJob", std::string("OK")})), first);

  absl::StatusOr<Counter*> too_few = rpcs->WithLabels({"GetJob"});
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_few.status().message(),
              HasSubstr("moetrain_rpcs_total has 2 labels (method, code), got 1 values (GetJob)"));
  EXPECT_EQ(rpcs->WithLabels({"a", "b", "c"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rpcs->WithLabels({}).status().code(), absl::StatusCode::kInvalidArgument);

  // Bad bytes, a cut-off sequence, an overlong NUL, a surrogate, a code point past U+10FFFF.
  for (const char* bad : {"\xff", "ok\xe2\x82", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    absl::StatusOr<Counter*> child = rpcs->WithLabels({"GetJob", bad});
    EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(child.status().message(), HasSubstr("label code: value is not valid UTF-8"));
  }
  EXPECT_TRUE(rpcs->WithLabels({"GetJob", "\xf4\x8f\xbf\xbf"}).ok());  // U+10FFFF
  EXPECT_THAT(registry.Serialize(), ::testing::Not(HasSubstr("\xff")));
}

TEST(MetricsRegistryTest, RemoveDropsOneChildAndKeepsTheOthers) {
  MetricsRegistry registry;
  Family<Counter>* restarts =
      Must(registry.AddCounter("moetrain_restarts_total", "Restarts.", {"job_id", "reason"}));
  Must(restarts->WithLabels({"job-a", "lost"}))->Increment(2);
  Must(restarts->WithLabels({"job-a", "failed"}))->Increment(3);
  Must(restarts->WithLabels({"job-b", "lost"}))->Increment(5);
  Family<Gauge>* up = Must(registry.AddGauge("moetrain_up", "Up."));

  EXPECT_TRUE(restarts->Remove({"job-a", "lost"}));
  Exposition parsed = Parse(registry);
  const std::string name = "moetrain_restarts_total";
  EXPECT_EQ(parsed.Value(name, {{"job_id", "job-a"}, {"reason", "lost"}}), std::nullopt);
  EXPECT_EQ(parsed.Value(name, {{"job_id", "job-a"}, {"reason", "failed"}}), 3);
  EXPECT_EQ(parsed.Value(name, {{"job_id", "job-b"}, {"reason", "lost"}}), 5);

  // Unknown values, a prefix of a child's values, the wrong count and a repeat: nothing happens.
  EXPECT_FALSE(restarts->Remove({"job-a", "lost"}));
  EXPECT_FALSE(restarts->Remove({"job-c", "lost"}));
  EXPECT_FALSE(restarts->Remove({"job-a"}));
  EXPECT_FALSE(restarts->Remove({"job-a", "failed", "extra"}));
  EXPECT_FALSE(restarts->Remove({}));
  // An unlabelled family keeps its one child: others hold its pointer for good.
  EXPECT_FALSE(up->Remove({}));
  EXPECT_EQ(Parse(registry).samples.size(), 3u);

  // A child made again after its removal starts from zero.
  EXPECT_EQ(Must(restarts->WithLabels({"job-a", "lost"}))->Value(), 0);

  // A family left without children is not written at all, not even its HELP and TYPE lines.
  for (const char* reason : {"lost", "failed"}) EXPECT_TRUE(restarts->Remove({"job-a", reason}));
  EXPECT_TRUE(restarts->Remove({"job-b", "lost"}));
  parsed = Parse(registry);
  EXPECT_EQ(parsed.type, (std::map<std::string, std::string>{{"moetrain_up", "gauge"}}));
  EXPECT_EQ(parsed.help.size(), 1u);
  EXPECT_EQ(parsed.samples, (std::vector<ExpositionSample>{{"moetrain_up", {}, 0}}));
}

TEST(MetricsRegistryTest, RemoveWhereDropsEveryChildWithTheLabelValue) {
  MetricsRegistry registry;
  Family<Gauge>* load =
      Must(registry.AddGauge("moetrain_load_ratio", "Load.", {"job_id", "layer"}));
  Family<Gauge>* by_state =
      Must(registry.AddGauge("moetrain_state", "State.", {"state", "job_id"}));
  Family<Histogram>* steps =
      Must(registry.AddHistogram("moetrain_step_duration_seconds", "Steps.", {"job_id"}, {0.5, 1}));
  // "job-a" sorts next to "job-a2", "job-" and "job-a\x01": only exact values go.
  for (const char* job : {"job-", "job-a", "job-a\x01", "job-a2", "job-b"}) {
    for (const char* layer : {"0", "1", "10"}) Must(load->WithLabels({job, layer}))->Set(1);
    for (const char* state : {"RUNNING", "SUCCEEDED"}) {
      Must(by_state->WithLabels({state, job}))->Set(1);
    }
    Must(steps->WithLabels({job}))->Observe(0.7);
  }

  EXPECT_EQ(load->RemoveWhere("job_id", "job-a"), 3);
  EXPECT_EQ(by_state->RemoveWhere("job_id", "job-a"), 2);
  EXPECT_EQ(steps->RemoveWhere("job_id", "job-a"), 1);
  const Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.WithLabel("job_id", "job-a"), std::vector<ExpositionSample>());
  for (const char* job : {"job-", "job-a\x01", "job-a2", "job-b"}) {
    EXPECT_EQ(parsed.Value("moetrain_load_ratio", {{"job_id", job}, {"layer", "10"}}), 1) << job;
    EXPECT_EQ(parsed.Value("moetrain_state", {{"state", "RUNNING"}, {"job_id", job}}), 1) << job;
    EXPECT_EQ(parsed.Histogram("moetrain_step_duration_seconds", {{"job_id", job}}).count, 1)
        << job;
    // 3 layers, 2 states, a histogram of 3 buckets, _sum and _count.
    EXPECT_EQ(parsed.WithLabel("job_id", job).size(), 3u + 2 + 5) << job;
  }
  EXPECT_EQ(parsed.samples.size(), 4u * (3 + 2 + 5));

  // An unknown value, a label the family does not have, or an unlabelled family: nothing goes.
  EXPECT_EQ(load->RemoveWhere("job_id", "job-a"), 0);
  EXPECT_EQ(load->RemoveWhere("job_id", "job-z"), 0);
  EXPECT_EQ(load->RemoveWhere("state", "RUNNING"), 0);
  Family<Gauge>* up = Must(registry.AddGauge("moetrain_up", "Up."));
  EXPECT_EQ(up->RemoveWhere("job_id", ""), 0);
  EXPECT_EQ(Parse(registry).samples.size(), parsed.samples.size() + 1);
  // Through the base class, as a holder of families of mixed types removes them.
  FamilyBase* base = steps;
  EXPECT_EQ(base->RemoveWhere("job_id", "job-b"), 1);
}

TEST(MetricsRegistryTest, CounterAndHistogramIgnoreNan) {
  MetricsRegistry registry;
  Counter* counter = Must(Must(registry.AddCounter("moetrain_c_total", "C."))->WithLabels({}));
  counter->Increment(1.5);
  counter->Increment(-1);
  counter->Increment(std::nan(""));
  counter->Increment(0);
  EXPECT_EQ(counter->Value(), 1.5);
  Gauge* gauge = Must(Must(registry.AddGauge("moetrain_g", "G."))->WithLabels({}));
  gauge->Set(3);
  gauge->Add(-4.5);
  EXPECT_EQ(gauge->Value(), -1.5);
  Histogram* histogram =
      Must(Must(registry.AddHistogram("moetrain_h", "H.", {}, {1, 2}))->WithLabels({}));
  histogram->Observe(std::nan(""));
  histogram->Observe(1.5);
  const Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.Value("moetrain_c_total"), 1.5);
  EXPECT_EQ(parsed.Value("moetrain_g"), -1.5);
  const Exposition::HistogramSeries h = parsed.Histogram("moetrain_h");
  EXPECT_EQ(h.buckets, (std::map<std::string, double>{{"1", 0}, {"2", 1}, {"+Inf", 1}}));
  EXPECT_EQ(h.sum, 1.5);
  EXPECT_EQ(h.count, 1);
}

TEST(HistogramTest, ValueOnABoundFallsInThatBucket) {
  MetricsRegistry registry;
  Family<Histogram>* family = Must(registry.AddHistogram("moetrain_h", "Help.", {}, {1, 2, 4}));
  Histogram* h = Must(family->WithLabels({}));
  for (double v : {1.0, 2.0, std::nextafter(1.0, 2.0), 4.0, 4.1, -5.0}) h->Observe(v);
  const Exposition::HistogramSeries series = Parse(registry).Histogram("moetrain_h");
  EXPECT_EQ(series.buckets,
            (std::map<std::string, double>{{"1", 2}, {"2", 4}, {"4", 5}, {"+Inf", 6}}));
  EXPECT_DOUBLE_EQ(*series.sum, 1.0 + 2.0 + std::nextafter(1.0, 2.0) + 4.0 + 4.1 - 5.0);
  EXPECT_EQ(series.count, 6);
}

// prometheus-cpp writes 16 significant digits: integers up to 2^53 come back exactly, other
// values within a relative 1e-15 (the 17th digit, which a double may need, is dropped).
TEST(MetricsRegistryTest, NumbersParseBack) {
  MetricsRegistry registry;
  Family<Gauge>* family = Must(registry.AddGauge("moetrain_value", "Help."));
  Gauge* gauge = Must(family->WithLabels({}));
  auto written = [&](double v) {
    gauge->Set(v);
    return Parse(registry).Value("moetrain_value").value_or(-12345);
  };
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(written(inf), inf);
  EXPECT_EQ(written(-inf), -inf);
  EXPECT_TRUE(std::isnan(written(std::nan(""))));
  EXPECT_EQ(written(0), 0);
  EXPECT_TRUE(std::signbit(written(-0.0)));
  EXPECT_EQ(written(0.1), 0.1);
  EXPECT_EQ(written(1.0 / 3), 0.3333333333333333);

  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const double integer = static_cast<double>(rng() >> 11);  // below 2^53
    ASSERT_EQ(written(integer), integer);
  }
  std::vector<double> values = {5e-324,
                                2.2250738585072014e-308,
                                1e-4,
                                0.30000000000000004,
                                123456789012345.67,
                                std::numeric_limits<double>::max() / 2};
  std::uniform_real_distribution<double> uniform(-1e6, 1e6);
  for (int i = 0; i < 2000; ++i) values.push_back(uniform(rng));
  for (double v : values) {
    const double parsed = written(v);
    ASSERT_LE(std::fabs(parsed - v), 1e-15 * std::fabs(v)) << v << " came back as " << parsed;
  }
}

TEST(MetricsRegistryTest, CollectorsRunAtEachSerialize) {
  MetricsRegistry registry;
  Family<Gauge>* jobs = Must(registry.AddGauge("moetrain_jobs", "Jobs by state.", {"state"}));
  std::map<std::string, int> store = {{"RUNNING", 2}, {"PENDING", 1}};
  int calls = 0;
  registry.AddCollector([&] {
    ++calls;
    for (const auto& [state, count] : store) Must(jobs->WithLabels({state}))->Set(count);
  });
  EXPECT_EQ(calls, 0);
  Exposition parsed = Parse(registry);
  EXPECT_EQ(parsed.samples,
            (std::vector<ExpositionSample>{{"moetrain_jobs", {{"state", "PENDING"}}, 1},
                                           {"moetrain_jobs", {{"state", "RUNNING"}}, 2}}));
  // Collect alone does not run them.
  EXPECT_EQ(registry.Collect().size(), 1u);
  EXPECT_EQ(calls, 1);
  store["RUNNING"] = 0;
  store["SUCCEEDED"] = 2;
  parsed = Parse(registry);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(parsed.Value("moetrain_jobs", {{"state", "RUNNING"}}), 0);
  EXPECT_EQ(parsed.Value("moetrain_jobs", {{"state", "SUCCEEDED"}}), 2);
}

TEST(MetricsRegistryTest, PromtoolAcceptsTheText) {
  MetricsRegistry registry;
  Family<Counter>* rpcs = Must(registry.AddCounter(
      "moetrain_rpcs_total", "RPCs handled, by method and status code.", {"method", "code"}));
  Must(rpcs->WithLabels({"GetJob", "OK"}))->Increment(3);
  Must(rpcs->WithLabels({"SubmitJob", "INVALID_ARGUMENT"}))->Increment();
  Family<Gauge>* jobs = Must(registry.AddGauge("moetrain_jobs", "Jobs by state.", {"state"}));
  Must(jobs->WithLabels({"RUNNING"}))->Set(2);
  Must(jobs->WithLabels({"weird \"state\"\\\nü"}))->Set(std::nan(""));
  Family<Gauge>* loss = Must(registry.AddGauge("moetrain_train_loss", "Loss.\nMultiline \\ help."));
  Must(loss->WithLabels({}))->Set(-std::numeric_limits<double>::infinity());
  Family<Histogram>* step =
      Must(registry.AddHistogram("moetrain_train_step_duration_seconds", "Wall time of a step.",
                                 {"job"}, ExponentialBuckets(0.001, 4, 8)));
  Histogram* step_a = Must(step->WithLabels({"job-a"}));
  for (double v : {0.0005, 0.004, 0.5, 3.0, 1e9}) step_a->Observe(v);
  Must(step->WithLabels({"job-b"}))->Observe(0.016);
  // Removed children, and a family left with none, leave no trace in the text.
  Must(step->WithLabels({"job-c"}))->Observe(1);
  EXPECT_TRUE(step->Remove({"job-c"}));
  Family<Gauge>* progress = Must(
      registry.AddGauge("moetrain_job_last_progress_timestamp_seconds", "Last progress.", {"job"}));
  Must(progress->WithLabels({"job-c"}))->Set(1.8e9);
  EXPECT_EQ(progress->RemoveWhere("job", "job-c"), 1);

  const std::string text = registry.Serialize();
  EXPECT_EQ(MustParseExposition(text).WithLabel("job", "job-c"), std::vector<ExpositionSample>());
  const absl::StatusOr<PromtoolResult> promtool = PromtoolCheckMetrics(text);
  ASSERT_OK(promtool);
  EXPECT_EQ(promtool->exit_code, 0) << promtool->output << "\nfor:\n" << text;
  EXPECT_EQ(promtool->output, "") << "for:\n" << text;
}

}  // namespace
}  // namespace moetrain::server
