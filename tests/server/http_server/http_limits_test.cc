// What an unauthenticated client can make the HTTP endpoint hold: request bodies are capped (a
// large one is answered 413 and never buffered; one without a length is refused unread), and slow
// clients do not take the threads that answer /healthz. Raw sockets on 127.0.0.1 play the client.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/core/readiness.h"
#include "server/http/http_server.h"
#include "server/http/metrics.h"

namespace moetrain::server {
namespace {

constexpr char kHost[] = "127.0.0.1";
constexpr int64_t kHugeBodyBytes = int64_t{64} << 20;
// Far below the 64 MiB a buffered body costs, far above what the server's threads and the
// client's buffers add.
constexpr int64_t kMaxPeakGrowthBytes = int64_t{32} << 20;

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

// Everything the server sends until it closes, or until 10 s pass.
std::string ReadAnswer(int fd) {
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline && Readable(fd, 100)) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  return answer;
}

// Sends `head`, then up to `body_bytes` of body in 64 KiB pieces (`chunked`: each piece framed as
// a chunk), stopping early once the server answers or closes; returns its answer.
std::string SendLargeRequest(int port, const std::string& head, int64_t body_bytes, bool chunked) {
  const int fd = Connect(port);
  if (fd < 0) return "cannot connect";
  send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const std::string piece(64 << 10, 'x');
  const std::string chunk = absl::StrCat(absl::Hex(piece.size()), "\r\n", piece, "\r\n");
  for (int64_t sent = 0; sent < body_bytes; sent += static_cast<int64_t>(piece.size())) {
    if (Readable(fd, 0)) break;
    const std::string& data = chunked ? chunk : piece;
    if (send(fd, data.data(), data.size(), MSG_NOSIGNAL) < 0) break;
  }
  std::string answer = ReadAnswer(fd);
  close(fd);
  return answer;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(
        {.host = kHost, .port = 0, .registry = &registry_, .readiness = &readiness_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_TRUE(readiness_.Transition(ReadinessState::kServing, "test").ok());
  }

  MetricsRegistry registry_;
  Readiness readiness_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpLimitsTest, AnOversizedBodyIs413AndNeverBuffered) {
  const int64_t peak_before = PeakResidentBytes();
  const std::string answer = SendLargeRequest(
      server_->port(),
      absl::StrCat("POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: ", kHugeBodyBytes,
                   "\r\n\r\n"),
      kHugeBodyBytes, /*chunked=*/false);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413")) << answer.substr(0, 200);
  EXPECT_LT(PeakResidentBytes() - peak_before, kMaxPeakGrowthBytes)
      << "a 64 MiB body grew the server's memory";
  EXPECT_TRUE(absl::StrContains(registry_.Serialize(),
                                "moetrain_http_requests_total{path=\"other\",code=\"413\"} 1"))
      << registry_.Serialize();
}

TEST_F(HttpLimitsTest, ABodyWithoutALengthIsRefusedUnread) {
  const int64_t peak_before = PeakResidentBytes();
  const std::string answer = SendLargeRequest(
      server_->port(), "POST /healthz HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n",
      kHugeBodyBytes, /*chunked=*/true);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 411")) << answer.substr(0, 200);
  EXPECT_LT(PeakResidentBytes() - peak_before, kMaxPeakGrowthBytes)
      << "a 64 MiB chunked body grew the server's memory";
  EXPECT_TRUE(absl::StrContains(registry_.Serialize(),
                                "moetrain_http_requests_total{path=\"other\",code=\"411\"} 1"))
      << registry_.Serialize();
}

TEST_F(HttpLimitsTest, ASmallBodyIsStillAnswered) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  const std::string request =
      "POST /healthz HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  const std::string answer = ReadAnswer(fd);
  close(fd);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 405")) << answer;
}

TEST_F(HttpLimitsTest, SlowClientsDoNotStallHealthz) {
  // 16 clients that each send one header line a second and never finish their request.
  constexpr int kSlowClients = 16;
  std::vector<int> slow;
  for (int i = 0; i < kSlowClients; ++i) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    const std::string line = "GET /healthz HTTP/1.1\r\n";
    send(fd, line.data(), line.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (int n = 0; !stop.load(); ++n) {
      for (int fd : slow) {
        const std::string line = absl::StrCat("X-Slow-", n, ": 1\r\n");
        send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      for (int i = 0; i < 10 && !stop.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));  // every slow client has a thread by now

  httplib::Client client(kHost, server_->port());
  client.set_connection_timeout(20);
  client.set_read_timeout(20);
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    httplib::Result result = client.Get("/healthz");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(result) << httplib::to_string(result.error()) << " after " << seconds << " s";
    if (!result) break;
    EXPECT_EQ(result->status, 200);
    // Generous for a loaded machine; stalled behind the slow clients it takes as long as they go
    // on.
    EXPECT_LT(seconds, 5.0) << "/healthz waited behind " << kSlowClients << " slow clients";
  }
  stop = true;
  trickle.join();
  for (int fd : slow) close(fd);
}

}  // namespace
}  // namespace moetrain::server
