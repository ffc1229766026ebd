// The coordinator's /metrics as Prometheus sees it: a real Prometheus server (Debian's
// `prometheus`) scrapes a real coordinator while a worker trains a job, and a PromQL query for the
// job's trained tokens returns the count the job reported. `promtool check metrics` passes on the
// same /metrics.
#include <httplib.h>

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

// `promtool check metrics` with `text` on stdin: its exit code, and what it printed in `output`.
int PromtoolCheck(const std::string& text, const fs::path& dir, std::string* output) {
  const fs::path printed = dir / "promtool.txt";
  const std::string command = "/usr/bin/promtool check metrics >'" + printed.string() + "' 2>&1";
  FILE* pipe = popen(command.c_str(), "w");
  if (pipe == nullptr) return -1;
  std::fwrite(text.data(), 1, text.size(), pipe);
  const int status = pclose(pipe);
  *output = ReadWholeFile(printed);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

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
        auto response = query.Get("/api/v1/query", httplib::Params{{"query", promql}},
                                  httplib::Headers{});
        if (!response || response->status != 200) return false;
        answer = json::parse(response->body, nullptr, false);
        const json& result = answer["data"]["result"];
        return result.is_array() && result.size() == 1 &&
               std::stod(result[0]["value"][1].get<std::string>()) ==
                   static_cast<double>(reported);
      },
      std::chrono::seconds(60)))
      << promql << " answered " << answer.dump() << "\n" << prometheus.Log();
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
  std::string promtool_output;
  EXPECT_EQ(PromtoolCheck(metrics->body, dir_, &promtool_output), 0) << promtool_output;
  for (const char* name : {"moetrain_train_loss", "moetrain_jobs", "moetrain_workers",
                           "moetrain_rpcs_total", "moetrain_checkpoint_duration_seconds_bucket",
                           "moetrain_train_expert_load_max_over_mean_ratio", "moetrain_train_mfu_ratio"}) {
    EXPECT_THAT(metrics->body, ::testing::HasSubstr(name));
  }
  prometheus.Stop();
}

}  // namespace
}  // namespace moetrain::testutil
