// The HTTP endpoint of the coordinator (--http-listen) and of the worker (--metrics-listen):
// Prometheus metrics, health probes, and the routes of the handlers it is given (the dashboard page
// and its JSON API, server/http/json_api.h).
//
//   GET /metrics   the registry in the text format 0.0.4
//   GET /healthz   200 "ok" while the process is up (any readiness state but STOPPED), else 503
//   GET /readyz    200 while SERVING, else 503 with the state and its reason
//   a handler's    whatever the first handler whose Route claims the path answers
//   anything else  404 (405 for another method on one of the paths above)
//   a request body over max_request_body_bytes: 413; a body without a Content-Length: 411;
//   a request line and header fields over max_header_bytes, or over max_header_count fields: 431;
//   a request that is not HTTP/1.x: 400
//
//   MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> http,
//       HttpServer::Create({.host = "0.0.0.0", .port = 9090, .handlers = {&page, &api},
//                           .registry = &registry, .readiness = &readiness}));
//   MOETRAIN_RETURN_IF_ERROR(http->Start());   // http->port() is the bound port
//   ...
//   http->Stop();
//
// Nobody needs a token to reach this port, so every request is read under the limits of
// HttpServerOptions, for every method, before any of it is kept: Boost.Beast's parser (as
// server/http/request_parser.h sets it up) bounds the header's bytes and fields and the body's, the
// server the connections and the time each request and answer may take. Sockets are served
// asynchronously by two I/O threads, so a slow client holds a socket and a few KiB, never a thread.
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
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/core/readiness.h"
#include "server/http/metrics.h"

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

  // What one client can make the server hold; nobody needs a token to send a request. Every limit
  // holds for every method and is checked as the bytes arrive, before they are kept.
  //
  // No route reads a body: one of at most this many bytes is read and discarded as it arrives; a
  // larger Content-Length is answered 413 as soon as it is read, without waiting for the body. A
  // request with a Transfer-Encoding (chunked or another), or a POST, PUT, PATCH or DELETE without
  // a Content-Length, is answered 411 the same way. After such a refusal (and a 431 or a 400) the
  // server drops what the client still sends, for read_timeout at most, and closes.
  int64_t max_request_body_bytes = 8 << 10;
  // The request line (its target included) and the header fields together, counted as
  // RequestParser does; more is answered 431. Also the size of a connection's read buffer.
  int max_header_bytes = 16 << 10;
  // Header fields in one request; more is answered 431.
  int max_header_count = 100;
  // Connections open at once; one more is closed as soon as it is accepted. With the buffer above,
  // this bounds what all clients together can make the server hold.
  int max_connections = 256;
  // Threads that make the answers of /metrics and of the handlers' routes, which may take
  // milliseconds (the registry's text, the store's rows). The two I/O threads answer /healthz and
  // /readyz themselves, so that neither slow clients nor slow handlers delay a probe.
  int threads = 4;
  // The whole of a request, head and body, must arrive within read_timeout of when the server
  // starts waiting for it (on a kept-alive connection, from the end of the previous answer), and
  // the whole answer must be written within write_timeout; else the connection is closed. So a
  // client that sends or reads slowly holds its connection for at most these.
  absl::Duration read_timeout = absl::Seconds(5);
  absl::Duration write_timeout = absl::Seconds(5);

  // InvalidArgument for an empty host, a port outside [0, 65535], a missing registry or
  // readiness, a null handler, a limit that is not positive, or a timeout outside (0, 1 h].
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

  // Binds host:port and serves on threads of its own until Stop. FailedPrecondition when already
  // started; Unavailable when the address cannot be bound (in use, not local). A stopped server
  // may be started again.
  absl::Status Start();
  // Stops accepting, closes the connections waiting for a request, finishes the answers in flight
  // and joins. Does nothing when not started.
  void Stop();

  // The bound port while started, else 0.
  int port() const { return port_.load(std::memory_order_acquire); }

 private:
  struct RouteMetrics;
  // One Start's sockets, threads and open connections (http_server.cc).
  struct Running;
  // One client's connection: reads its requests and writes the answers (http_server.cc).
  class Connection;

  HttpServer(const HttpServerOptions& options, std::unique_ptr<RouteMetrics> route_metrics);
  // Accepts the next connection, or closes it at once when max_connections are open.
  void Accept(Running& running);
  // The answer to a request, counted in moetrain_http_requests_total.
  HttpResponse Respond(const HttpRequest& request);
  // A path one of the handlers claimed, counted under `route`.
  HttpResponse RespondToRoute(HttpHandler& handler, const std::string& route,
                              const HttpRequest& request);
  void CountRequest(const std::string& path, int code);

  const HttpServerOptions options_;
  const std::unique_ptr<RouteMetrics> metrics_;
  Readiness::ListenerId readiness_listener_ = 0;

  std::mutex lifecycle_mu_;  // serializes Start and Stop
  std::unique_ptr<Running> running_ ABSL_GUARDED_BY(lifecycle_mu_);
  std::atomic<int> port_{0};
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_HTTP_SERVER_H_
