#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/core/readiness.h"
#include "server/http/metrics.h"

namespace moetrain::server {
namespace {

constexpr char kHost[] = "127.0.0.1";

template <typename T>
T Must(absl::StatusOr<T> value) {
  EXPECT_TRUE(value.ok()) << value.status();
  return *std::move(value);
}

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

  // The value of one sample line `<series> <value>` in a /metrics body, or -1 when it is absent.
  double Sample(const std::string& series) {
    httplib::Result result = Get("/metrics");
    EXPECT_TRUE(result) << httplib::to_string(result.error());
    if (!result) return -1;
    std::istringstream lines(result->body);
    std::string line;
    while (std::getline(lines, line)) {
      if (absl::StartsWith(line, series + " ")) return std::stod(line.substr(series.size() + 1));
    }
    return -1;
  }

  MetricsRegistry registry_;
  Readiness readiness_;
  std::unique_ptr<HttpServer> server_;
};

// Runs `promtool check metrics` with `text` on its stdin; its stdout and stderr go to `output`.
int RunPromtool(const std::string& text, std::string* output) {
  const std::string output_path = ::testing::TempDir() + "/http_server_promtool_output.txt";
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

TEST_F(HttpServerTest, MetricsServesTheRegistryText) {
  Family<Counter>* jobs = Must(registry_.AddCounter("moetrain_jobs_submitted_total",
                                                    "Jobs submitted, by outcome.", {"code"}));
  Must(jobs->WithLabels({"OK"}))->Increment(3);

  httplib::Result result = Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(absl::StrContains(result->body, "moetrain_jobs_submitted_total{code=\"OK\"} 3\n"))
      << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "moetrain_up 1\n")) << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "moetrain_readiness_state{state=\"STARTING\"} 1\n"))
      << result->body;
  EXPECT_TRUE(absl::StrContains(result->body, "moetrain_readiness_state{state=\"SERVING\"} 0\n"))
      << result->body;
  // The scrape counts itself before the text is made, and the registry then writes the same
  // text (the counter does not move between the two without another request).
  EXPECT_TRUE(absl::StrContains(result->body,
                                "moetrain_http_requests_total{path=\"/metrics\",code=\"200\"} 1\n"))
      << result->body;
  EXPECT_EQ(result->body, registry_.Serialize());
}

TEST_F(HttpServerTest, MetricsPassPromtool) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "/usr/bin/promtool not found: install Debian's prometheus package "
                    "(scripts/setup.sh does)";
  }
  Must(registry_.AddHistogram("moetrain_train_step_duration_seconds", "Wall time of a step.",
                              {"job"}, ExponentialBuckets(0.001, 4, 6)));
  ASSERT_TRUE(Get("/nowhere"));
  ASSERT_TRUE(Get("/healthz"));
  ASSERT_TRUE(Get("/readyz"));
  httplib::Result result = Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  std::string output;
  EXPECT_EQ(RunPromtool(result->body, &output), 0) << output << "\nfor:\n" << result->body;
  EXPECT_EQ(output, "") << "for:\n" << result->body;
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
  EXPECT_TRUE(absl::StrContains(result->body, "# TYPE moetrain_up gauge")) << result->body;
  result = client.Get("/b");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  server->Stop();

  const std::string scraped = registry.Serialize();
  EXPECT_TRUE(
      absl::StrContains(scraped, "moetrain_http_requests_total{path=\"/a*\",code=\"200\"} 2"))
      << scraped;
  EXPECT_TRUE(
      absl::StrContains(scraped, "moetrain_http_requests_total{path=\"/a*\",code=\"404\"} 1"))
      << scraped;
  EXPECT_TRUE(
      absl::StrContains(scraped, "moetrain_http_requests_total{path=\"other\",code=\"404\"} 1"))
      << scraped;
  EXPECT_FALSE(absl::StrContains(scraped, "/ab*")) << scraped;
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
