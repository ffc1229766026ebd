#include "server/http/http_server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/request_parser.h"

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

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr char kMetricsPath[] = "/metrics";
constexpr char kHealthzPath[] = "/healthz";
constexpr char kReadyzPath[] = "/readyz";
// Every path nobody serves is counted under this one label value: paths come from the client,
// and one time series per typo would grow the registry without bound. Requests refused before
// their path is known (400, 411, 413, 431) are counted under it too.
constexpr char kOtherPath[] = "other";
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";
// The threads that run the sockets. Nothing on them blocks (the probes read the readiness under
// its mutex, the rest goes to the handler threads), so two keep accepting and answering probes
// while one is busy parsing or writing.
constexpr int kIoThreads = 2;
// Accepting fails for want of descriptors (EMFILE) while every one is taken: wait this long
// before trying again rather than spinning.
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);
// A deadline must be a time on the steady clock (absl::InfiniteDuration is not one).
constexpr absl::Duration kMaxTimeout = absl::Hours(1);

std::string Address(const HttpServerOptions& options) {
  return absl::StrCat(options.host, ":", options.port);
}

std::chrono::steady_clock::duration ToSteady(absl::Duration duration) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(duration));
}

}  // namespace

struct HttpServer::RouteMetrics {
  Family<Counter>* requests;     // {path, code}
  Gauge* up;                     // 1 until STOPPED
  Family<Gauge>* state_by_name;  // {state}, 1 for the current state
};

struct HttpServer::Running {
  explicit Running(int threads) : handler_pool(static_cast<size_t>(threads)) {}

  std::mutex mu;
  std::condition_variable all_closed;  // when `connections` becomes empty
  // The open connections by an id of each, for Stop to close. Weak: a connection ends (and leaves
  // this map from its destructor) when its last operation does.
  std::map<uint64_t, std::weak_ptr<Connection>> connections ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 0;
  // Set by Stop under `mu`: no connection is admitted after, and none waits for another request.
  std::atomic<bool> stopping{false};

  asio::io_context io{kIoThreads};
  // The pool's answers come back to the sockets through `io`: it must run until Stop has seen
  // every connection end, even while none has an operation pending.
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  asio::strand<asio::io_context::executor_type> accept_strand = asio::make_strand(io);
  tcp::acceptor acceptor{accept_strand};
  asio::steady_timer accept_retry{accept_strand};
  asio::thread_pool handler_pool;
  std::vector<std::thread> io_threads;
};

