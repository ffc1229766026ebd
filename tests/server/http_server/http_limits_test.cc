// What an unauthenticated client can make the HTTP endpoint hold: request bodies are capped for
// every method (a large one is answered 413 and never buffered; one without a length is refused
// unread), the header block is capped in bytes and in fields (431), the connections are capped
// (one more is closed at once), and neither slow clients nor slow handlers take the threads that
// answer /healthz. Raw sockets on 127.0.0.1 play the client.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/core/readiness.h"
#include "server/http/http_server.h"
#include "server/http/metrics.h"

namespace moetrain::server {
namespace {

constexpr char kHost[] = "127.0.0.1";
constexpr int64_t kHugeBytes = int64_t{64} << 20;
// Far below the 64 MiB a buffered body or header block costs, far above what the server's
// threads and the client's buffers add.
constexpr int64_t kMaxPeakGrowthBytes = int64_t{32} << 20;
// Longer than any test runs: a client the server holds stays held throughout, so that an answer
// that waited for the slow clients to time out would never come within ReadAnswer's 10 s.
constexpr absl::Duration kLongReadTimeout = absl::Seconds(60);

// The process's peak resident set (VmHWM), in bytes; the server runs in this process.
int64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, kHost, &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool Readable(int fd, int timeout_ms) {
  pollfd polled = {.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&polled, 1, timeout_ms) > 0;
}

void Send(int fd, const std::string& data) { send(fd, data.data(), data.size(), MSG_NOSIGNAL); }

// What the server sends on `fd` until it closes (`closed`), or until 10 s pass.
struct Answer {
  std::string text;
  bool closed = false;
};

Answer ReadAnswer(int fd) {
  Answer answer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    if (!Readable(fd, 100)) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      answer.closed = true;
      break;
    }
    answer.text.append(buffer, static_cast<size_t>(n));
  }
  return answer;
}

// A whole request on a connection of its own; the server's answer.
std::string Request(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "cannot connect";
  Send(fd, request);
  Answer answer = ReadAnswer(fd);
  close(fd);
  return answer.text;
}

std::string GetHealthz(int port) {
  return Request(port, "GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
}

// Sends `head`, then `piece` again and again until `total_bytes` are sent, stopping early once the
// server answers or closes; returns its answer.
std::string SendLargeRequest(int port, const std::string& head, const std::string& piece,
                             int64_t total_bytes) {
  const int fd = Connect(port);
  if (fd < 0) return "cannot connect";
  Send(fd, head);
  for (int64_t sent = 0; sent < total_bytes; sent += static_cast<int64_t>(piece.size())) {
    if (Readable(fd, 0)) break;
    if (send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) < 0) break;
  }
  Answer answer = ReadAnswer(fd);
  close(fd);
  return answer.text;
}

// What a flood sends: `head`, then `piece` again and again.
struct Flood {
  std::string head;
  std::string piece;
};

// `line` repeated to about 64 KiB.
std::string Repeated(const std::string& line) {
  std::string piece;
  while (piece.size() < (64 << 10)) piece += line;
  return piece;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  // A server on a free port of 127.0.0.1 with `options`' limits, SERVING.
  void Start(HttpServerOptions options = {}) {
    options.host = kHost;
    options.port = 0;
    options.registry = &registry_;
    options.readiness = &readiness_;
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_TRUE(readiness_.Transition(ReadinessState::kServing, "test").ok());
  }

  // Sends each flood's head, then 64 MiB of its piece: each is answered `code` (and counted under
  // "other"), and the server's peak memory grows by far less than one flood.
  void ExpectRefusedUnbuffered(const std::vector<Flood>& floods, int code) {
    const int64_t peak_before = PeakResidentBytes();
    for (const Flood& flood : floods) {
      const std::string answer =
          SendLargeRequest(server_->port(), flood.head, flood.piece, kHugeBytes);
      EXPECT_TRUE(absl::StartsWith(answer, absl::StrCat("HTTP/1.1 ", code)))
          << flood.head.substr(0, 80) << " got " << answer.substr(0, 200);
    }
    EXPECT_LT(PeakResidentBytes() - peak_before, kMaxPeakGrowthBytes)
        << "64 MiB requests grew the server's memory";
    const std::string counted = absl::StrCat("moetrain_http_requests_total{path=\"other\",code=\"",
                                             code, "\"} ", floods.size());
    EXPECT_TRUE(absl::StrContains(registry_.Serialize(), counted)) << registry_.Serialize();
  }

  MetricsRegistry registry_;
  Readiness readiness_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpLimitsTest, AnOversizedBodyIs413ForEveryMethodAndNeverBuffered) {
  Start();
  // A GET or a HEAD carries a body too when it says so; no method is exempt from the cap.
  std::vector<Flood> floods;
  for (const std::string method : {"POST", "GET", "HEAD"}) {
    floods.push_back({absl::StrCat(method, " /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: ",
                                   kHugeBytes, "\r\n\r\n"),
                      std::string(64 << 10, 'x')});
  }
  ExpectRefusedUnbuffered(floods, 413);
}

