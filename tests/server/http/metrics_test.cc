#include "server/http/metrics.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

// The value of a StatusOr<T*> from the registry or a family, failing the test on an error.
template <typename T>
T* Must(absl::StatusOr<T*> result) {
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : nullptr;
}

// Sample lines of the text, `name{labels}` to the value as written.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> samples;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    samples[line.substr(0, space)] = line.substr(space + 1);
  }
  return samples;
}

TEST(MetricsRegistryTest, SerializesEachKindExactly) {
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

  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_rpcs_total RPCs handled.\n"
            "# TYPE moetrain_rpcs_total counter\n"
            "moetrain_rpcs_total{method=\"GetJob\",code=\"NOT_FOUND\"} 0.5\n"
            "moetrain_rpcs_total{method=\"GetJob\",code=\"OK\"} 2\n"
            "moetrain_rpcs_total{method=\"SubmitJob\",code=\"OK\"} 1\n"
            "# HELP moetrain_train_learning_rate Learning rate of the last step.\n"
            "# TYPE moetrain_train_learning_rate gauge\n"
            "moetrain_train_learning_rate 0.0003\n"
            "# HELP moetrain_train_step_duration_seconds Wall time of a step.\n"
            "# TYPE moetrain_train_step_duration_seconds histogram\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"a\",le=\"0.25\"} 1\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"a\",le=\"1\"} 2\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"a\",le=\"10\"} 3\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"a\",le=\"+Inf\"} 4\n"
            "moetrain_train_step_duration_seconds_sum{job=\"a\"} 104.0625\n"
            "moetrain_train_step_duration_seconds_count{job=\"a\"} 4\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"b\",le=\"0.25\"} 0\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"b\",le=\"1\"} 0\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"b\",le=\"10\"} 0\n"
            "moetrain_train_step_duration_seconds_bucket{job=\"b\",le=\"+Inf\"} 0\n"
            "moetrain_train_step_duration_seconds_sum{job=\"b\"} 0\n"
            "moetrain_train_step_duration_seconds_count{job=\"b\"} 0\n");
}

TEST(MetricsRegistryTest, UnlabelledFamiliesStartAtZero) {
  MetricsRegistry registry;
  Family<Counter>* restarts = Must(registry.AddCounter("moetrain_restarts_total", "Restarts."));
  Must(registry.AddHistogram("moetrain_checkpoint_duration_seconds", "Checkpoint time.", {}, {1}));
  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_checkpoint_duration_seconds Checkpoint time.\n"
            "# TYPE moetrain_checkpoint_duration_seconds histogram\n"
            "moetrain_checkpoint_duration_seconds_bucket{le=\"1\"} 0\n"
            "moetrain_checkpoint_duration_seconds_bucket{le=\"+Inf\"} 0\n"
            "moetrain_checkpoint_duration_seconds_sum 0\n"
            "moetrain_checkpoint_duration_seconds_count 0\n"
            "# HELP moetrain_restarts_total Restarts.\n"
            "# TYPE moetrain_restarts_total counter\n"
            "moetrain_restarts_total 0\n");
  EXPECT_EQ(Must(restarts->WithLabels({})), Must(restarts->WithLabels({})));
}