// One client's connection. Its operations run on a strand of its own, one at a time; the handler
// pool hands its answers back through that strand.
class HttpServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer& server, Running& running, uint64_t id, tcp::socket socket)
      : server_(server),
        options_(server.options_),
        running_(running),
        id_(id),
        stream_(std::move(socket)),
        buffer_(static_cast<size_t>(options_.max_header_bytes)) {}

  ~Connection() {
    std::lock_guard<std::mutex> lock(running_.mu);
    running_.connections.erase(id_);
    if (running_.connections.empty()) running_.all_closed.notify_all();
  }

  // Reads and answers requests until the client closes, a limit or a timeout ends the
  // connection, or Stop does.
  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHead(); });
  }

  // For Stop: a connection waiting for a request is closed now; one being answered closes once
  // its answer is written.
  void CloseIfWaiting() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->waiting_) self->stream_.close();
    });
  }

 private:
  // What follows an answer.
  enum class Then { kReadNext, kClose, kLinger };

  void ReadHead() {
    if (running_.stopping.load()) {
      Close();
      return;
    }
    waiting_ = true;
    parser_.emplace(options_);
    // One deadline for the head and the body together: a client that trickles bytes gains
    // nothing.
    stream_.expires_after(ToSteady(options_.read_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code error, size_t) { self->OnHead(error); });
  }

  void OnHead(beast::error_code error) {
    if (error) {
      RefuseOrClose(error);
      return;
    }
    const std::string& method = parser_->method();
    const bool body_expected =
        method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
    if (parser_->transfer_encoding() || (body_expected && !parser_->content_length())) {
      Refuse(411, absl::StrCat("a request body needs a Content-Length (at most ",
                               options_.max_request_body_bytes, " bytes)\n"));
      return;
    }
    if (parser_->is_done()) {
      Dispatch();
      return;
    }
    // A body within max_request_body_bytes (the parser refused a longer Content-Length), read
    // and dropped.
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code error, size_t) {
                       if (error) {
                         self->RefuseOrClose(error);
                       } else {
                         self->Dispatch();
                       }
                     });
  }

  // A request the parser stopped: answered when it broke a limit or HTTP's grammar; closed
  // without a word when the client went away, was too slow, or Stop closed it.
  void RefuseOrClose(beast::error_code error) {
    if (error == http::error::header_limit || error == http::error::buffer_overflow) {
      Refuse(431, absl::StrCat("the request line and header fields are limited to ",
                               options_.max_header_bytes, " bytes and ", options_.max_header_count,
                               " fields\n"));
    } else if (error == http::error::body_limit) {
      Refuse(413, absl::StrCat("a request body is limited to ", options_.max_request_body_bytes,
                               " bytes\n"));
    } else if (error.category() == http::make_error_code(http::error::bad_method).category() &&
               error != http::error::end_of_stream && error != http::error::partial_message) {
      Refuse(400, "not an HTTP/1.1 request\n");
    } else {
      Close();
    }
  }

  // Answers a whole request: /healthz and /readyz here, on an I/O thread, so that they never wait
  // behind a handler; the rest on the handler pool, so that a slow handler never holds an I/O
  // thread (and with it the accepting of connections and the probes).
  void Dispatch() {
    waiting_ = false;
    stream_.expires_never();
    HttpRequest request = ToHttpRequest(std::move(parser_->method()), parser_->target(),
                                        std::move(parser_->authorization()));
    const Then then = parser_->keep_alive() ? Then::kReadNext : Then::kClose;
    parser_.reset();
    const bool head = request.method == "HEAD";
    if (request.path == kHealthzPath || request.path == kReadyzPath) {
      Write(server_.Respond(request), head, then);
      return;
    }
    asio::post(running_.handler_pool,
               [self = shared_from_this(), request = std::move(request), head, then]() {
                 HttpResponse response;
                 // A handler that throws (nlohmann's dump() of a string that is not UTF-8, say)
                 // fails its request, as cpp-httplib's server made it do, not the process.
                 try {
                   response = self->server_.Respond(request);
                 } catch (const std::exception&) {
                   self->server_.CountRequest(kOtherPath, 500);
                   response.code = 500;
                   response.body = "internal error\n";
                 }
                 asio::post(self->stream_.get_executor(),
                            [self, response = std::move(response), head, then]() mutable {
                              self->Write(std::move(response), head, then);
                            });
               });
  }

  // A request this server will not read on: answered `code` (counted), then the connection
  // lingers and closes.
  void Refuse(int code, std::string body) {
    waiting_ = false;
    server_.CountRequest(kOtherPath, code);
    HttpResponse refusal;
    refusal.code = code;
    refusal.body = std::move(body);
    // The method is known unless the request line itself broke a limit.
    Write(std::move(refusal), parser_.has_value() && parser_->method() == "HEAD", Then::kLinger);
  }

  void Write(HttpResponse answer, bool head, Then then) {
    if (then == Then::kReadNext && running_.stopping.load()) then = Then::kClose;
    response_ = {};
    response_.version(11);
    response_.result(static_cast<unsigned>(answer.code));
    response_.set(http::field::content_type, answer.content_type);
    for (const auto& [name, value] : answer.headers) response_.set(name, value);
    response_.keep_alive(then == Then::kReadNext);
    // A HEAD is told the length of the body it does not get.
    response_.content_length(answer.body.size());
    if (!head) response_.body() = std::move(answer.body);
    stream_.expires_after(ToSteady(options_.write_timeout));
    http::async_write(stream_, response_,
                      [self = shared_from_this(), then](beast::error_code error, size_t) {
                        self->response_ = {};
                        if (error) return;  // the stream is closed as the connection ends
                        if (then == Then::kReadNext) {
                          self->ReadHead();
                        } else if (then == Then::kLinger) {
                          self->Linger();
                        } else {
                          self->Close();
                        }
                      });
  }

  // After a refusal the client may still be sending what was refused. Closing with bytes unread
  // would reset the connection, which can discard the answer before the client reads it; so the
  // rest is read and dropped until the client closes, or for read_timeout at most.
  void Linger() {
    waiting_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(ToSteady(options_.read_timeout));
    Drop();
  }

  void Drop() {
    buffer_.clear();
    stream_.async_read_some(buffer_.prepare(buffer_.max_size()),
                            [self = shared_from_this()](beast::error_code error, size_t) {
                              if (!error) self->Drop();
                            });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  HttpServer& server_;
  const HttpServerOptions& options_;
  Running& running_;
  const uint64_t id_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;  // at most max_header_bytes
  std::optional<RequestParser> parser_;
  http::response<http::string_body> response_;  // the answer being written
  bool waiting_ = false;  // for a request, or lingering: Stop closes it at once
};

