// The coordinator's HTTP endpoint: Prometheus metrics, health probes, and the routes of the
// handlers it is given (the dashboard page and its JSON API, server/http/json_api.h).
//
//   GET /metrics   the registry in the text format 0.0.4
//   GET /healthz   200 "ok" while the process is up (any readiness state but STOPPED), else 503
//   GET /readyz    200 while SERVING, else 503 with the state and its reason
//   a handler's    whatever the first handler whose Route claims the path answers
//   anything else  404 (405 for another method on one of the paths above)
//   a request body over max_request_body_bytes: 413; a body without a Content-Length: 411
//
//   MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> http,
//       HttpServer::Create({.host = "0.0.0.0", .port = 9090, .handlers = {&page, &api},
//                           .registry = &registry, .readiness = &readiness}));
//   MOETRAIN_RETURN_IF_ERROR(http->Start());   // http->port() is the bound port
//   ...
//   http->Stop();
//
// Create adds to the registry `moetrain_http_requests_total{path,code}`, `moetrain_up` and
// `moetrain_readiness_state{state}` (1 for the current state, 0 for the others), so one registry
// serves one HttpServer. The registry, the readiness and the handlers outlive the server.
#ifndef MOETRAIN_SERVER_HTTP_HTTP_SERVER_H_
#define MOETRAIN_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/readiness.h"
#include "server/http/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace moetrain::server {

// A request as a handler sees it: transport-free, so handlers are tested without sockets.
struct HttpRequest {
  std::string method;                        // "GET", "HEAD", "POST", ...
  std::string path;                          // decoded, without the query
  std::map<std::string, std::string> query;  // decoded; the first value of a repeated key
  std::string authorization;                 // the Authorization header; empty when absent
};

struct HttpResponse {
  int code = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beside Content-Type
};

// Routes beyond the server's own. Called from the server's threads at once: thread-safe.
class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // The route `path` belongs to, as the `path` label of moetrain_http_requests_total: a template
  // such as "/api/v1/jobs/{id}", never an id (one series per id would grow the registry without
  // bound); nullopt when the path is not this handler's.
  virtual std::optional<std::string> Route(absl::string_view path) const = 0;
  // Answers a request whose path Route claimed, whatever its method.
  virtual HttpResponse Handle(const HttpRequest& request) = 0;
};

// An address to listen on.
struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;
};

// "host:port" or "[v6]:port"; InvalidArgument naming `flag` and the text when it is not host:port
// with a port in [0, 65535].
absl::StatusOr<HostPort> ParseHostPort(absl::string_view flag, const std::string& address);

struct HttpServerOptions {
  // Only this address is bound: "127.0.0.1" for local scrapes, "0.0.0.0" for all interfaces.
  std::string host = "127.0.0.1";
  // 0 picks a free port; port() then tells which.
  int port = 0;
  // Asked in order after the server's own paths; not owned.
  std::vector<HttpHandler*> handlers = {};
  MetricsRegistry* registry = nullptr;  // not owned
  Readiness* readiness = nullptr;       // not owned

  // What one client can make the server hold; nobody needs a token to send a request. No route
  // reads a body: a larger one is answered 413 and discarded as it arrives, never buffered; a
  // chunked request, or a POST, PUT, PATCH or DELETE without a Content-Length (which cpp-httplib
  // would read to the end of the connection), is answered 411 and its body never read.
  int64_t max_request_body_bytes = 8 << 10;
  // Connections served at once; more wait for a thread. A slow client holds a thread until it
  // finishes its request or is silent for read_timeout, so this many slow clients must be open
  // before /healthz waits.
  int threads = 64;
  absl::Duration read_timeout = absl::Seconds(5);   // silence while a request is read
  absl::Duration write_timeout = absl::Seconds(5);  // stall while an answer is written

  // InvalidArgument for an empty host, a port outside [0, 65535], a missing registry or
  // readiness, or a limit that is not positive.
  absl::Status Validate() const;
};

class HttpServer {
 public:
  // InvalidArgument for bad options; AlreadyExists when the registry already has this server's
  // metrics.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(const HttpServerOptions& options);

  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves on a thread of its own until Stop. FailedPrecondition when already
  // started; Unavailable when the address cannot be bound (in use, not local). A stopped server
  // may be started again.
  absl::Status Start();
  // Stops accepting, finishes the requests in flight and joins. Does nothing when not started.
  void Stop();

  // The bound port while started, else 0.
  int port() const { return port_.load(std::memory_order_acquire); }

 private:
  struct RouteMetrics;

  HttpServer(const HttpServerOptions& options, std::unique_ptr<RouteMetrics> route_metrics);
  void Handle(const httplib::Request& request, httplib::Response* response);
  // A path one of the handlers claimed, counted under `route`.
  void HandleRoute(HttpHandler& handler, const std::string& route, const httplib::Request& request,
                   httplib::Response* response);

  const HttpServerOptions options_;
  const std::unique_ptr<RouteMetrics> metrics_;
  Readiness::ListenerId readiness_listener_ = 0;

  std::mutex lifecycle_mu_;  // serializes Start and Stop
  std::unique_ptr<httplib::Server> server_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::thread listen_thread_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::atomic<int> port_{0};
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_HTTP_SERVER_H_