TEST(MetricsRegistryTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  Family<Gauge>* gauge = Must(registry.AddGauge(
      "moetrain_escape_test", "Line one\nback\\slash \"quoted\" {braces}", {"path"}));
  Must(gauge->WithLabels({"a\\b\"c\nd"}))->Set(1);
  Must(gauge->WithLabels({"ü€𝄞 ,=}"}))->Set(2);
  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_escape_test Line one\\nback\\\\slash \"quoted\" {braces}\n"
            "# TYPE moetrain_escape_test gauge\n"
            "moetrain_escape_test{path=\"a\\\\b\\\"c\\nd\"} 1\n"
            "moetrain_escape_test{path=\"ü€𝄞 ,=}\"} 2\n");
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
  std::map<std::string, std::string> samples = Samples(registry.Serialize());
  EXPECT_EQ(samples.count("moetrain_restarts_total{job_id=\"job-a\",reason=\"lost\"}"), 0u);
  EXPECT_EQ(samples.at("moetrain_restarts_total{job_id=\"job-a\",reason=\"failed\"}"), "3");
  EXPECT_EQ(samples.at("moetrain_restarts_total{job_id=\"job-b\",reason=\"lost\"}"), "5");

  // Unknown values, a prefix of a child's values, the wrong count and a repeat: nothing happens.
  EXPECT_FALSE(restarts->Remove({"job-a", "lost"}));
  EXPECT_FALSE(restarts->Remove({"job-c", "lost"}));
  EXPECT_FALSE(restarts->Remove({"job-a"}));
  EXPECT_FALSE(restarts->Remove({"job-a", "failed", "extra"}));
  EXPECT_FALSE(restarts->Remove({}));
  // An unlabelled family keeps its one child: others hold its pointer for good.
  EXPECT_FALSE(up->Remove({}));
  EXPECT_EQ(Samples(registry.Serialize()).size(), 3u);

  // A child made again after its removal starts from zero.
  EXPECT_EQ(Must(restarts->WithLabels({"job-a", "lost"}))->Value(), 0);

  // A family left without children is not written at all, not even its HELP and TYPE lines.
  for (const char* reason : {"lost", "failed"}) EXPECT_TRUE(restarts->Remove({"job-a", reason}));
  EXPECT_TRUE(restarts->Remove({"job-b", "lost"}));
  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_up Up.\n# TYPE moetrain_up gauge\nmoetrain_up 0\n");
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
  const std::string text = registry.Serialize();
  EXPECT_THAT(text, ::testing::Not(HasSubstr("job_id=\"job-a\"")));
  const std::map<std::string, std::string> samples = Samples(text);
  for (const char* job : {"job-", "job-a\x01", "job-a2", "job-b"}) {
    const std::string id = absl::StrCat("job_id=\"", job, "\"");
    EXPECT_EQ(samples.count(absl::StrCat("moetrain_load_ratio{", id, ",layer=\"10\"}")), 1u) << job;
    EXPECT_EQ(samples.count(absl::StrCat("moetrain_state{state=\"RUNNING\",", id, "}")), 1u) << job;
    EXPECT_EQ(samples.count(absl::StrCat("moetrain_step_duration_seconds_count{", id, "}")), 1u)
        << job;
  }
  EXPECT_EQ(samples.size(), 4u * (3 + 2 + 5));

  // An unknown value, a label the family does not have, or an unlabelled family: nothing goes.
  EXPECT_EQ(load->RemoveWhere("job_id", "job-a"), 0);
  EXPECT_EQ(load->RemoveWhere("job_id", "job-z"), 0);
  EXPECT_EQ(load->RemoveWhere("state", "RUNNING"), 0);
  Family<Gauge>* up = Must(registry.AddGauge("moetrain_up", "Up."));
  EXPECT_EQ(up->RemoveWhere("job_id", ""), 0);
  EXPECT_EQ(Samples(registry.Serialize()).size(), samples.size() + 1);
  // Through the base class, as a holder of families of mixed types removes them.
  FamilyBase* base = steps;
  EXPECT_EQ(base->RemoveWhere("job_id", "job-b"), 1);
}

TEST(MetricsRegistryTest, CounterIgnoresNegativeAndNan) {
  Counter counter;
  counter.Increment(1.5);
  counter.Increment(-1);
  counter.Increment(std::nan(""));
  counter.Increment(0);
  EXPECT_EQ(counter.Value(), 1.5);
  Gauge gauge;
  gauge.Set(3);
  gauge.Add(-4.5);
  EXPECT_EQ(gauge.Value(), -1.5);
}

