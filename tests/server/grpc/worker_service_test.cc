// WorkerService on a real grpc::Server (127.0.0.1, ephemeral port) over the Fleet of a real store
// and coordinator (the fleet tests' fixture), called through the generated stub by two workers
// that registered over the wire and run attempt 1 of a two-worker job: the rendezvous's long poll
// needs a timeout, ends at the caller's deadline (its handler returns too) and at its own timeout
// with the server's message; a flood of polls from one worker leaves one waiting, and the other
// worker's heartbeats go through.
#include "server/grpc/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/server/fleet/fleet_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "worker-service-test-token";

class WorkerServiceTest : public FleetTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(FleetTest::SetUp());
    StartFleet();
    service_ = std::make_unique<WorkerService>(fleet_.get(), kToken);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::WorkerService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

    ASSERT_NO_FATAL_FAILURE(RegisterOverTheWire("wire-worker", &worker_));
    ASSERT_NO_FATAL_FAILURE(RegisterOverTheWire("wire-peer", &peer_));

    job_id_ = Submit(2).id;
    const v1::Assignment assignment = AwaitAssignment(worker_.id);
    const v1::Assignment peer = AwaitAssignment(peer_.id);
    ASSERT_EQ(assignment.job_id(), job_id_);
    ASSERT_EQ(peer.job_id(), job_id_);
    attempt_ = assignment.attempt();
    ASSERT_OK(Heartbeat(worker_.id, {assignment}));
    ASSERT_OK(Heartbeat(peer_.id, {peer}));
    ASSERT_TRUE(WaitForState(job_id_, JobState::kRunning));
  }

  struct WireWorker {
    std::string id;
    std::string secret;
  };

  void RegisterOverTheWire(const std::string& name, WireWorker* worker) {
    v1::RegisterWorkerRequest registration;
    registration.set_name(name);
    registration.set_version("test");
    registration.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    registration.mutable_resources()->set_device_count(1);
    registration.mutable_resources()->set_threads(1);
    grpc::ClientContext context;
    Prepare(&context, std::chrono::seconds(10), nullptr);
    v1::RegisterWorkerResponse registered;
    const grpc::Status status = stub_->RegisterWorker(&context, registration, &registered);
    ASSERT_TRUE(status.ok()) << status.error_message();
    worker->id = registered.worker_id();
    worker->secret = registered.worker_secret();
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    FleetTest::TearDown();
  }

  // The token, the credentials of `as` (the wire worker by default; none when null) and a
  // deadline `timeout` from now.
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout) const {
    Prepare(context, timeout, &worker_);
  }
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout,
               const WireWorker* as) const {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    if (as != nullptr) {
      context->AddMetadata(kWorkerIdMetadata, as->id);
      context->AddMetadata(kWorkerSecretMetadata, as->secret);
    }
    context->set_deadline(std::chrono::system_clock::now() + timeout);
  }

  v1::KvWaitRequest WaitFor(const std::string& key) const {
    v1::KvWaitRequest request;
    request.set_job_id(job_id_);
    request.set_attempt(attempt_);
    request.set_key(key);
    return request;
  }

  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  WireWorker worker_;  // rank 0
  WireWorker peer_;    // rank 1
  std::string job_id_;
  int64_t attempt_ = 0;
};

// Every wait ends: without a timeout in the request, KvWait is refused, naming the field.
TEST_F(WorkerServiceTest, AKvWaitWithoutATimeoutIsInvalidArgument) {
  grpc::ClientContext context;
  Prepare(&context, std::chrono::seconds(10));
  v1::KvWaitResponse response;
  const grpc::Status status = stub_->KvWait(&context, WaitFor("never-set"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("timeout = 0"));
}

// A caller that gives up before the wait's timeout: the handler must notice that it is gone, or
// it would wait its whole minute.
TEST_F(WorkerServiceTest, AKvWaitEndsAtTheCallersDeadline) {
  grpc::ClientContext context;
  Prepare(&context, std::chrono::milliseconds(300));
  v1::KvWaitRequest request = WaitFor("never-set");
  request.mutable_timeout()->set_seconds(60);
  v1::KvWaitResponse response;
  const grpc::Status status = stub_->KvWait(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();

  // Shutdown waits for every handler to return: it returns only if KvWait's has.
  std::future<void> shutdown = std::async(std::launch::async, [this] { server_->Shutdown(); });
  if (shutdown.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "KvWait's handler still waits 60 s after its caller's deadline\n");
    std::abort();
  }
  server_.reset();
}

TEST_F(WorkerServiceTest, AKvWaitPastItsTimeoutIsDeadlineExceededWithTheServersMessage) {
  grpc::ClientContext context;
  Prepare(&context, std::chrono::seconds(60));
  v1::KvWaitRequest request = WaitFor("never-set");
  request.mutable_timeout()->set_nanos(100'000'000);
  v1::KvWaitResponse response;
  const grpc::Status status = stub_->KvWait(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("key 'never-set' of attempt ",
                                                             attempt_, " of job ", job_id_)));
}

// 64 GetAssignment calls of one worker at once, each asking to wait 30 s: each new one answers the
// one waiting before it, so all but one return (empty) at once instead of holding 64 server
// threads, and the other worker's heartbeats are answered meanwhile.
TEST_F(WorkerServiceTest, AFloodOfPollsFromOneWorkerLeavesOneWaiting) {
  constexpr int kPolls = 64;
  std::atomic<int> answered{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> polls;
  for (int i = 0; i < kPolls; ++i) {
    polls.emplace_back([&] {
      v1::GetAssignmentRequest request;
      request.set_worker_id(worker_.id);
      request.mutable_wait_timeout()->set_seconds(30);
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      Prepare(&context, std::chrono::seconds(60));
      const grpc::Status status = stub_->GetAssignment(&context, request, &response);
      if (!status.ok() || response.has_assignment() || response.cancel_size() > 0) ++failed;
      ++answered;
    });
  }
  const bool all_but_one = WaitUntil([&] { return answered.load() >= kPolls - 1; });
  EXPECT_TRUE(all_but_one) << answered.load() << " of " << kPolls << " polls answered";
  for (int i = 0; i < 3; ++i) {
    v1::HeartbeatRequest request;
    request.set_worker_id(peer_.id);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    Prepare(&context, std::chrono::seconds(10), &peer_);
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  // One more poll, which returns at once, answers the last one waiting.
  v1::GetAssignmentRequest last;
  last.set_worker_id(worker_.id);
  v1::GetAssignmentResponse response;
  grpc::ClientContext context;
  Prepare(&context, std::chrono::seconds(10));
  EXPECT_TRUE(stub_->GetAssignment(&context, last, &response).ok());
  for (std::thread& poll : polls) poll.join();
  EXPECT_EQ(answered.load(), kPolls);
  EXPECT_EQ(failed.load(), 0) << "a poll failed or carried orders";
}

}  // namespace
}  // namespace moetrain::server
