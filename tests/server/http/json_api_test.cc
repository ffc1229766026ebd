// The JSON API and the dashboard page behind a real HttpServer on 127.0.0.1 (ephemeral port),
// over a real Coordinator and Fleet on a SQLite store in a fresh directory, called over HTTP.
#include "server/http/json_api.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.pb.h"
#include "moetrain/v1/job_spec.h"
#include "nlohmann/json.hpp"
#include "server/core/readiness.h"
#include "server/http/dashboard_page.h"
#include "server/http/http_server.h"
#include "server/http/metrics.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kHost[] = "127.0.0.1";
constexpr char kToken[] = "dashboard-test-token";

v1::JobSpec Spec(const std::string& name, int steps) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml(absl::StrCat("name: ", name, "\ntrain:\n  steps: ", steps, "\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// A report of `step` with one value per field, so that each can be told apart in the answer.
v1::StepMetrics Report(int64_t step, std::optional<double> eval_loss = std::nullopt) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_loss(3.0 - 0.01 * step);
  if (eval_loss.has_value()) m.set_eval_loss(*eval_loss);
  m.set_lr(1e-3);
  m.set_grad_norm(0.5);
  m.set_tokens_per_s(1000.0 + step);
  m.set_mfu(0.25);
  m.set_device_memory_bytes(step << 20);
  m.set_device_memory_peak_bytes(int64_t{7} << 30);
  m.set_tokens_seen(step * 128);
  m.set_expert_load_max_over_mean(1.5);
  m.add_expert_load_per_layer(1.5);
  m.add_expert_load_per_layer(1.25);
  // 2 MoE layers × 4 experts; every row sums to 128 × top-2.
  for (int64_t count : {96, 64, 48, 48, 80, 64, 64, 48}) m.add_expert_tokens(count + step % 2);
  return m;
}

class JsonApiTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(kToken); }

  // The whole stack with `token` ("" = none).
  void Build(const std::string& token) {
    TearDown();
    dir_ = std::make_unique<testutil::TempDir>("json_api_test");
    ASSERT_OK_AND_ASSIGN(store_, Store::Open((dir_->path() / "coordinator.db").string()));
    coordinator_ = std::make_unique<Coordinator>(store_.get());
    FleetOptions fleet_options;
    fleet_options.checkpoint_dir = (dir_->path() / "checkpoints").string();
    ASSERT_OK_AND_ASSIGN(fleet_,
                         Fleet::Create(store_.get(), coordinator_.get(), nullptr, fleet_options));
    registry_ = std::make_unique<MetricsRegistry>();
    readiness_ = std::make_unique<Readiness>();
    api_ = std::make_unique<JsonApi>(coordinator_.get(), fleet_.get(), token);
    page_ = std::make_unique<DashboardPage>(!token.empty());
    ASSERT_OK_AND_ASSIGN(http_, HttpServer::Create({.host = kHost,
                                                    .port = 0,
                                                    .handlers = {page_.get(), api_.get()},
                                                    .registry = registry_.get(),
                                                    .readiness = readiness_.get()}));
    ASSERT_OK(http_->Start());
  }

  void TearDown() override {
    if (http_ != nullptr) http_->Stop();
    http_.reset();
    page_.reset();
    api_.reset();
    if (coordinator_ != nullptr) coordinator_->Shutdown();
    fleet_.reset();
    coordinator_.reset();
    store_.reset();
    dir_.reset();  // after the store has closed its database there
  }

  httplib::Result Get(const std::string& path, const std::string& authorization) {
    httplib::Client client(kHost, http_->port());
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    httplib::Headers headers;
    if (!authorization.empty()) headers.emplace("Authorization", authorization);
    return client.Get(path, headers);
  }

  // GET with the token; the body as JSON, expecting `code`.
  Json GetJson(const std::string& path, int code = 200) {
    httplib::Result result = Get(path, absl::StrCat("Bearer ", kToken));
    EXPECT_TRUE(result) << path << ": " << httplib::to_string(result.error());
    if (!result) return nullptr;
    EXPECT_EQ(result->status, code) << path << ": " << result->body;
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json; charset=utf-8");
    Json body = Json::parse(result->body, nullptr, false);
    EXPECT_FALSE(body.is_discarded()) << result->body;
    return body;
  }

  std::string MustSubmit(const std::string& name, int steps) {
    absl::StatusOr<JobRecord> job =
        coordinator_->Submit(absl::StrCat("submission-", name), Spec(name, steps), 0);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  }

  void Record(const std::string& job_id, const v1::StepMetrics& metrics) {
    ASSERT_OK(coordinator_->RecordStepMetrics(job_id, 1, metrics));
  }

  std::unique_ptr<testutil::TempDir> dir_;  // a fresh one for each Build
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<MetricsRegistry> registry_;
  std::unique_ptr<Readiness> readiness_;
  std::unique_ptr<JsonApi> api_;
  std::unique_ptr<DashboardPage> page_;
  std::unique_ptr<HttpServer> http_;
};

