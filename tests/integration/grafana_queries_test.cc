// The Grafana dashboard (deploy/grafana/moetrain-fleet.json) and the Prometheus rules
// (deploy/prometheus/rules.yml), read from the source tree, against the real thing: a real
// Prometheus loads the rules and scrapes a real coordinator, and the worker's own /metrics
// (--metrics-listen), every second while that real worker trains a job with evaluations and
// checkpoints. Then every panel target, the job variable's query and every recording rule go
// through Prometheus' HTTP API, and each must answer with at least one finite sample: no panel or
// rule names a metric or a label value the service does not export. The FP8 panels (those reading
// moetrain_job_fp8_*) are asked about a second, short job that trains in FP8 on a second worker,
// the only kind of job that has those series.
//
// Alerts cannot be held to that: on a healthy job their expressions must answer nothing, and the
// test checks that they do. What it asks of an alert instead is that Prometheus loaded it (health
// "ok" once evaluated) and that every vector selector in its expression selects at least one
// series, so that the alert watches series that exist. A vector selector here is a metric name
// starting `moetrain_` (or `up`) with the label matchers that follow it; the rules use no other
// metric names, and the test fails if an alert has no selector at all.
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

const fs::path kDashboard = fs::path(MOETRAIN_SOURCE_DIR) / "deploy/grafana/moetrain-fleet.json";
const fs::path kRules = fs::path(MOETRAIN_SOURCE_DIR) / "deploy/prometheus/rules.yml";

// Grafana's variables, as the test stands in for them: the job is the test's own; the rate
// interval is at least four scrape intervals in Grafana, and a minute covers every sample.
std::string Substitute(const std::string& expr, const std::string& job_id) {
  return absl::StrReplaceAll(expr, {{"${job}", job_id},
                                    {"$job", job_id},
                                    {"$__rate_interval", "1m"},
                                    {"$__interval", "15s"},
                                    {"$__range", "1h"}});
}

struct Query {
  std::string where;  // "panel 12 \"Loss\" A", "record ...", "alert ... selector"
  std::string expr;   // with the variables substituted
};

// A query's answer, and the line the test prints for it.
struct Answer {
  size_t series = 0;
  size_t finite = 0;  // samples that are neither NaN nor infinite
  std::string example;
};

// Runs an instant query; nullopt when Prometheus refuses it (the reason in `error`).
std::optional<Answer> RunQuery(httplib::Client& prometheus, const std::string& expr,
                               std::string* error) {
  const json data = PrometheusApi(prometheus, "/api/v1/query", {{"query", expr}}, error);
  if (data.is_null()) return std::nullopt;
  Answer answer;
  const json& result = data["result"];
  if (data.value("resultType", "") == "scalar") {
    answer.series = 1;
    answer.finite = std::isfinite(std::stod(result[1].get<std::string>())) ? 1 : 0;
    answer.example = result[1].get<std::string>();
    return answer;
  }
  answer.series = result.size();
  for (const json& sample : result) {
    const std::string value = sample["value"][1].get<std::string>();
    if (std::isfinite(std::stod(value))) ++answer.finite;
    if (answer.example.empty()) {
      std::vector<std::string> labels;
      for (const auto& [name, label] : sample["metric"].items()) {
        if (name != "instance" && name != "job") {
          labels.push_back(absl::StrCat(name, "=", label.get<std::string>()));
        }
      }
      answer.example = absl::StrCat("{", absl::StrJoin(labels, ","), "} = ", value);
    }
  }
  return answer;
}

// Every vector selector of a rule expression (see the file comment).
std::vector<std::string> VectorSelectors(const std::string& expr) {
  static const std::regex kSelector(R"(\b(moetrain_[A-Za-z0-9_]+|up)\b(\{[^}]*\})?)");
  std::set<std::string> found;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), kSelector);
       it != std::sregex_iterator(); ++it) {
    found.insert(it->str());
  }
  return {found.begin(), found.end()};
}

// The dashboard's panels, rows' nested panels included.
std::vector<json> AllPanels(const json& dashboard) {
  std::vector<json> panels;
  for (const json& panel : dashboard["panels"]) {
    panels.push_back(panel);
    for (const json& nested : panel.value("panels", json::array())) panels.push_back(nested);
  }
  return panels;
}

const json* Variable(const json& dashboard, const std::string& name) {
  for (const json& variable : dashboard["templating"]["list"]) {
    if (variable.value("name", "") == name) return &variable;
  }
  return nullptr;
}

