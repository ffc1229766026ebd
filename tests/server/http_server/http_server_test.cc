#include "server/http/http_server.h"

#include <httplib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/core/readiness.h"
#include "server/http/metrics.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using testutil::Exposition;
using testutil::ExpositionSample;
using testutil::Must;
using testutil::MustParseExposition;
using testutil::PromtoolCheckMetrics;
using testutil::PromtoolResult;
using testutil::SeriesValue;

constexpr char kHost[] = "127.0.0.1";

// A registry, a readiness and a started server on 127.0.0.1 at a free port.
class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = Must(HttpServer::Create(
        {.host = kHost, .port = 0, .registry = &registry_, .readiness = &readiness_}));
    ASSERT_NE(server_, nullptr);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
  }

  httplib::Result Get(const std::string& path) {
    httplib::Client client(kHost, server_->port());
    client.set_connection_timeout(5);
    client.set_read_timeout(5);
    return client.Get(path);
  }

  // The value of `series` (`name{label="value",...}`) in a /metrics body, or -1 when it is
  // absent.
  double Sample(const std::string& series) {
    httplib::Result result = Get("/metrics");
    EXPECT_TRUE(result) << httplib::to_string(result.error());
    if (!result) return -1;
    return SeriesValue(MustParseExposition(result->body), series).value_or(-1);
  }

  MetricsRegistry registry_;
  Readiness readiness_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, MetricsServesTheRegistryText) {
  Family<Counter>* jobs = Must(registry_.AddCounter("moetrain_jobs_submitted_total",
                                                    "Jobs submitted, by outcome.", {"code"}));
  Must(jobs->WithLabels({"OK"}))->Increment(3);

  httplib::Result result = Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const Exposition scraped = MustParseExposition(result->body);
  EXPECT_EQ(scraped.Value("moetrain_jobs_submitted_total", {{"code", "OK"}}), 3);
  EXPECT_EQ(scraped.Value("moetrain_up"), 1);
  EXPECT_EQ(scraped.Value("moetrain_readiness_state", {{"state", "STARTING"}}), 1);
  EXPECT_EQ(scraped.Value("moetrain_readiness_state", {{"state", "SERVING"}}), 0);
  // The scrape counts itself before the text is made, and the registry then writes the same
  // samples (the counter does not move between the two without another request).
  EXPECT_EQ(scraped.Value("moetrain_http_requests_total", {{"path", "/metrics"}, {"code", "200"}}),
            1);
  EXPECT_EQ(scraped.samples, MustParseExposition(registry_.Serialize()).samples);
  EXPECT_EQ(scraped.TypeOf("moetrain_jobs_submitted_total"), "counter");
}

TEST_F(HttpServerTest, MetricsPassPromtool) {
  Must(registry_.AddHistogram("moetrain_train_step_duration_seconds", "Wall time of a step.",
                              {"job"}, ExponentialBuckets(0.001, 4, 6)));
  ASSERT_TRUE(Get("/nowhere"));
  ASSERT_TRUE(Get("/healthz"));
  ASSERT_TRUE(Get("/readyz"));
  httplib::Result result = Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  const absl::StatusOr<PromtoolResult> promtool = PromtoolCheckMetrics(result->body);
  ASSERT_OK(promtool);
  EXPECT_EQ(promtool->exit_code, 0) << promtool->output << "\nfor:\n" << result->body;
  EXPECT_EQ(promtool->output, "") << "for:\n" << result->body;
}

TEST_F(HttpServerTest, ReadyzFollowsTheReadinessState) {
  httplib::Result starting = Get("/readyz");
  ASSERT_TRUE(starting);
  EXPECT_EQ(starting->status, 503);
  EXPECT_EQ(starting->body, "STARTING: starting");

  ASSERT_TRUE(readiness_.Transition(ReadinessState::kServing, "store opened").ok());
  httplib::Result serving = Get("/readyz");
  ASSERT_TRUE(serving);
  EXPECT_EQ(serving->status, 200);
  EXPECT_EQ(serving->body, "SERVING: store opened");
  EXPECT_EQ(Sample("moetrain_readiness_state{state=\"SERVING\"}"), 1);
  EXPECT_EQ(Sample("moetrain_readiness_state{state=\"STARTING\"}"), 0);

  ASSERT_TRUE(readiness_.Transition(ReadinessState::kDraining, "SIGTERM received").ok());
  httplib::Result draining = Get("/readyz");
  ASSERT_TRUE(draining);
  EXPECT_EQ(draining->status, 503);
  EXPECT_TRUE(absl::StrContains(draining->body, "SIGTERM received")) << draining->body;
  EXPECT_EQ(Sample("moetrain_readiness_state{state=\"DRAINING\"}"), 1);
  EXPECT_EQ(Sample("moetrain_up"), 1);
}