TEST_F(JsonApiTest, ListsJobsWithTheirNewestReportAndEvaluation) {
  const std::string trained = MustSubmit("trained", 100);
  const std::string waiting = MustSubmit("waiting", 50);
  Record(trained, Report(10, 2.75));
  Record(trained, Report(20));  // no evaluation: the list keeps step 10's

  const Json body = GetJson("/api/v1/jobs");
  ASSERT_EQ(body["jobs"].size(), 2u) << body.dump();
  EXPECT_EQ(body["next_page_token"], "");
  const Json& first = body["jobs"][0];
  EXPECT_EQ(first["id"], trained);
  EXPECT_EQ(first["name"], "trained");
  EXPECT_EQ(first["state"], "PENDING");
  EXPECT_EQ(first["step"], 20);
  EXPECT_EQ(first["total_steps"], 100);
  EXPECT_DOUBLE_EQ(first["progress"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(first["loss"].get<double>(), 3.0 - 0.2);
  EXPECT_DOUBLE_EQ(first["eval_loss"].get<double>(), 2.75);
  EXPECT_EQ(first["eval_step"], 10);
  EXPECT_DOUBLE_EQ(first["tokens_per_s"].get<double>(), 1020.0);
  EXPECT_EQ(first["tokens_seen"], 20 * 128);
  EXPECT_DOUBLE_EQ(first["mfu"].get<double>(), 0.25);
  EXPECT_EQ(first["attempt"], 0);
  EXPECT_EQ(first["restarts"], 0);
  EXPECT_EQ(first["workers"], 1);
  EXPECT_TRUE(first["latest_checkpoint_step"].is_null());
  EXPECT_TRUE(std::regex_match(first["create_time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << first["create_time"];
  const Json& second = body["jobs"][1];
  EXPECT_EQ(second["id"], waiting);
  EXPECT_EQ(second["step"], 0);
  EXPECT_EQ(second["total_steps"], 50);
  EXPECT_TRUE(second["loss"].is_null());
  EXPECT_TRUE(second["eval_loss"].is_null());
  EXPECT_TRUE(second["tokens_per_s"].is_null());

  // A newer evaluation replaces the older one (the scan goes on from where it stopped).
  Record(trained, Report(30, 2.5));
  EXPECT_DOUBLE_EQ(GetJson("/api/v1/jobs")["jobs"][0]["eval_loss"].get<double>(), 2.5);

  // Filtered by state, one page at a time.
  EXPECT_EQ(GetJson("/api/v1/jobs?state=RUNNING,SUCCEEDED")["jobs"].size(), 0u);
  const Json page = GetJson("/api/v1/jobs?state=PENDING&page_size=1");
  ASSERT_EQ(page["jobs"].size(), 1u);
  EXPECT_NE(page["next_page_token"], "");
  const Json rest = GetJson(absl::StrCat("/api/v1/jobs?page_size=1&state=PENDING&page_token=",
                                         page["next_page_token"].get<std::string>()));
  ASSERT_EQ(rest["jobs"].size(), 1u);
  EXPECT_EQ(rest["jobs"][0]["id"], waiting);
}

TEST_F(JsonApiTest, OneJobCarriesItsSpecAndNewestReport) {
  const std::string id = MustSubmit("described", 70);
  Record(id, Report(7, 2.9));
  const Json body = GetJson(absl::StrCat("/api/v1/jobs/", id));
  const Json& job = body["job"];
  EXPECT_EQ(job["id"], id);
  EXPECT_EQ(job["state"], "PENDING");
  // The stored spec, defaults applied, in the proto JSON mapping with the proto's field names.
  EXPECT_EQ(job["spec"]["name"], "described");
  EXPECT_EQ(job["spec"]["train"]["steps"], "70");  // int64 is a string in that mapping
  EXPECT_TRUE(job["spec"]["model"]["moe"].contains("num_experts")) << job["spec"].dump();
  EXPECT_EQ(job["last_metrics"]["step"], 7);
  EXPECT_DOUBLE_EQ(job["last_metrics"]["eval_loss"].get<double>(), 2.9);
  EXPECT_EQ(job["last_metrics"]["expert_load_per_layer"], Json({1.5, 1.25}));

  const Json unreported = GetJson(absl::StrCat("/api/v1/jobs/", MustSubmit("fresh", 5)));
  EXPECT_TRUE(unreported["job"]["last_metrics"].is_null());
}

TEST_F(JsonApiTest, MetricsAreReadIncrementally) {
  const std::string id = MustSubmit("curves", 100);
  Record(id, Report(1));
  ASSERT_OK(coordinator_->AppendEvent(id, kLogEventKind, "a log line is not a point"));
  Record(id, Report(2, 2.8));
  Record(id, Report(3));

  const Json all = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics"));
  EXPECT_EQ(all["job_id"], id);
  ASSERT_EQ(all["points"].size(), 3u) << all.dump();
  EXPECT_FALSE(all["more"]);
  const Json& point = all["points"][1];
  EXPECT_EQ(point["step"], 2);
  EXPECT_DOUBLE_EQ(point["loss"].get<double>(), 2.98);
  EXPECT_DOUBLE_EQ(point["eval_loss"].get<double>(), 2.8);
  EXPECT_DOUBLE_EQ(point["lr"].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(point["grad_norm"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(point["tokens_per_s"].get<double>(), 1002.0);
  EXPECT_DOUBLE_EQ(point["mfu"].get<double>(), 0.25);
  EXPECT_EQ(point["device_memory_bytes"], int64_t{2} << 20);
  EXPECT_EQ(point["device_memory_peak_bytes"], int64_t{7} << 30);
  EXPECT_DOUBLE_EQ(point["expert_load_max_over_mean"].get<double>(), 1.5);
  EXPECT_EQ(point["expert_load_per_layer"], Json({1.5, 1.25}));
  EXPECT_TRUE(all["points"][0]["eval_loss"].is_null());
  // Sequences as WatchJob numbers them: 0 is the submission, 1 the first report, 2 the log line.
  EXPECT_EQ(all["points"][0]["sequence"], 1);
  EXPECT_EQ(all["points"][1]["sequence"], 3);
  EXPECT_EQ(all["next_after"], 4);
  // The newest report's per-expert counts, as a layers × experts matrix.
  const Json& experts = all["expert_tokens"];
  EXPECT_EQ(experts["step"], 3);
  EXPECT_EQ(experts["layers"], 2);
  EXPECT_EQ(experts["experts"], 4);
  EXPECT_EQ(experts["counts"], Json({{97, 65, 49, 49}, {81, 65, 65, 49}}));

  // Only what came after.
  const Json nothing = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?after=4"));
  EXPECT_EQ(nothing["points"].size(), 0u);
  EXPECT_EQ(nothing["next_after"], 4);
  EXPECT_TRUE(nothing["expert_tokens"].is_null());
  Record(id, Report(4));
  const Json fresh = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?after=4"));
  ASSERT_EQ(fresh["points"].size(), 1u);
  EXPECT_EQ(fresh["points"][0]["step"], 4);
  EXPECT_EQ(fresh["next_after"], 5);
  EXPECT_EQ(fresh["expert_tokens"]["counts"][0], Json({96, 64, 48, 48}));

  // A limit cuts the answer into pages that join up without gaps or repeats.
  std::vector<int64_t> steps;
  int64_t after = -1;
  for (int calls = 0; calls < 10; ++calls) {
    const Json page = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?limit=3&after=", after));
    EXPECT_LE(page["points"].size(), 3u);
    for (const Json& p : page["points"]) steps.push_back(p["step"].get<int64_t>());
    after = page["next_after"].get<int64_t>();
    if (!page["more"].get<bool>()) break;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(JsonApiTest, LongLogsAreReadWholeAndTheirNewestEvaluationFound) {
  const std::string id = MustSubmit("long", 5000);
  // 2,500 reports in one write, beyond one read of the store: an evaluation early on, then none.
  std::vector<NewEvent> events;
  for (int64_t step = 1; step <= 2500; ++step) {
    events.push_back(
        {id, kStepMetricsEventKind,
         Report(step, step == 7 ? std::optional<double>(2.25) : std::nullopt).SerializeAsString()});
  }
  ASSERT_OK(coordinator_->AppendEvents(events));

  Json job = GetJson("/api/v1/jobs")["jobs"][0];
  EXPECT_DOUBLE_EQ(job["eval_loss"].get<double>(), 2.25);
  EXPECT_EQ(job["eval_step"], 7);
  Record(id, Report(2501, 2.0));
  job = GetJson(absl::StrCat("/api/v1/jobs/", id))["job"];
  EXPECT_DOUBLE_EQ(job["eval_loss"].get<double>(), 2.0);
  EXPECT_EQ(job["eval_step"], 2501);

  // More than 1 MiB of points: pages that join up, each within the bound.
  std::vector<int64_t> steps;
  int64_t after = -1;
  for (bool more = true; more;) {
    const Json page = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?after=", after));
    ASSERT_FALSE(page["points"].empty());
    EXPECT_LE(page["points"].dump().size(), size_t{1} << 20);
    for (const Json& p : page["points"]) steps.push_back(p["step"].get<int64_t>());
    after = page["next_after"].get<int64_t>();
    more = page["more"].get<bool>();
  }
  ASSERT_EQ(steps.size(), 2501u);
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));
  EXPECT_EQ(after, 2501);
  const Json capped = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?limit=500&after=100"));
  ASSERT_EQ(capped["points"].size(), 500u);
  EXPECT_TRUE(capped["more"]);
  // Sequence 0 is the submission, so step s is sequence s.
  EXPECT_EQ(capped["points"][0]["step"], 101);
  EXPECT_EQ(capped["next_after"], 600);
}

// Reports of a large model (here 4,000 MoE layers) make large points: the answer ends before
// 1 MiB of them, whatever `limit` allows, and the pages join up without gaps or repeats.
TEST_F(JsonApiTest, MetricsArePagedByBytes) {
  const std::string id = MustSubmit("wide", 100);
  std::vector<NewEvent> events;
  for (int64_t step = 1; step <= 40; ++step) {
    v1::StepMetrics metrics = Report(step);
    metrics.clear_expert_load_per_layer();
    metrics.clear_expert_tokens();
    for (int layer = 0; layer < 4000; ++layer)
      metrics.add_expert_load_per_layer(1.0 + 1e-7 * layer);
    events.push_back({id, kStepMetricsEventKind, metrics.SerializeAsString()});
  }
  ASSERT_OK(coordinator_->AppendEvents(events));
  std::vector<int64_t> steps;
  int64_t after = -1;
  int pages = 0;
  for (bool more = true; more && pages < 100; ++pages) {
    httplib::Result result = Get(absl::StrCat("/api/v1/jobs/", id, "/metrics?after=", after),
                                 absl::StrCat("Bearer ", kToken));
    ASSERT_TRUE(result);
    ASSERT_EQ(result->status, 200) << result->body.substr(0, 200);
    EXPECT_LE(result->body.size(), (size_t{1} << 20) + 4096);
    const Json page = Json::parse(result->body);
    ASSERT_FALSE(page["points"].empty());
    for (const Json& p : page["points"]) steps.push_back(p["step"].get<int64_t>());
    after = page["next_after"].get<int64_t>();
    more = page["more"].get<bool>();
  }
  EXPECT_GT(pages, 1);
  ASSERT_EQ(steps.size(), 40u);
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));
}

TEST_F(JsonApiTest, ReportsWithoutExpertsHaveNoHeatmap) {
  const std::string id = MustSubmit("dense", 10);
  v1::StepMetrics dense;
  dense.set_step(1);
  dense.set_loss(std::nan(""));  // a diverged step: JSON has no NaN
  Record(id, dense);
  const Json body = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics"));
  ASSERT_EQ(body["points"].size(), 1u);
  EXPECT_TRUE(body["points"][0]["loss"].is_null());
  EXPECT_TRUE(body["expert_tokens"].is_null());
}

TEST_F(JsonApiTest, ListsWorkers) {
  EXPECT_EQ(GetJson("/api/v1/workers")["workers"].size(), 0u);
  v1::RegisterWorkerRequest registration;
  registration.set_name("node-a");
  registration.set_version("1.2.3");
  registration.mutable_resources()->set_device_count(1);
  registration.mutable_resources()->set_threads(6);
  ASSERT_OK_AND_ASSIGN(const v1::RegisterWorkerResponse registered, fleet_->Register(registration));

  const Json body = GetJson("/api/v1/workers");
  ASSERT_EQ(body["workers"].size(), 1u);
  const Json& worker = body["workers"][0];
  EXPECT_EQ(worker["id"], registered.worker_id());
  EXPECT_EQ(worker["name"], "node-a");
  EXPECT_EQ(worker["state"], "IDLE");
  EXPECT_EQ(worker["device"], "CPU");
  EXPECT_EQ(worker["device_count"], 1);
  EXPECT_EQ(worker["device_memory_bytes"], 0);  // unknown: a CPU worker
  EXPECT_EQ(worker["threads"], 6);
  EXPECT_EQ(worker["version"], "1.2.3");
  EXPECT_EQ(worker["current_job_id"], "");
  EXPECT_EQ(worker["current_attempt"], 0);
  EXPECT_FALSE(worker["last_heartbeat"].get<std::string>().empty());
}

TEST_F(JsonApiTest, WorkersArePaged) {
  std::vector<std::string> registered;
  for (int i = 0; i < 3; ++i) {
    v1::RegisterWorkerRequest registration;
    registration.set_name(absl::StrCat("node-", i));
    registration.mutable_resources()->set_device_count(1);
    registration.mutable_resources()->set_threads(1);
    ASSERT_OK_AND_ASSIGN(const v1::RegisterWorkerResponse worker, fleet_->Register(registration));
    registered.push_back(worker.worker_id());
  }
  std::sort(registered.begin(), registered.end());
  const Json first = GetJson("/api/v1/workers?page_size=2");
  ASSERT_EQ(first["workers"].size(), 2u);
  EXPECT_EQ(first["workers"][0]["id"], registered[0]);
  EXPECT_EQ(first["workers"][1]["id"], registered[1]);
  const std::string token = first["next_page_token"].get<std::string>();
  ASSERT_FALSE(token.empty());
  const Json second = GetJson(absl::StrCat("/api/v1/workers?page_size=2&page_token=", token));
  ASSERT_EQ(second["workers"].size(), 1u);
  EXPECT_EQ(second["workers"][0]["id"], registered[2]);
  EXPECT_EQ(second["next_page_token"], "");
  EXPECT_EQ(GetJson("/api/v1/workers")["workers"].size(), 3u);
  const Json bad = GetJson("/api/v1/workers?page_size=0", 400);
  EXPECT_THAT(bad["error"]["message"].get<std::string>(), HasSubstr("page_size"));
}

TEST_F(JsonApiTest, TheApiNeedsTheTokenAndTheProbesDoNot) {
  const std::string id = MustSubmit("guarded", 10);
  for (const std::string& path : {std::string("/api/v1/jobs"), absl::StrCat("/api/v1/jobs/", id),
                                  absl::StrCat("/api/v1/jobs/", id, "/metrics"),
                                  std::string("/api/v1/workers"), std::string("/api/v2/nothing")}) {
    for (const std::string& authorization :
         {std::string(""), std::string("Bearer wrong-token"), absl::StrCat("Basic ", kToken),
          absl::StrCat("Bearer ", kToken, "x"), absl::StrCat("bearer", kToken)}) {
      SCOPED_TRACE(absl::StrCat(path, " with '", authorization, "'"));
      httplib::Result result = Get(path, authorization);
      ASSERT_TRUE(result);
      EXPECT_EQ(result->status, 401);
      EXPECT_EQ(result->get_header_value("WWW-Authenticate"), "Bearer");
      const Json body = Json::parse(result->body, nullptr, false);
      ASSERT_TRUE(body.is_object()) << result->body;
      EXPECT_EQ(body["error"]["code"], 401);
      EXPECT_EQ(body["error"]["status"], "UNAUTHENTICATED");
      EXPECT_THAT(body["error"]["message"].get<std::string>(),
                  authorization.empty() ? HasSubstr("missing") : HasSubstr("invalid bearer token"));
    }
  }
  EXPECT_EQ(GetJson("/api/v1/jobs")["jobs"].size(), 1u);
  for (const std::string path : {"/", "/metrics", "/healthz"}) {
    httplib::Result result = Get(path, "");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200) << path;
  }
}

TEST_F(JsonApiTest, WithoutATokenTheApiIsOpen) {
  Build("");
  httplib::Result result = Get("/api/v1/jobs", "");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200) << result->body;
  // A token sent anyway is not checked.
  result = Get("/api/v1/workers", "Bearer anything");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
}

TEST_F(JsonApiTest, ErrorsAreJsonAndSayWhatWasWrong) {
  const std::string id = MustSubmit("real", 10);
  Json body = GetJson("/api/v1/jobs/job-doesnotexist", 404);
  EXPECT_EQ(body["error"]["code"], 404);
  EXPECT_EQ(body["error"]["status"], "NOT_FOUND");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("job-doesnotexist"));
  body = GetJson("/api/v1/jobs/job-doesnotexist/metrics", 404);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("job-doesnotexist"));
  body = GetJson("/api/v1/nothing-here", 404);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("/api/v1/nothing-here"));
  GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics/extra"), 404);

  body = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?after=soon"), 400);
  EXPECT_EQ(body["error"]["status"], "INVALID_ARGUMENT");
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("after = 'soon'"));
  body = GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics?limit=0"), 400);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("limit = '0'"));
  body = GetJson("/api/v1/jobs?page_size=5000", 400);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("page_size"));
  body = GetJson("/api/v1/jobs?state=SLEEPING", 400);
  EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr("SLEEPING"));

  httplib::Client client(kHost, http_->port());
  httplib::Headers headers = {{"Authorization", absl::StrCat("Bearer ", kToken)}};
  httplib::Result posted = client.Post("/api/v1/jobs", headers, "{}", "application/json");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->status, 405);
  EXPECT_EQ(posted->get_header_value("Allow"), "GET, HEAD");
  EXPECT_EQ(Json::parse(posted->body)["error"]["status"], "METHOD_NOT_ALLOWED");
}

TEST_F(JsonApiTest, RequestsAreCountedByRouteNotById) {
  const std::string id = MustSubmit("counted", 10);
  GetJson(absl::StrCat("/api/v1/jobs/", id));
  GetJson("/api/v1/jobs/job-missing", 404);
  GetJson(absl::StrCat("/api/v1/jobs/", id, "/metrics"));
  Get("/", "");
  const std::string scraped = registry_->Serialize();
  EXPECT_THAT(scraped,
              HasSubstr("moetrain_http_requests_total{path=\"/api/v1/jobs/{id}\",code=\"200\"} 1"));
  EXPECT_THAT(scraped,
              HasSubstr("moetrain_http_requests_total{path=\"/api/v1/jobs/{id}\",code=\"404\"} 1"));
  EXPECT_THAT(scraped, HasSubstr("path=\"/api/v1/jobs/{id}/metrics\",code=\"200\"} 1"));
  EXPECT_THAT(scraped, HasSubstr("moetrain_http_requests_total{path=\"/\",code=\"200\"} 1"));
  EXPECT_EQ(scraped.find(id), std::string::npos);
}

}  // namespace
}  // namespace moetrain::server