absl::Status HttpServerOptions::Validate() const {
  if (host.empty()) return absl::InvalidArgumentError("http.host is empty");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("http.port = ", port, " is outside [0, 65535]"));
  }
  if (registry == nullptr) return absl::InvalidArgumentError("http.registry is null");
  if (readiness == nullptr) return absl::InvalidArgumentError("http.readiness is null");
  const std::pair<const char*, int64_t> limits[] = {
      {"max_request_body_bytes", max_request_body_bytes},
      {"max_header_bytes", max_header_bytes},
      {"max_header_count", max_header_count},
      {"max_connections", max_connections},
      {"threads", threads}};
  for (const auto& [name, value] : limits) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("http.", name, " = ", value, " must be positive"));
    }
  }
  const std::pair<const char*, absl::Duration> timeouts[] = {{"read_timeout", read_timeout},
                                                             {"write_timeout", write_timeout}};
  for (const auto& [name, timeout] : timeouts) {
    if (timeout <= absl::ZeroDuration() || timeout > kMaxTimeout) {
      return absl::InvalidArgumentError(
          absl::StrCat("http.", name, " = ", absl::FormatDuration(timeout), " is outside (0, ",
                       absl::FormatDuration(kMaxTimeout), "]"));
    }
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
  if (running_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("HTTP server on ", options_.host, ":", port(), " is already started"));
  }
  auto running = std::make_unique<Running>(options_.threads);
  beast::error_code error;
  tcp::resolver resolver(running->io);
  const tcp::resolver::results_type endpoints =
      resolver.resolve(options_.host, absl::StrCat(options_.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, error);
  bool bound = false;
  for (const tcp::resolver::results_type::value_type& entry : endpoints) {
    if (error) break;
    tcp::acceptor& acceptor = running->acceptor;
    beast::error_code failed;
    acceptor.open(entry.endpoint().protocol(), failed);
    // SO_REUSEADDR only: SO_REUSEPORT would let a second process bind a port already in use and
    // silently take half of its connections.
    if (!failed) acceptor.set_option(asio::socket_base::reuse_address(true), failed);
    if (!failed) acceptor.bind(entry.endpoint(), failed);
    if (!failed) acceptor.listen(asio::socket_base::max_listen_connections, failed);
    if (!failed) {
      bound = true;
      break;
    }
    beast::error_code ignored;
    acceptor.close(ignored);
  }
  const int bound_port = bound ? running->acceptor.local_endpoint(error).port() : 0;
  if (!bound || error) {
    return absl::UnavailableError(absl::StrCat("cannot bind the HTTP server to ", Address(options_),
                                               ": the port is in use or the host is not local"));
  }
  Accept(*running);
  for (int i = 0; i < kIoThreads; ++i) {
    running->io_threads.emplace_back([io = &running->io] { io->run(); });
  }
  running_ = std::move(running);
  port_.store(bound_port, std::memory_order_release);
  return absl::OkStatus();
}

