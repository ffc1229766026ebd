// The registry's naming policy, checked at registration: metric names, label names, help text and
// histogram bounds. tests/server/coordinator_server/metric_names_test.cc checks the names the
// coordinator itself registers.
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/http/metrics.h"
#include "tests/testing/exposition.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;
using testutil::MustParseExposition;

TEST(MetricsPolicyTest, RejectsBadNames) {
  MetricsRegistry registry;
  using prometheus::MetricType;
  struct Case {
    const char* name;
    MetricType type;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"moetrain_bad-name_total", MetricType::Counter, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_bad-name_total\" is not a Prometheus metric name "
       "([a-zA-Z_:][a-zA-Z0-9_:]*)"},
      {"9moetrain_total", MetricType::Counter, absl::StatusCode::kInvalidArgument,
       "\"9moetrain_total\" is not a Prometheus metric name"},
      {"", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "\"\" is not a Prometheus metric name"},
      {"moetrain_é", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "is not a Prometheus metric name"},
      {"other_requests_total", MetricType::Counter, absl::StatusCode::kInvalidArgument,
       "metric name \"other_requests_total\" does not start with \"moetrain_\""},
      {"moetrain_requests", MetricType::Counter, absl::StatusCode::kInvalidArgument,
       "counter name \"moetrain_requests\" does not end in \"_total\""},
      {"moetrain_jobs_total", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_jobs_total\" ends in \"_total\""},
      {"moetrain_step_seconds_total", MetricType::Histogram, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_step_seconds_total\" ends in \"_total\", kept for counters"},
      {"moetrain_jobs_count", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_jobs_count\" ends in \"_count\""},
      {"moetrain_step_bucket", MetricType::Histogram, absl::StatusCode::kInvalidArgument,
       "ends in \"_bucket\""},
      {"moetrain_loss_sum", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "ends in \"_sum\""},
      {"moetrain_step_duration_ms", MetricType::Histogram, absl::StatusCode::kInvalidArgument,
       "metric name \"moetrain_step_duration_ms\" has the unit \"ms\": use base units"},
      {"moetrain_wait_minutes_total", MetricType::Counter, absl::StatusCode::kInvalidArgument,
       "has the unit \"minutes\""},
      {"moetrain_memory_MB", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "has the unit \"MB\""},
      {"moetrain_mfu_percent", MetricType::Gauge, absl::StatusCode::kInvalidArgument,
       "has the unit \"percent\""},
      {"moetrain_taken", MetricType::Histogram, absl::StatusCode::kAlreadyExists,
       "metric moetrain_taken is already registered"},
  };
  ASSERT_TRUE(registry.AddGauge("moetrain_taken", "Taken.").ok());
  for (const Case& c : cases) {
    absl::Status status;
    switch (c.type) {
      case MetricType::Counter:
        status = registry.AddCounter(c.name, "Help.").status();
        break;
      case MetricType::Gauge:
        status = registry.AddGauge(c.name, "Help.").status();
        break;
      default:
        status = registry.AddHistogram(c.name, "Help.", {}, {1}).status();
        break;
    }
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.name;
  }
  EXPECT_TRUE(registry.AddGauge("moetrain_job:tokens_per_second", "Colons are allowed.").ok());
  // Unit names inside longer words are not units.
  EXPECT_TRUE(registry.AddGauge("moetrain_status_bytes", "Status.").ok());
  EXPECT_THAT(registry.AddGauge("moetrain_no_help", "").status().message(),
              HasSubstr("metric moetrain_no_help has no help text"));
  EXPECT_THAT(registry.AddGauge("moetrain_bad_help", "\xff").status().message(),
              HasSubstr("help text of metric moetrain_bad_help is not valid UTF-8"));
  // A rejected name stays free.
  EXPECT_FALSE(registry.AddGauge("moetrain_retry", "Help.", {"__x"}).ok());
  EXPECT_TRUE(registry.AddGauge("moetrain_retry", "Help.").ok());
  // Families() lists what was registered, children or not, by name.
  std::vector<std::pair<std::string, prometheus::MetricType>> families;
  for (const FamilyBase* family : registry.Families()) {
    families.emplace_back(family->name(), family->type());
  }
  EXPECT_EQ(families, (std::vector<std::pair<std::string, prometheus::MetricType>>{
                          {"moetrain_job:tokens_per_second", MetricType::Gauge},
                          {"moetrain_retry", MetricType::Gauge},
                          {"moetrain_status_bytes", MetricType::Gauge},
                          {"moetrain_taken", MetricType::Gauge}}));
}

TEST(MetricsPolicyTest, RejectsBadLabelNames) {
  MetricsRegistry registry;
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"bad-label"},
       "label name \"bad-label\" of metric moetrain_x is not a Prometheus label name "
       "([a-zA-Z_][a-zA-Z0-9_]*, not starting with \"__\")"},
      {{"1abc"}, "label name \"1abc\" of metric moetrain_x is not a Prometheus label name"},
      {{""}, "label name \"\" of metric moetrain_x is not a Prometheus label name"},
      {{"job:id"}, "label name \"job:id\" of metric moetrain_x is not a Prometheus label name"},
      {{"__name__"}, "label name \"__name__\" of metric moetrain_x is not a Prometheus label name"},
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

TEST(MetricsPolicyTest, RejectsBadBucketBounds) {
  MetricsRegistry registry;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {1, 1}).status().message(),
              HasSubstr("histogram moetrain_a bucket bound 1 = 1 is not above bound 0 = 1"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {2, 0.5}).status().message(),
              HasSubstr("bucket bound 1 = 0.5 is not above bound 0 = 2"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {std::nan("")}).status().message(),
              HasSubstr("bucket bound 0 = nan is not finite"));
  EXPECT_THAT(registry.AddHistogram("moetrain_a", "Help.", {}, {-inf, 0}).status().message(),
              HasSubstr("bucket bound 0 = -inf is not finite"));
  // A last +Inf is the implicit bucket, written once.
  ASSERT_TRUE(registry.AddHistogram("moetrain_a", "Help.", {}, {-1, 2, inf}).ok());
  EXPECT_EQ(MustParseExposition(registry.Serialize()).Histogram("moetrain_a").buckets,
            (std::map<std::string, double>{{"-1", 0}, {"2", 0}, {"+Inf", 0}}));
  EXPECT_EQ(ExponentialBuckets(0.5, 2, 4), (std::vector<double>{0.5, 1, 2, 4}));
  EXPECT_EQ(LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
}

}  // namespace
}  // namespace moetrain::server