TEST_F(HttpLimitsTest, ABodyWithoutALengthIsRefusedUnread) {
  Start();
  const std::string data(64 << 10, 'x');
  ExpectRefusedUnbuffered(
      {{"POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n",
        absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n")}},
      411);
}

TEST_F(HttpLimitsTest, ASmallBodyIsStillAnswered) {
  Start();
  const std::string request =
      "POST /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 5\r\n\r\n";
  const std::string answer = Request(server_->port(), request + "hello");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 405")) << answer;
}

TEST_F(HttpLimitsTest, AnEndlessHeaderBlockIs431AndNeverBuffered) {
  Start();
  // Long lines meet the byte cap first, short ones the field cap; neither ends its header block.
  const std::string head = "GET /healthz HTTP/1.1\r\nHost: test\r\n";
  ExpectRefusedUnbuffered(
      {{head, Repeated(absl::StrCat("X-Flood: ", std::string(4000, 'a'), "\r\n"))},
       {head, Repeated("X-Flood: 1\r\n")}},
      431);
}

TEST_F(HttpLimitsTest, RequestsUnderTheHeaderCapsAreServed) {
  Start();
  const HttpServerOptions defaults;
  // Host and Connection are two of the fields.
  auto with_fields = [](int fields, int value_bytes) {
    std::string request = "GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n";
    for (int i = 2; i < fields; ++i) {
      absl::StrAppend(&request, "X-", i, ": ", std::string(value_bytes, 'v'), "\r\n");
    }
    return request + "\r\n";
  };
  EXPECT_TRUE(absl::StartsWith(Request(server_->port(), with_fields(defaults.max_header_count, 1)),
                               "HTTP/1.1 200"));
  EXPECT_TRUE(absl::StartsWith(
      Request(server_->port(), with_fields(defaults.max_header_count + 1, 1)), "HTTP/1.1 431"));

  const std::string head = "GET /healthz HTTP/1.1\r\nConnection: close\r\nX-Fill: ";
  auto with_bytes = [&head](int bytes) {
    return head + std::string(static_cast<size_t>(bytes) - head.size() - 4, 'f') + "\r\n\r\n";
  };
  EXPECT_TRUE(absl::StartsWith(Request(server_->port(), with_bytes(defaults.max_header_bytes)),
                               "HTTP/1.1 200"));
  EXPECT_TRUE(absl::StartsWith(Request(server_->port(), with_bytes(defaults.max_header_bytes + 1)),
                               "HTTP/1.1 431"));
}

TEST_F(HttpLimitsTest, HealthzIsAnsweredUnderManySlowClients) {
  Start({.read_timeout = kLongReadTimeout});
  // Half send nothing after connecting; half send one header line a second and never finish.
  constexpr int kSlowClients = 128;
  std::vector<int> silent, trickling;
  for (int i = 0; i < kSlowClients; ++i) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 0) {
      silent.push_back(fd);
    } else {
      Send(fd, "GET /healthz HTTP/1.1\r\n");
      trickling.push_back(fd);
    }
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int n = 0; !stop.load(); ++n) {
      for (int fd : trickling) {
        const std::string line = absl::StrCat("X-Slow-", n, ": 1\r\n");
        send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      for (int i = 0; i < 10 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // every slow client is accepted by now

  // Each probe is a new connection; one that waited for the slow clients would wait 60 s.
  for (int i = 0; i < 3; ++i) {
    const std::string answer = GetHealthz(server_->port());
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200")) << "probe " << i << ": " << answer;
  }
  stop = true;
  trickle.join();
  for (int fd : silent) close(fd);
  for (int fd : trickling) close(fd);
}

// Claims /slow, and answers it only once released.
class BlockingHandler : public HttpHandler {
 public:
  std::optional<std::string> Route(absl::string_view path) const override {
    if (path != "/slow") return std::nullopt;
    return std::string(path);
  }
  HttpResponse Handle(const HttpRequest&) override {
    ++entered_;
    released_.wait();
    HttpResponse response;
    response.body = "done";
    return response;
  }
  int entered() const { return entered_.load(); }
  void Release() { release_.set_value(); }

 private:
  std::atomic<int> entered_{0};
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
};

TEST_F(HttpLimitsTest, HealthzIsAnsweredWhileEveryHandlerThreadIsBusy) {
  BlockingHandler slow;
  constexpr int kThreads = 4;
  Start({.handlers = {&slow}, .threads = kThreads});
  std::vector<int> waiting;
  for (int i = 0; i < kThreads; ++i) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    Send(fd, "GET /slow HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    waiting.push_back(fd);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (slow.entered() < kThreads && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(slow.entered(), kThreads);

  // Every handler thread is held; the probe is answered all the same.
  EXPECT_TRUE(absl::StartsWith(GetHealthz(server_->port()), "HTTP/1.1 200"));
  slow.Release();
  for (int fd : waiting) {
    const Answer answer = ReadAnswer(fd);
    EXPECT_TRUE(absl::StartsWith(answer.text, "HTTP/1.1 200")) << answer.text;
    close(fd);
  }
}

TEST_F(HttpLimitsTest, ConnectionsOverTheCapAreClosedAtOnce) {
  constexpr int kMaxConnections = 8;
  Start({.max_connections = kMaxConnections, .read_timeout = kLongReadTimeout});
  std::vector<int> held;
  for (int i = 0; i < kMaxConnections; ++i) {
    held.push_back(Connect(server_->port()));
    ASSERT_GE(held.back(), 0);
  }
  // Accepted in order: these take every place, so the next one is closed, unanswered, at once
  // (not after the 60 s the held ones may take).
  const int over = Connect(server_->port());
  ASSERT_GE(over, 0);
  Send(over, "GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n");
  const Answer refused = ReadAnswer(over);
  close(over);
  EXPECT_TRUE(refused.closed) << "a connection over the cap was kept waiting";
  EXPECT_EQ(refused.text, "");

  // A place freed is a place taken: a new connection is served once the server sees one close.
  close(held.back());
  held.pop_back();
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!absl::StartsWith(answer, "HTTP/1.1 200") && std::chrono::steady_clock::now() < deadline) {
    answer = GetHealthz(server_->port());
  }
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200")) << answer;

  // Stop closes the connections still waiting for a request rather than waiting for them.
  server_->Stop();
  for (int fd : held) {
    EXPECT_TRUE(ReadAnswer(fd).closed);
    close(fd);
  }
}

}  // namespace
}  // namespace moetrain::server