TEST(MetricsRegistryTest, RejectsBadNames) {
  MetricsRegistry registry;
  struct Case {
    const char* name;
    MetricType type;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"moetrain_bad-name_total", MetricType::kCounter, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_bad-name_total\" does not match [a-zA-Z_:][a-zA-Z0-9_:]*"},
      {"9moetrain_total", MetricType::kCounter, absl::StatusCode::kInvalidArgument,
       "\"9moetrain_total\" does not match"},
      {"", MetricType::kGauge, absl::StatusCode::kInvalidArgument, "\"\" does not match"},
      {"moetrain_é", MetricType::kGauge, absl::StatusCode::kInvalidArgument, "does not match"},
      {"other_requests_total", MetricType::kCounter, absl::StatusCode::kInvalidArgument,
       "metric name \"other_requests_total\" does not start with \"moetrain_\""},
      {"moetrain_requests", MetricType::kCounter, absl::StatusCode::kInvalidArgument,
       "counter name \"moetrain_requests\" does not end in \"_total\""},
      {"moetrain_jobs_total", MetricType::kGauge, absl::StatusCode::kInvalidArgument,
       "gauge name \"moetrain_jobs_total\" ends in \"_total\""},
      {"moetrain_step_seconds_total", MetricType::kHistogram, absl::StatusCode::kInvalidArgument,
       "histogram name \"moetrain_step_seconds_total\" ends in \"_total\""},
      {"moetrain_jobs_count", MetricType::kGauge, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_jobs_count\" ends in \"_count\""},
      {"moetrain_step_bucket", MetricType::kHistogram, absl::StatusCode::kInvalidArgument,
       "ends in \"_bucket\""},
      {"moetrain_loss_sum", MetricType::kGauge, absl::StatusCode::kInvalidArgument,
       "ends in \"_sum\""},
      {"moetrain_taken", MetricType::kHistogram, absl::StatusCode::kAlreadyExists,
       "metric moetrain_taken is already registered"},
  };
  ASSERT_TRUE(registry.AddGauge("moetrain_taken", "Taken.").ok());
  for (const Case& c : cases) {
    absl::Status status;
    switch (c.type) {
      case MetricType::kCounter:
        status = registry.AddCounter(c.name, "Help.").status();
        break;
      case MetricType::kGauge:
        status = registry.AddGauge(c.name, "Help.").status();
        break;
      case MetricType::kHistogram:
        status = registry.AddHistogram(c.name, "Help.", {}, {1}).status();
        break;
    }
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.name;
  }
  EXPECT_TRUE(registry.AddGauge("moetrain_job:tokens_per_second", "Colons are allowed.").ok());
  EXPECT_THAT(registry.AddGauge("moetrain_no_help", "").status().message(),
              HasSubstr("metric moetrain_no_help has no help text"));
  EXPECT_THAT(registry.AddGauge("moetrain_bad_help", "\xff").status().message(),
              HasSubstr("help text of metric moetrain_bad_help is not valid UTF-8"));
  // A rejected name stays free.
  EXPECT_FALSE(registry.AddGauge("moetrain_retry", "Help.", {"__x"}).ok());
  EXPECT_TRUE(registry.AddGauge("moetrain_retry", "Help.").ok());
}

TEST(MetricsRegistryTest, RejectsBadLabelNames) {
  MetricsRegistry registry;
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"bad-label"}, "label name \"bad-label\" of metric moetrain_x does not match"},
      {{"1abc"}, "label name \"1abc\" of metric moetrain_x does not match"},
      {{""}, "label name \"\" of metric moetrain_x does not match"},
      {{"job:id"}, "label name \"job:id\" of metric moetrain_x does not match"},
      {{"__name__"}, "label name \"__name__\" of metric moetrain_x starts with \"__\""},
      {{"state", "state"}, "label name \"state\" of metric moetrain_x appears twice"},
  };
  for (const auto& [labels, message] : cases) {
    absl::Status status = registry.AddGauge("moetrain_x", "Help.", labels).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
  EXPECT_THAT(registry.AddHistogram("moetrain_h", "Help.", {"le"}, {1}).status().message(),
              HasSubstr("histogram moetrain_h may not have the label \"le\""));
  EXPECT_TRUE(registry.AddGauge("moetrain_x", "Help.", {"_state", "le", "Code9"}).ok());
}

