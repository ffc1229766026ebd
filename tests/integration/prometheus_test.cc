// The coordinator's /metrics as Prometheus sees it: a real Prometheus server (Debian's
// `prometheus`) scrapes a real coordinator while a worker trains a job, and a PromQL query for the
// job's trained tokens returns the count the job reported. `promtool check metrics` passes on the
// same /metrics, and the text parses back to the families and values the coordinator registered.
#include <httplib.h>

#include <cstdio>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

TEST_F(ServiceTest, PrometheusScrapesTheTokensTheJobReported) {
  StartCoordinator();
  StartWorker("w1");

  Daemon prometheus;
  const int prometheus_port = StartPrometheus(prometheus, dir_,
                                              absl::StrCat(R"(global:
  scrape_interval: 1s
scrape_configs:
  - job_name: moetrain
    static_configs:
      - targets: ['127.0.0.1:)",
                                                           http_port_, R"(']
)"));
  ASSERT_NE(prometheus_port, 0);
  httplib::Client query("127.0.0.1", prometheus_port);

  TinySpec job = ServiceSpec();
  job.steps = 200;
  job.log_every = 10;
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED)) << coordinator_->Log();
  const int64_t reported = GetJob(id)->last_metrics().tokens_seen();
  ASSERT_EQ(reported, 200 * 4 * 32);

  // Scraped every second: the query sees the final count within a few scrapes.
  const std::string promql = absl::StrCat("moetrain_train_tokens_total{job_id=\"", id, "\"}");
  json answer;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto response =
            query.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
        if (!response || response->status != 200) return false;
        answer = json::parse(response->body, nullptr, false);
        const json& result = answer["data"]["result"];
        return result.is_array() && result.size() == 1 &&
               std::stod(result[0]["value"][1].get<std::string>()) == static_cast<double>(reported);
      },
      std::chrono::seconds(60)))
      << promql << " answered " << answer.dump() << "\n"
      << prometheus.Log();
  std::printf("PromQL %s = %s (the job reported %lld tokens)\n", promql.c_str(),
              answer["data"]["result"][0]["value"][1].get<std::string>().c_str(),
              static_cast<long long>(reported));
  // The scrape target is healthy, and the step-time histogram has data for the job too.
  auto histogram = query.Get(
      "/api/v1/query",
      httplib::Params{{"query", absl::StrCat("moetrain_train_step_duration_seconds_count{job_id=\"",
                                             id, "\"}")}},
      httplib::Headers{});
  ASSERT_TRUE(histogram);
  EXPECT_EQ(json::parse(histogram->body)["data"]["result"].size(), 1u) << histogram->body;

  httplib::Client coordinator("127.0.0.1", http_port_);
  auto metrics = coordinator.Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  ASSERT_OK_AND_ASSIGN(const PromtoolResult promtool, PromtoolCheckMetrics(metrics->body));
  EXPECT_EQ(promtool.exit_code, 0) << promtool.output;
  EXPECT_EQ(promtool.output, "");
  // Read as Prometheus reads it, not as text: the families have their types, and a counter is
  // written under its registered name (prometheus-cpp adds no second "_total").
  const Exposition scraped = MustParseExposition(metrics->body);
  for (const auto& [name, type] : std::map<std::string, std::string>{
           {"moetrain_train_loss", "gauge"},
           {"moetrain_jobs", "gauge"},
           {"moetrain_workers", "gauge"},
           {"moetrain_rpcs_total", "counter"},
           {"moetrain_train_tokens_total", "counter"},
           {"moetrain_checkpoint_duration_seconds", "histogram"},
           {"moetrain_train_expert_load_max_over_mean_ratio", "gauge"},
           {"moetrain_train_mfu_ratio", "gauge"}}) {
    EXPECT_EQ(scraped.TypeOf(name), type) << name;
  }
  EXPECT_EQ(scraped.Value("moetrain_train_tokens_total", {{"job_id", id}}),
            static_cast<double>(reported));
  prometheus.Stop();
}

}  // namespace
}  // namespace moetrain::testutil