TEST_F(HttpServerTest, HealthzIsOkUntilStopped) {
  for (ReadinessState state : {ReadinessState::kServing, ReadinessState::kDraining}) {
    httplib::Result result = Get("/healthz");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200);
    EXPECT_EQ(result->body, "ok");
    ASSERT_TRUE(readiness_.Transition(state, "next").ok());
  }
  ASSERT_TRUE(readiness_.Transition(ReadinessState::kStopped, "stopped").ok());
  httplib::Result stopped = Get("/healthz");
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->status, 503);
  EXPECT_EQ(Sample("moetrain_up"), 0);
  EXPECT_EQ(Sample("moetrain_readiness_state{state=\"STOPPED\"}"), 1);
}

TEST_F(HttpServerTest, UnknownPathsAre404AndOtherMethods405) {
  httplib::Result result = Get("/nowhere");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  ASSERT_TRUE(Get("/metrics/extra"));
  ASSERT_TRUE(Get("/"));

  httplib::Client client(kHost, server_->port());
  httplib::Result post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET, HEAD");

  // Unknown paths share one series, so that clients cannot grow the registry.
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"other\",code=\"404\"}"), 3);
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/metrics\",code=\"405\"}"), 1);
}

TEST_F(HttpServerTest, CountsRequestsByPathAndCode) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Get("/healthz"));
  ASSERT_TRUE(Get("/readyz"));
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/healthz\",code=\"200\"}"), 3);
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/readyz\",code=\"503\"}"), 1);
  ASSERT_TRUE(readiness_.Transition(ReadinessState::kServing, "up").ok());
  ASSERT_TRUE(Get("/readyz"));
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/readyz\",code=\"200\"}"), 1);
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/readyz\",code=\"503\"}"), 1);
  // Each Sample is one scrape; this one is the fifth.
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/metrics\",code=\"200\"}"), 5);
}

TEST_F(HttpServerTest, StartsAndStopsTwice) {
  EXPECT_EQ(server_->Start().code(), absl::StatusCode::kFailedPrecondition);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const int port = server_->port();
    ASSERT_TRUE(Get("/healthz"));
    server_->Stop();
    EXPECT_EQ(server_->port(), 0);
    httplib::Client client(kHost, port);
    client.set_connection_timeout(1);
    EXPECT_FALSE(client.Get("/healthz"));
    server_->Stop();  // a second Stop does nothing
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
    httplib::Result result = Get("/healthz");
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, 200);
  }
  // The counter carries on across restarts: it belongs to the registry, not to one start.
  EXPECT_EQ(Sample("moetrain_http_requests_total{path=\"/healthz\",code=\"200\"}"), 4);
}

TEST(HttpServerStandaloneTest, TwoServersOnDifferentPorts) {
  MetricsRegistry registry_a, registry_b;
  Readiness readiness_a, readiness_b;
  std::unique_ptr<HttpServer> a = Must(HttpServer::Create(
      {.host = kHost, .port = 0, .registry = &registry_a, .readiness = &readiness_a}));
  std::unique_ptr<HttpServer> b = Must(HttpServer::Create(
      {.host = kHost, .port = 0, .registry = &registry_b, .readiness = &readiness_b}));
  ASSERT_TRUE(a->Start().ok());
  ASSERT_TRUE(b->Start().ok());
  EXPECT_NE(a->port(), b->port());
  ASSERT_TRUE(readiness_b.Transition(ReadinessState::kServing, "b is ready").ok());

  httplib::Client client_a(kHost, a->port());
  httplib::Client client_b(kHost, b->port());
  httplib::Result ready_a = client_a.Get("/readyz");
  httplib::Result ready_b = client_b.Get("/readyz");
  ASSERT_TRUE(ready_a);
  ASSERT_TRUE(ready_b);
  EXPECT_EQ(ready_a->status, 503);
  EXPECT_EQ(ready_b->status, 200);

  // A port taken by one server cannot be bound by another.
  MetricsRegistry registry_c;
  std::unique_ptr<HttpServer> c = Must(HttpServer::Create(
      {.host = kHost, .port = a->port(), .registry = &registry_c, .readiness = &readiness_a}));
  EXPECT_EQ(c->Start().code(), absl::StatusCode::kUnavailable);
  a->Stop();
  b->Stop();
}