TEST(MetricsRegistryTest, RejectsBadBucketBounds) {
  MetricsRegistry registry;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {1, 1}).status().message(),
              HasSubstr("histogram moetrain_a bucket bound 1 = 1 is not above bound 0 = 1"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {2, 0.5}).status().message(),
              HasSubstr("bucket bound 1 = 0.5 is not above bound 0 = 2"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {std::nan("")}).status().message(),
              HasSubstr("bucket bound 0 = NaN is not finite"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {-inf, 0}).status().message(),
              HasSubstr("bucket bound 0 = -Inf is not finite"));
  // A last +Inf is the implicit bucket, written once.
  Family<Histogram>* h = Must(registry.AddHistogram("moetrain_a", "Help.", {}, {-1, 2, inf}));
  EXPECT_EQ(Must(h->WithLabels({}))->upper_bounds().size(), 2u);
  EXPECT_THAT(registry.Serialize(), HasSubstr("moetrain_a_bucket{le=\"-1\"} 0\n"
                                              "moetrain_a_bucket{le=\"2\"} 0\n"
                                              "moetrain_a_bucket{le=\"+Inf\"} 0\n"));
  EXPECT_EQ(ExponentialBuckets(0.5, 2, 4), (std::vector<double>{0.5, 1, 2, 4}));
  EXPECT_EQ(LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
}

TEST(HistogramTest, ValueOnABoundFallsInThatBucket) {
  MetricsRegistry registry;
  Family<Histogram>* family = Must(registry.AddHistogram("moetrain_h", "Help.", {}, {1, 2, 4}));
  Histogram* h = Must(family->WithLabels({}));
  for (double v : {1.0, 2.0, std::nextafter(1.0, 2.0), 4.0, 4.1, -5.0}) h->Observe(v);
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{2, 2, 1, 1}));
  EXPECT_EQ(h->Sum(), 1.0 + 2.0 + std::nextafter(1.0, 2.0) + 4.0 + 4.1 - 5.0);
  h->Observe(std::nan(""));  // counts only in +Inf
  EXPECT_EQ(h->BucketCounts(), (std::vector<uint64_t>{2, 2, 1, 2}));
  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_h Help.\n"
            "# TYPE moetrain_h histogram\n"
            "moetrain_h_bucket{le=\"1\"} 2\n"
            "moetrain_h_bucket{le=\"2\"} 4\n"
            "moetrain_h_bucket{le=\"4\"} 5\n"
            "moetrain_h_bucket{le=\"+Inf\"} 7\n"
            "moetrain_h_sum NaN\n"
            "moetrain_h_count 7\n");
}

TEST(MetricsRegistryTest, NumbersParseBackExactly) {
  MetricsRegistry registry;
  Family<Gauge>* family = Must(registry.AddGauge("moetrain_value", "Help."));
  Gauge* gauge = Must(family->WithLabels({}));
  auto written = [&](double v) {
    gauge->Set(v);
    return Samples(registry.Serialize()).at("moetrain_value");
  };
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(written(inf), "+Inf");
  EXPECT_EQ(written(-inf), "-Inf");
  EXPECT_EQ(written(std::nan("")), "NaN");
  EXPECT_EQ(written(0), "0");
  EXPECT_EQ(written(-0.0), "-0");
  EXPECT_EQ(written(0.1), "0.1");
  EXPECT_EQ(written(100000), "100000");
  EXPECT_EQ(written(-2.5), "-2.5");
  EXPECT_EQ(written(1e-5), "1e-05");
  EXPECT_EQ(written(1e21), "1e+21");
  EXPECT_EQ(written(9007199254740993.0), "9007199254740992");  // 2^53 + 1 is not a double
  EXPECT_EQ(written(1.0 / 3), "0.3333333333333333");

  std::vector<double> values = {5e-324,
                                2.2250738585072014e-308,
                                std::numeric_limits<double>::max(),
                                -std::numeric_limits<double>::max(),
                                1e-4,
                                std::nextafter(1e-4, 0.0),
                                1e15,
                                std::nextafter(1e15, 0.0),
                                123456789012345.67,
                                0.30000000000000004};
  std::mt19937_64 rng(7);
  while (values.size() < 20000) {
    const uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (std::isfinite(v)) values.push_back(v);
  }
  std::uniform_real_distribution<double> uniform(-1e6, 1e6);
  for (int i = 0; i < 5000; ++i) values.push_back(uniform(rng));
  for (double v : values) {
    const std::string text = written(v);
    const double parsed = std::strtod(text.c_str(), nullptr);
    ASSERT_EQ(std::memcmp(&parsed, &v, sizeof(v)), 0) << text;
  }
  EXPECT_TRUE(std::isnan(std::strtod(written(std::nan("")).c_str(), nullptr)));
  EXPECT_EQ(std::strtod(written(-inf).c_str(), nullptr), -inf);
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
  EXPECT_EQ(registry.Serialize(),
            "# HELP moetrain_jobs Jobs by state.\n"
            "# TYPE moetrain_jobs gauge\n"
            "moetrain_jobs{state=\"PENDING\"} 1\n"
            "moetrain_jobs{state=\"RUNNING\"} 2\n");
  store["RUNNING"] = 0;
  store["SUCCEEDED"] = 2;
  const std::map<std::string, std::string> samples = Samples(registry.Serialize());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(samples.at("moetrain_jobs{state=\"RUNNING\"}"), "0");
  EXPECT_EQ(samples.at("moetrain_jobs{state=\"SUCCEEDED\"}"), "2");
}

