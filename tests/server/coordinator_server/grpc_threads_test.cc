// The coordinator's bound on gRPC threads (CoordinatorServerOptions::grpc_max_threads, gRPC's
// ResourceQuota): a real CoordinatorServer on 127.0.0.1 with 16 threads, and 40 workers each in a
// long poll, as many workers as a larger fleet: the server never runs more than 16 threads for
// calls, and answers the calls beyond them RESOURCE_EXHAUSTED at once instead of making a thread
// for each.
#include <dirent.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "server/coordinator_server.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

constexpr int kMaxThreads = 16;
constexpr int kWorkers = 40;

// Threads of this process that gRPC's synchronous server runs calls on (it names them
// "grpcpp_sync_server", which Linux cuts to 15 characters).
int SyncServerThreads() {
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  while (const dirent* task = readdir(tasks)) {
    if (task->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat("/proc/self/task/", task->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    if (absl::StartsWith(name, "grpcpp_sync")) ++count;
  }
  closedir(tasks);
  return count;
}

template <typename Condition>
bool WaitUntil(Condition done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(GrpcThreadsTest, CallsBeyondTheThreadBoundAreRefusedNotGivenThreads) {
  const testutil::TempDir dir("grpc_threads_test");
  CoordinatorServerOptions options;
  options.listen = "127.0.0.1:0";
  options.http_listen = "";
  options.state_db = (dir.path() / "coordinator.db").string();
  options.fleet.checkpoint_dir = (dir.path() / "checkpoints").string();
  options.fleet.heartbeat_timeout = absl::Minutes(5);  // nobody is lost during the test
  options.grpc_max_threads = kMaxThreads;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<CoordinatorServer> server,
                       CoordinatorServer::Start(options));
  ConnectOptions connect;
  connect.address = absl::StrCat("127.0.0.1:", server->grpc_port());
  ASSERT_OK_AND_ASSIGN(const Connection connection, Connect(connect));
  const std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(connection.channel);

  std::vector<Connection> workers;
  for (int i = 0; i < kWorkers; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("worker-", i));
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    connection.Prepare(&context, absl::Seconds(10));
    const grpc::Status status = stub->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
    Connection& worker = workers.emplace_back(connection);
    worker.worker_id = response.worker_id();
    worker.worker_secret = response.worker_secret();
    // A worker heartbeats at once (a client may have 16 registrations that never did).
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_worker_id(worker.worker_id);
    v1::HeartbeatResponse answer;
    grpc::ClientContext heartbeat_context;
    worker.Prepare(&heartbeat_context, absl::Seconds(10));
    ASSERT_TRUE(stub->Heartbeat(&heartbeat_context, heartbeat, &answer).ok());
  }
  ASSERT_GT(SyncServerThreads(), 0) << "no thread of gRPC's synchronous server found by name";

  // One long poll per worker, each allowed to wait 30 s.
  std::atomic<int> refused{0}, answered{0}, other{0};
  std::vector<std::thread> polls;
  for (const Connection& worker : workers) {
    polls.emplace_back([&, worker] {
      v1::GetAssignmentRequest request;
      request.set_worker_id(worker.worker_id);
      request.mutable_wait_timeout()->set_seconds(30);
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      worker.Prepare(&context, absl::Seconds(60));
      const grpc::Status status = stub->GetAssignment(&context, request, &response);
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++refused;
      } else if (status.ok()) {
        ++answered;
      } else {
        ++other;
      }
    });
  }
  // At most kMaxThreads polls hold a thread; the others are answered at once.
  const bool refusals = WaitUntil([&] { return refused.load() >= kWorkers - kMaxThreads; });
  const int threads = SyncServerThreads();
  EXPECT_TRUE(refusals) << refused.load() << " polls refused of " << kWorkers;
  EXPECT_LE(threads, kMaxThreads);
  // The coordinator's stop ends the polls that wait.
  server->Shutdown();
  for (std::thread& poll : polls) poll.join();
  EXPECT_EQ(refused.load() + answered.load() + other.load(), kWorkers);
}

TEST(GrpcThreadsTest, TooFewThreadsAreRefusedAtStart) {
  CoordinatorServerOptions options;
  options.grpc_max_threads = 4;
  const absl::Status status = options.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("--grpc-max-threads = 4"), std::string::npos) << status;
}

}  // namespace
}  // namespace moetrain::server