void HttpServer::Accept(Running& running) {
  if (!running.acceptor.is_open()) return;
  running.acceptor.async_accept(
      asio::make_strand(running.io), [this, &running](beast::error_code error, tcp::socket socket) {
        if (error == asio::error::operation_aborted) return;  // Stop closed the acceptor
        if (error) {
          running.accept_retry.expires_after(kAcceptRetryDelay);
          running.accept_retry.async_wait([this, &running](beast::error_code waited) {
            if (!waited) Accept(running);
          });
          return;
        }
        std::shared_ptr<Connection> connection;
        {
          std::lock_guard<std::mutex> lock(running.mu);
          if (!running.stopping.load() &&
              running.connections.size() < static_cast<size_t>(options_.max_connections)) {
            connection =
                std::make_shared<Connection>(*this, running, running.next_id, std::move(socket));
            running.connections.emplace(running.next_id++, connection);
          }
        }
        // One over the cap is closed here (by `socket`'s destructor), not queued: its client
        // learns at once, and an open connection costs a descriptor and a buffer.
        if (connection != nullptr) connection->Start();
        Accept(running);
      });
}

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (running_ == nullptr) return;
  Running& running = *running_;
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard<std::mutex> connections_lock(running.mu);
    running.stopping.store(true);
    for (const auto& [id, weak] : running.connections) {
      if (std::shared_ptr<Connection> connection = weak.lock()) open.push_back(connection);
    }
  }
  asio::post(running.accept_strand, [&running] {
    beast::error_code ignored;
    running.acceptor.close(ignored);
    running.accept_retry.cancel();
  });
  for (const std::shared_ptr<Connection>& connection : open) connection->CloseIfWaiting();
  open.clear();  // else the last of them could never end
  {
    std::unique_lock<std::mutex> connections_lock(running.mu);
    running.all_closed.wait(connections_lock, [&running] { return running.connections.empty(); });
  }
  running.work.reset();
  running.io.stop();
  for (std::thread& thread : running.io_threads) thread.join();
  running.handler_pool.join();
  running_.reset();
  port_.store(0, std::memory_order_release);
}

void HttpServer::CountRequest(const std::string& path, int code) {
  absl::StatusOr<Counter*> counter = metrics_->requests->WithLabels({path, absl::StrCat(code)});
  if (counter.ok()) (*counter)->Increment();
}

HttpResponse HttpServer::Respond(const HttpRequest& request) {
  const std::string& path = request.path;
  const bool known = path == kMetricsPath || path == kHealthzPath || path == kReadyzPath;
  if (!known) {
    for (HttpHandler* handler : options_.handlers) {
      std::optional<std::string> route = handler->Route(path);
      if (route.has_value()) return RespondToRoute(*handler, *route, request);
    }
  }
  const bool readable = request.method == "GET" || request.method == "HEAD";
  HttpResponse response;
  if (!known) {
    response.code = 404;
    response.body = "not found\n";
  } else if (!readable) {
    response.code = 405;
    response.body = "method not allowed\n";
    response.headers.emplace_back("Allow", "GET, HEAD");
  } else if (path == kHealthzPath) {
    const bool up = options_.readiness->state() != ReadinessState::kStopped;
    response.code = up ? 200 : 503;
    response.body = up ? "ok" : "stopped";
  } else if (path == kReadyzPath) {
    std::string reason;
    const ReadinessState state = options_.readiness->Get(&reason);
    response.code = state == ReadinessState::kServing ? 200 : 503;
    response.body = absl::StrCat(ReadinessStateName(state), ": ", reason);
  }
  // Counted before a /metrics body is made, so that a scrape sees itself.
  CountRequest(known ? path : kOtherPath, response.code);
  if (known && readable && path == kMetricsPath) {
    response.body = options_.registry->Serialize();
    response.content_type = kMetricsContentType;
  }
  return response;
}

HttpResponse HttpServer::RespondToRoute(HttpHandler& handler, const std::string& route,
                                        const HttpRequest& request) {
  HttpResponse response = handler.Handle(request);
  CountRequest(route, response.code);
  return response;
}

}  // namespace moetrain::server