// Exact totals from 8 threads on shared, private and contended-to-create children, with scrapes
// running alongside. Run under -fsanitize=thread when the locking changes.
TEST(MetricsRegistryTest, ConcurrentUpdatesGiveExactTotals) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 100000;
  constexpr int kKeys = 1000;
  MetricsRegistry registry;
  Family<Counter>* counters =
      Must(registry.AddCounter("moetrain_events_total", "Events.", {"thread"}));
  Family<Counter>* keyed = Must(registry.AddCounter("moetrain_keyed_total", "Keyed.", {"key"}));
  Family<Gauge>* gauges = Must(registry.AddGauge("moetrain_level", "Level."));
  Family<Histogram>* histograms =
      Must(registry.AddHistogram("moetrain_sizes_bytes", "Sizes.", {}, {0.5, 1}));

  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_FALSE(registry.Serialize().empty());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* shared = Must(counters->WithLabels({"shared"}));
      Gauge* level = Must(gauges->WithLabels({}));
      Histogram* sizes = Must(histograms->WithLabels({}));
      const std::string own = std::to_string(t);
      for (int i = 0; i < kIterations; ++i) {
        shared->Increment();
        Must(counters->WithLabels({own}))->Increment();
        Must(keyed->WithLabels({std::to_string(i % kKeys)}))->Increment();
        level->Add(1);
        sizes->Observe((i % 4) * 0.5);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.store(true);
  scraper.join();

  EXPECT_EQ(Must(counters->WithLabels({"shared"}))->Value(), kThreads * kIterations);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(Must(counters->WithLabels({std::to_string(t)}))->Value(), kIterations);
  }
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_EQ(Must(keyed->WithLabels({std::to_string(k)}))->Value(),
              kThreads * kIterations / kKeys);
  }
  EXPECT_EQ(Must(gauges->WithLabels({}))->Value(), kThreads * kIterations);
  Histogram* sizes = Must(histograms->WithLabels({}));
  const uint64_t quarter = kThreads * kIterations / 4;
  EXPECT_EQ(sizes->BucketCounts(), (std::vector<uint64_t>{2 * quarter, quarter, quarter}));
  EXPECT_EQ(sizes->Sum(), quarter * (0 + 0.5 + 1 + 1.5));
  const std::map<std::string, std::string> samples = Samples(registry.Serialize());
  EXPECT_EQ(samples.at("moetrain_events_total{thread=\"shared\"}"), "800000");
  EXPECT_EQ(samples.at("moetrain_sizes_bytes_count"), "800000");
  EXPECT_EQ(samples.size(), 1u + kThreads + kKeys + 1 + 5);
}