TEST(GrafanaDashboardTest, IsWellFormed) {
  const json dashboard = json::parse(ReadWholeFile(kDashboard), nullptr, false);
  ASSERT_TRUE(dashboard.is_object()) << kDashboard << " is not JSON";
  EXPECT_GE(dashboard.value("schemaVersion", 0), 36);
  EXPECT_FALSE(dashboard.value("uid", "").empty());

  const json* datasource = Variable(dashboard, "datasource");
  ASSERT_NE(datasource, nullptr);
  EXPECT_EQ(datasource->value("type", ""), "datasource");
  EXPECT_EQ(datasource->value("query", ""), "prometheus");
  const json* job = Variable(dashboard, "job");
  ASSERT_NE(job, nullptr);
  EXPECT_EQ(job->value("type", ""), "query");
  EXPECT_EQ((*job)["datasource"].value("uid", ""), "${datasource}");

  std::set<int> ids;
  int targets = 0;
  for (const json& panel : AllPanels(dashboard)) {
    const int id = panel.value("id", -1);
    const std::string title = panel.value("title", "");
    EXPECT_TRUE(ids.insert(id).second) << "panel id " << id << " (" << title << ") repeats";
    EXPECT_FALSE(title.empty()) << "panel " << id;
    const json& grid = panel["gridPos"];
    EXPECT_LE(grid.value("x", 99) + grid.value("w", 99), 24) << "panel " << id << " " << title;
    if (panel.value("type", "") == "row") continue;
    EXPECT_EQ(panel["datasource"].value("uid", ""), "${datasource}") << "panel " << id;
    ASSERT_TRUE(panel.contains("targets") && !panel["targets"].empty()) << "panel " << id;
    std::set<std::string> refs;
    for (const json& target : panel["targets"]) {
      ++targets;
      EXPECT_TRUE(refs.insert(target.value("refId", "")).second) << "panel " << id;
      EXPECT_EQ(target["datasource"].value("uid", ""), "${datasource}") << "panel " << id;
      const std::string expr = Substitute(target.value("expr", ""), "job-x");
      EXPECT_FALSE(expr.empty()) << "panel " << id;
      EXPECT_EQ(expr.find('$'), std::string::npos)
          << "panel " << id << " uses a variable the dashboard does not define: " << expr;
    }
  }
  EXPECT_GE(targets, 20);
}

class GrafanaQueriesTest : public ServiceTest {};