TEST(HttpServerStandaloneTest, CreateValidatesItsOptions) {
  MetricsRegistry registry;
  Readiness readiness;
  EXPECT_EQ(HttpServer::Create({.host = "", .registry = &registry, .readiness = &readiness})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Create({.port = 70000, .registry = &registry, .readiness = &readiness})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Create({.readiness = &readiness}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpServer::Create({.registry = &registry}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(HttpServer::Create({.registry = &registry, .readiness = &readiness}).ok());
  // The metrics names are taken now: one registry, one server.
  EXPECT_EQ(HttpServer::Create({.registry = &registry, .readiness = &readiness}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(HttpServerStandaloneTest, CreateNamesABadLimitAndItsValue) {
  MetricsRegistry registry;
  Readiness readiness;
  auto refusal = [&](HttpServerOptions options) {
    options.registry = &registry;
    options.readiness = &readiness;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(server.status().message());
  };
  EXPECT_EQ(refusal({.max_request_body_bytes = 0}),
            "http.max_request_body_bytes = 0 must be positive");
  EXPECT_EQ(refusal({.max_header_bytes = 0}), "http.max_header_bytes = 0 must be positive");
  EXPECT_EQ(refusal({.max_header_count = -1}), "http.max_header_count = -1 must be positive");
  EXPECT_EQ(refusal({.max_connections = 0}), "http.max_connections = 0 must be positive");
  EXPECT_EQ(refusal({.threads = 0}), "http.threads = 0 must be positive");
  EXPECT_EQ(refusal({.read_timeout = absl::InfiniteDuration()}),
            "http.read_timeout = inf is outside (0, 1h]");
  EXPECT_EQ(refusal({.write_timeout = absl::ZeroDuration()}),
            "http.write_timeout = 0 is outside (0, 1h]");
}

// Claims the paths under `prefix`, counted under "<prefix>*", and echoes what it was given.
class EchoHandler : public HttpHandler {
 public:
  explicit EchoHandler(std::string prefix) : prefix_(std::move(prefix)) {}
  std::optional<std::string> Route(absl::string_view path) const override {
    if (!absl::StartsWith(path, prefix_)) return std::nullopt;
    return prefix_ + "*";
  }
  HttpResponse Handle(const HttpRequest& request) override {
    HttpResponse response;
    response.code = request.path == prefix_ + "missing" ? 404 : 200;
    response.content_type = "application/json";
    response.body = absl::StrCat(
        prefix_, "|", request.method, "|", request.path, "|", request.authorization, "|",
        request.query.size() == 1
            ? request.query.begin()->first + "=" + request.query.begin()->second
            : "");
    response.headers.emplace_back("X-Handled-By", prefix_);
    return response;
  }

 private:
  const std::string prefix_;
};

TEST(HttpServerStandaloneTest, HandlersAnswerThePathsTheyClaim) {
  MetricsRegistry registry;
  Readiness readiness;
  EchoHandler wide("/a"), narrow("/ab"), metrics("/metrics");
  HttpServerOptions options;
  options.host = kHost;
  // The first handler that claims a path answers it; the server's own paths come before any.
  options.handlers = {&wide, &narrow, &metrics};
  options.registry = &registry;
  options.readiness = &readiness;
  std::unique_ptr<HttpServer> server = Must(HttpServer::Create(options));
  ASSERT_TRUE(server->Start().ok());
  httplib::Client client(kHost, server->port());
  client.set_read_timeout(5);

  httplib::Result result =
      client.Get("/abc?x=1%202", httplib::Headers{{"Authorization", "Bearer t"}});
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->body, "/a|GET|/abc|Bearer t|x=1 2");
  EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(result->get_header_value("X-Handled-By"), "/a");
  result = client.Post("/a/thing", "{}", "application/json");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->body, "/a|POST|/a/thing||");
  result = client.Get("/amissing");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  result = client.Get("/metrics");
  ASSERT_TRUE(result);
  EXPECT_EQ(MustParseExposition(result->body).TypeOf("moetrain_up"), "gauge") << result->body;
  result = client.Get("/b");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  server->Stop();

  const Exposition scraped = MustParseExposition(registry.Serialize());
  const std::string requests = "moetrain_http_requests_total";
  EXPECT_EQ(scraped.Value(requests, {{"path", "/a*"}, {"code", "200"}}), 2);
  EXPECT_EQ(scraped.Value(requests, {{"path", "/a*"}, {"code", "404"}}), 1);
  EXPECT_EQ(scraped.Value(requests, {{"path", "other"}, {"code", "404"}}), 1);
  EXPECT_EQ(scraped.WithLabel("path", "/ab*"), std::vector<ExpositionSample>());
}

TEST(HttpServerStandaloneTest, ANullHandlerIsRefused) {
  MetricsRegistry registry;
  Readiness readiness;
  HttpServerOptions options;
  options.handlers = {nullptr};
  options.registry = &registry;
  options.readiness = &readiness;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "http.handlers[0]")) << server.status();
}

TEST(ReadinessTest, MovesOnlyForwardAndTellsListenersInOrder) {
  Readiness readiness;
  std::vector<std::string> seen;
  const Readiness::ListenerId id =
      readiness.AddListener([&seen](ReadinessState state, const std::string& reason) {
        seen.push_back(absl::StrCat(ReadinessStateName(state), ":", reason));
      });
  ASSERT_TRUE(readiness.Transition(ReadinessState::kServing, "a").ok());
  EXPECT_EQ(readiness.Transition(ReadinessState::kStarting, "b").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(readiness.Transition(ReadinessState::kServing, "c").code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(readiness.Transition(ReadinessState::kStopped, "d").ok());
  readiness.RemoveListener(id);
  readiness.RemoveListener(id);
  EXPECT_EQ(seen, (std::vector<std::string>{"STARTING:starting", "SERVING:a", "STOPPED:d"}));
  std::string reason;
  EXPECT_EQ(readiness.Get(&reason), ReadinessState::kStopped);
  EXPECT_EQ(reason, "d");
}

}  // namespace
}  // namespace moetrain::server