// Children made, updated and removed by many threads at once while scrapes run: the children
// that stay keep exact totals and the removed ones are gone. Each thread removes only children it
// made itself, since a removed child's pointer dangles. Run under -fsanitize=thread when the
// locking changes.
TEST(MetricsRegistryTest, ConcurrentAddAndRemoveKeepTheOtherChildrenExact) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  MetricsRegistry registry;
  Family<Counter>* events =
      Must(registry.AddCounter("moetrain_events_total", "Events.", {"job_id", "kind"}));
  Family<Histogram>* sizes =
      Must(registry.AddHistogram("moetrain_sizes_bytes", "Sizes.", {"job_id"}, {0.5, 1}));

  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      for (const auto& [series, value] : Samples(registry.Serialize())) {
        EXPECT_THAT(series, ::testing::Not(HasSubstr("gone"))) << "a removed series was written";
        if (series.rfind("moetrain_events_total{job_id=\"short-lived", 0) == 0) {
          EXPECT_TRUE(value == "0" || value == "1") << series << " " << value;
        }
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string kept = absl::StrCat("kept-", t);
      const std::string short_lived = absl::StrCat("short-lived-", t);
      for (int i = 0; i < kIterations; ++i) {
        Must(events->WithLabels({kept, "step"}))->Increment();
        Must(events->WithLabels({"shared", "step"}))->Increment();
        Must(sizes->WithLabels({kept}))->Observe(0.25);
        // Made, counted once, removed: written as 0 or 1, or not at all.
        Must(events->WithLabels({short_lived, "step"}))->Increment();
        Must(events->WithLabels({short_lived, "checkpoint"}))->Increment();
        Must(sizes->WithLabels({short_lived}))->Observe(2);
        EXPECT_TRUE(events->Remove({short_lived, "checkpoint"}));
        EXPECT_EQ(events->RemoveWhere("job_id", short_lived), 1);
        EXPECT_EQ(sizes->RemoveWhere("job_id", short_lived), 1);
        // Removing what was never there, while others add and remove, is harmless.
        EXPECT_FALSE(events->Remove({"gone", "step"}));
        EXPECT_EQ(sizes->RemoveWhere("job_id", "gone"), 0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.store(true);
  scraper.join();

  const std::map<std::string, std::string> samples = Samples(registry.Serialize());
  EXPECT_EQ(samples.at("moetrain_events_total{job_id=\"shared\",kind=\"step\"}"),
            std::to_string(kThreads * kIterations));
  for (int t = 0; t < kThreads; ++t) {
    const std::string id = absl::StrCat("job_id=\"kept-", t, "\"");
    EXPECT_EQ(samples.at(absl::StrCat("moetrain_events_total{", id, ",kind=\"step\"}")),
              std::to_string(kIterations));
    EXPECT_EQ(samples.at(absl::StrCat("moetrain_sizes_bytes_count{", id, "}")),
              std::to_string(kIterations));
  }
  // shared + kThreads kept counters, kThreads kept histograms of 3 buckets, sum and count.
  EXPECT_EQ(samples.size(), 1u + kThreads + kThreads * 5);
}

// Runs `promtool check metrics` with `text` on its stdin; its stdout and stderr go to `output`.
int RunPromtool(const std::string& text, std::string* output) {
  const std::string output_path = ::testing::TempDir() + "/promtool_output.txt";
  const std::string command = "/usr/bin/promtool check metrics >'" + output_path + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "w");
  if (pipe == nullptr) return -1;
  std::fwrite(text.data(), 1, text.size(), pipe);
  const int status = pclose(pipe);
  std::ifstream file(output_path);
  std::stringstream contents;
  contents << file.rdbuf();
  *output = contents.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(MetricsRegistryTest, PromtoolAcceptsTheText) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/promtool not found: install Debian's prometheus package "
                    "(scripts/setup.sh does)";
  }
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
  std::string output;
  EXPECT_EQ(RunPromtool(text, &output), 0) << output << "\nfor:\n" << text;
  EXPECT_EQ(output, "") << "for:\n" << text;
}

}  // namespace
}  // namespace moetrain::server