TEST_F(GrafanaQueriesTest, EveryPanelAndRuleAnswersWithDataOfARealJob) {
  const json dashboard = json::parse(ReadWholeFile(kDashboard), nullptr, false);
  ASSERT_TRUE(dashboard.is_object());
  // The rule names in the file, to see that Prometheus loaded them all.
  std::set<std::string> rule_names;
  const std::regex kRuleLine(R"(\s*- (record|alert): *(\S+)\s*)");
  for (absl::string_view line : absl::StrSplit(ReadWholeFile(kRules), '\n')) {
    std::smatch match;
    const std::string text(line);
    if (std::regex_match(text, match, kRuleLine)) rule_names.insert(match[2]);
  }
  ASSERT_GE(rule_names.size(), 8u);

  StartCoordinator();
  const int worker_metrics_port = FreePort();
  StartWorker("w1", {"--metrics-listen", absl::StrCat("127.0.0.1:", worker_metrics_port)});
  Daemon prometheus;
  const int port = StartPrometheus(prometheus, dir_,
                                   absl::StrCat(R"(global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - ')",
                                                kRules.string(), R"('
scrape_configs:
  - job_name: moetrain-coordinator
    static_configs:
      - targets: ['127.0.0.1:)",
                                                http_port_, R"(']
  - job_name: moetrain-worker
    static_configs:
      - targets: ['127.0.0.1:)",
                                                worker_metrics_port, R"(']
)"));
  ASSERT_NE(port, 0);
  httplib::Client api("127.0.0.1", port);

  // Long enough to still be RUNNING when the queries are done (about 1.5 ms a step); it reports
  // every 50 steps, evaluates every 500 and checkpoints every 1000 (about 1.5 s).
  TinySpec spec = ServiceSpec("grafana-tiny");
  spec.steps = 100000;
  spec.log_every = 50;
  spec.eval_every = 500;
  spec.checkpoint_every = 1000;
  spec.keep_last = 2;
  const std::string id = Submit(spec);
  ASSERT_FALSE(id.empty());
  // The FP8 panels read series that only a job training in FP8 has: a short one, on a second
  // worker. Its series stay on /metrics after it ends (--metrics-retention).
  StartWorker("w2");
  TinySpec fp8_spec = ServiceSpec("grafana-fp8");
  fp8_spec.steps = 20;
  fp8_spec.checkpoint_every = 10;
  fp8_spec.train_extra = "  precision: FP8\n  fp8:\n    recipe: CURRENT\n";
  const std::string fp8_id = Submit(fp8_spec);
  ASSERT_FALSE(fp8_id.empty());
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> job = GetJob(id);
        return job.has_value() && job->state() == v1::JOB_STATE_RUNNING &&
               job->latest_checkpoint_step() >= 2000;
      },
      std::chrono::seconds(120)))
      << "the job did not checkpoint twice:\n"
      << coordinator_->Log();

  std::vector<Query> must_answer;
  for (const json& panel : AllPanels(dashboard)) {
    for (const json& target : panel.value("targets", json::array())) {
      const std::string expr = target.value("expr", "");
      const bool fp8 = expr.find("moetrain_job_fp8_") != std::string::npos;
      must_answer.push_back(
          {absl::StrCat("panel ", panel.value("id", 0), " \"", panel.value("title", ""), "\" ",
                        target.value("refId", ""), fp8 ? " (the FP8 job)" : ""),
           Substitute(expr, fp8 ? fp8_id : id)});
    }
  }
  // The job variable: a query_result whose regex makes the job id the value and the name the
  // text of each option.
  const json& job_variable = *Variable(dashboard, "job");
  const std::string definition = job_variable.value("definition", "");
  absl::string_view inner = definition;
  ASSERT_TRUE(absl::ConsumePrefix(&inner, "query_result(") && absl::ConsumeSuffix(&inner, ")"))
      << job_variable.dump();
  const std::string variable_query = Substitute(std::string(inner), id);
  must_answer.push_back({"variable job", variable_query});

  // The rules as Prometheus loaded them, once every one has been evaluated.
  json groups;
  ASSERT_TRUE(WaitUntil(
      [&] {
        groups = PrometheusApi(api, "/api/v1/rules", {})["groups"];
        size_t evaluated = 0;
        for (const json& group : groups) {
          for (const json& rule : group["rules"]) evaluated += rule.value("health", "") == "ok";
        }
        return evaluated == rule_names.size();
      },
      std::chrono::seconds(60)))
      << groups.dump(1) << "\n"
      << prometheus.Log();
  std::vector<Query> alerts;  // whole expressions, which must answer nothing
  std::set<std::string> loaded;
  for (const json& group : groups) {
    for (const json& rule : group["rules"]) {
      const std::string name = rule.value("name", "");
      const std::string expr = rule.value("query", "");
      loaded.insert(name);
      EXPECT_EQ(rule.value("lastError", ""), "") << name;
      if (rule.value("type", "") == "recording") {
        must_answer.push_back({absl::StrCat("record ", name), expr});
        continue;
      }
      alerts.push_back({absl::StrCat("alert ", name), expr});
      const std::vector<std::string> selectors = VectorSelectors(expr);
      EXPECT_FALSE(selectors.empty()) << name << ": " << expr;
      for (const std::string& selector : selectors) {
        must_answer.push_back({absl::StrCat("alert ", name, " selector"), selector});
      }
    }
  }
  EXPECT_EQ(loaded, rule_names);

  // Rates need two scrapes inside the minute, quantiles a rise of some bucket: wait until every
  // query answers, then check and print each one.
  auto answers_with_data = [&](const Query& query) {
    std::optional<Answer> answer = RunQuery(api, query.expr, nullptr);
    return answer.has_value() && answer->finite > 0;
  };
  WaitUntil([&] { return std::all_of(must_answer.begin(), must_answer.end(), answers_with_data); },
            std::chrono::seconds(60));
  for (const Query& query : must_answer) {
    std::string error;
    std::optional<Answer> answer = RunQuery(api, query.expr, &error);
    ASSERT_TRUE(answer.has_value()) << query.where << ": " << query.expr << ": " << error;
    std::printf("%-62s %zu series, %s    %s\n", query.where.c_str(), answer->series,
                answer->example.c_str(), query.expr.c_str());
    EXPECT_GT(answer->finite, 0u) << query.where << " has no data: " << query.expr;
  }
  // A healthy job trips no alert.
  for (const Query& alert : alerts) {
    std::string error;
    std::optional<Answer> answer = RunQuery(api, alert.expr, &error);
    ASSERT_TRUE(answer.has_value()) << alert.where << ": " << error;
    std::printf("%-62s %zu series (silent on a healthy job)\n", alert.where.c_str(),
                answer->series);
    EXPECT_EQ(answer->series, 0u) << alert.where << " fires: " << answer->example;
  }

  // The variable's options, formatted as Grafana formats a query_result line, through its regex
  // (std::regex has no named groups: the names are read off in order).
  const std::string regex = job_variable.value("regex", "");
  absl::string_view pattern = regex;
  ASSERT_TRUE(absl::ConsumePrefix(&pattern, "/") && absl::ConsumeSuffix(&pattern, "/")) << regex;
  const size_t value_group = pattern.find("(?<value>") < pattern.find("(?<text>") ? 1 : 2;
  const std::regex option_regex(
      absl::StrReplaceAll(pattern, {{"(?<value>", "("}, {"(?<text>", "("}}));
  const json data = PrometheusApi(api, "/api/v1/query", {{"query", variable_query}});
  bool listed = false;
  for (const json& sample : data["result"]) {
    std::vector<std::string> labels;
    for (const auto& [name, value] : sample["metric"].items()) {
      labels.push_back(absl::StrCat(name, "=\"", value.get<std::string>(), "\""));
    }
    const std::string line =
        absl::StrCat(sample["metric"].value("__name__", ""), "{", absl::StrJoin(labels, ","), "} ",
                     sample["value"][1].get<std::string>(), " 0");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(line, match, option_regex)) << line;
    const std::string value = match[value_group], text = match[3 - value_group];
    std::printf("variable job option: text %s, value %s\n", text.c_str(), value.c_str());
    if (value == id) {
      listed = true;
      EXPECT_EQ(text, "grafana-tiny");
    }
  }
  EXPECT_TRUE(listed) << "the job variable does not offer " << id << ": " << data.dump();
  prometheus.Stop();
}

}  // namespace
}  // namespace moetrain::testutil
