#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace moetrain::server {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view flag, const std::string& address) {
  const size_t colon = address.rfind(':');
  HostPort parsed;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &parsed.port) || parsed.port < 0 ||
      parsed.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = '", address, "' is not host:port with a port in [0, 65535]"));
  }
  parsed.host = address.substr(0, colon);
  if (parsed.host.size() > 2 && parsed.host.front() == '[' && parsed.host.back() == ']') {
    parsed.host = parsed.host.substr(1, parsed.host.size() - 2);
  }
  return parsed;
}

namespace {

constexpr char kMetricsPath[] = "/metrics";
constexpr char kHealthzPath[] = "/healthz";
constexpr char kReadyzPath[] = "/readyz";
// Every path nobody serves is counted under this one label value: paths come from the client,
// and one time series per typo would grow the registry without bound.
constexpr char kOtherPath[] = "other";
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";
// A probe or scrape that holds a connection open must not hold up Stop for long.
constexpr time_t kKeepAliveTimeoutSeconds = 1;

// SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which lets a second process bind a port
// already in use and silently take half of its connections.
void ReuseAddressOnly(int socket_fd) {
  int yes = 1;
  setsockopt(socket_fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

std::string Address(const HttpServerOptions& options) {
  return absl::StrCat(options.host, ":", options.port);
}

}  // namespace

struct HttpServer::RouteMetrics {
  Family<Counter>* requests;     // {path, code}
  Gauge* up;                     // 1 until STOPPED
  Family<Gauge>* state_by_name;  // {state}, 1 for the current state
};

absl::Status HttpServerOptions::Validate() const {
  if (host.empty()) return absl::InvalidArgumentError("http.host is empty");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http.port = ", port, " is outside [0, 65535]"));
  }
  if (registry == nullptr) return absl::InvalidArgumentError("http.registry is null");
  if (readiness == nullptr) return absl::InvalidArgumentError("http.readiness is null");
  if (max_request_body_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http.max_request_body_bytes = ", max_request_body_bytes, " must be positive"));
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http.threads = ", threads, " must be positive"));
  }
  if (read_timeout <= absl::ZeroDuration() || write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http.read_timeout = ", absl::FormatDuration(read_timeout),
        " and http.write_timeout = ", absl::FormatDuration(write_timeout), " must be positive"));
  }
  for (size_t i = 0; i < handlers.size(); ++i) {
    if (handlers[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("http.handlers[", i, "] is null"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerOptions& options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  auto metrics = std::make_unique<RouteMetrics>();
  absl::StatusOr<Family<Counter>*> requests = options.registry->AddCounter(
      "moetrain_http_requests_total", "HTTP requests served, by path and status code.",
      {"path", "code"});
  if (!requests.ok()) return requests.status();
  metrics->requests = *requests;
  absl::StatusOr<Family<Gauge>*> up = options.registry->AddGauge(
      "moetrain_up", "1 while this process (coordinator or worker) is up, 0 once stopped.");
  if (!up.ok()) return up.status();
  absl::StatusOr<Gauge*> up_gauge = (*up)->WithLabels({});
  if (!up_gauge.ok()) return up_gauge.status();
  metrics->up = *up_gauge;
  absl::StatusOr<Family<Gauge>*> state = options.registry->AddGauge(
      "moetrain_readiness_state", "1 for this process's readiness state, 0 for the others.",
      {"state"});
  if (!state.ok()) return state.status();
  metrics->state_by_name = *state;
  // Every state is written from the first scrape on, so that a query for one always finds it.
  for (ReadinessState s : kAllReadinessStates) {
    absl::StatusOr<Gauge*> gauge = metrics->state_by_name->WithLabels({ReadinessStateName(s)});
    if (!gauge.ok()) return gauge.status();
  }
  return std::unique_ptr<HttpServer>(new HttpServer(options, std::move(metrics)));
}

HttpServer::HttpServer(const HttpServerOptions& options,
                       std::unique_ptr<RouteMetrics> route_metrics)
    : options_(options), metrics_(std::move(route_metrics)) {
  RouteMetrics* metrics = metrics_.get();
  readiness_listener_ =
      options_.readiness->AddListener([metrics](ReadinessState state, const std::string&) {
        metrics->up->Set(state == ReadinessState::kStopped ? 0.0 : 1.0);
        for (ReadinessState s : kAllReadinessStates) {
          // The children exist since Create, so the lookup cannot fail.
          absl::StatusOr<Gauge*> gauge =
              metrics->state_by_name->WithLabels({ReadinessStateName(s)});
          if (gauge.ok()) (*gauge)->Set(s == state ? 1.0 : 0.0);
        }
      });
}

HttpServer::~HttpServer() {
  Stop();
  options_.readiness->RemoveListener(readiness_listener_);
}

absl::Status HttpServer::Start() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("HTTP server on ", options_.host, ":", port(), " is already started"));
  }
  // A fresh httplib::Server per start: one that has been stopped is not meant to listen again.
  auto server = std::make_unique<httplib::Server>();
  server->set_socket_options(ReuseAddressOnly);
  server->set_keep_alive_timeout(kKeepAliveTimeoutSeconds);
  // cpp-httplib's defaults leave bodies unbounded and serve 8 connections at once, so that a few
  // clients sending a header line a second stall every probe (docs/service.md, "Security and
  // limits").
  server->set_payload_max_length(static_cast<size_t>(options_.max_request_body_bytes));
  server->set_read_timeout(absl::ToChronoMicroseconds(options_.read_timeout));
  server->set_write_timeout(absl::ToChronoMicroseconds(options_.write_timeout));
  const size_t threads = static_cast<size_t>(options_.threads);
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Answers cpp-httplib gives itself (413 for a large body, 414, 400) are counted here; every
  // answer of this server's own has a body and is counted where it is made.
  const httplib::Server::Handler count_library_errors = [this](const httplib::Request&,
                                                               httplib::Response& response) {
    if (!response.body.empty()) return;
    absl::StatusOr<Counter*> counter =
        metrics_->requests->WithLabels({kOtherPath, absl::StrCat(response.status)});
    if (counter.ok()) (*counter)->Increment();
  };
  server->set_error_handler(count_library_errors);
  // A chunked body (or one with no length at all) is read to its end, past the payload limit:
  // refused before it is read. No route reads a body.
  server->set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        const bool body_expected = request.method == "POST" || request.method == "PUT" ||
                                   request.method == "PATCH" || request.method == "DELETE" ||
                                   request.method == "PRI";
        if (!request.has_header("Transfer-Encoding") &&
            (!body_expected || request.has_header("Content-Length"))) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        absl::StatusOr<Counter*> counter = metrics_->requests->WithLabels({kOtherPath, "411"});
        if (counter.ok()) (*counter)->Increment();
        response.status = 411;
        // The unread body would otherwise be parsed as the next request on this connection.
        response.set_header("Connection", "close");
        response.set_content("a request body needs a Content-Length (at most " +
                                 std::to_string(options_.max_request_body_bytes) + " bytes)\n",
                             kTextContentType);
        return httplib::Server::HandlerResponse::Handled;
      });
  // One catch-all route per method, so that every request, 404s included, is answered and
  // counted in one place before its response is written.
  const httplib::Server::Handler handler = [this](const httplib::Request& request,
                                                  httplib::Response& response) {
    Handle(request, &response);
  };
  server->Get(".*", handler);
  server->Post(".*", handler);
  server->Put(".*", handler);
  server->Patch(".*", handler);
  server->Delete(".*", handler);
  server->Options(".*", handler);

  int bound_port = options_.port;
  if (options_.port == 0) {
    bound_port = server->bind_to_any_port(options_.host);
  } else if (!server->bind_to_port(options_.host, options_.port)) {
    bound_port = -1;
  }
  if (bound_port <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind the HTTP server to ", Address(options_),
                                               ": the port is in use or the host is not local"));
  }

  auto listening_done = std::make_shared<std::atomic<bool>>(false);
  httplib::Server* raw_server = server.get();
  listen_thread_ = std::thread([raw_server, listening_done] {
    raw_server->listen_after_bind();
    listening_done->store(true, std::memory_order_release);
  });
  // httplib's stop() is lost if it comes before the accept loop is running, so Start returns
  // only once it is.
  while (!raw_server->is_running() && !listening_done->load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!raw_server->is_running()) {
    listen_thread_.join();
    return absl::UnavailableError(
        absl::StrCat("the HTTP server on ", options_.host, ":", bound_port, " stopped listening"));
  }
  server_ = std::move(server);
  port_.store(bound_port, std::memory_order_release);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (server_ == nullptr) return;
  server_->stop();
  listen_thread_.join();
  server_.reset();
  port_.store(0, std::memory_order_release);
}

void HttpServer::Handle(const httplib::Request& request, httplib::Response* response) {
  const std::string& path = request.path;
  const bool known = path == kMetricsPath || path == kHealthzPath || path == kReadyzPath;
  if (!known) {
    for (HttpHandler* handler : options_.handlers) {
      std::optional<std::string> route = handler->Route(path);
      if (!route.has_value()) continue;
      HandleRoute(*handler, *route, request, response);
      return;
    }
  }
  const bool readable = request.method == "GET" || request.method == "HEAD";
  std::string body;
  const char* content_type = kTextContentType;
  int code = 200;
  if (!known) {
    code = 404;
    body = "not found\n";
  } else if (!readable) {
    code = 405;
    body = "method not allowed\n";
    response->set_header("Allow", "GET, HEAD");
  } else if (path == kHealthzPath) {
    const bool up = options_.readiness->state() != ReadinessState::kStopped;
    code = up ? 200 : 503;
    body = up ? "ok" : "stopped";
  } else if (path == kReadyzPath) {
    std::string reason;
    const ReadinessState state = options_.readiness->Get(&reason);
    code = state == ReadinessState::kServing ? 200 : 503;
    body = absl::StrCat(ReadinessStateName(state), ": ", reason);
  }

  // Counted before a /metrics body is made, so that a scrape sees itself.
  const std::string code_text = absl::StrCat(code);
  absl::StatusOr<Counter*> counter =
      metrics_->requests->WithLabels({known ? path : kOtherPath, code_text});
  if (counter.ok()) (*counter)->Increment();

  if (known && readable && path == kMetricsPath) {
    body = options_.registry->Serialize();
    content_type = kMetricsContentType;
  }
  response->status = code;
  response->set_content(std::move(body), content_type);
}

void HttpServer::HandleRoute(HttpHandler& handler, const std::string& route,
                             const httplib::Request& request, httplib::Response* response) {
  HttpRequest converted;
  converted.method = request.method;
  converted.path = request.path;
  for (const auto& [key, value] : request.params) converted.query.emplace(key, value);
  converted.authorization = request.get_header_value("Authorization");
  HttpResponse answer = handler.Handle(converted);
  absl::StatusOr<Counter*> counter =
      metrics_->requests->WithLabels({route, absl::StrCat(answer.code)});
  if (counter.ok()) (*counter)->Increment();
  response->status = answer.code;
  for (const auto& [name, value] : answer.headers) response->set_header(name, value);
  response->set_content(std::move(answer.body), answer.content_type);
}

}  // namespace moetrain::server
