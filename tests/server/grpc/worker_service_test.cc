// WorkerService on a real grpc::Server (127.0.0.1, ephemeral port) over the Fleet of a real store
// and coordinator (the fleet tests' fixture), called through the generated stub by a worker that
// registered over the wire and runs attempt 1 of a one-worker job: the rendezvous's long poll
// ends at the caller's deadline (its handler returns too) and at its own timeout with the
// server's message.
#include "server/grpc/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>

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

    v1::RegisterWorkerRequest registration;
    registration.set_name("wire-worker");
    registration.set_version("test");
    registration.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    registration.mutable_resources()->set_device_count(1);
    registration.mutable_resources()->set_threads(1);
    grpc::ClientContext context;
    Prepare(&context, std::chrono::seconds(10));
    v1::RegisterWorkerResponse registered;
    const grpc::Status status = stub_->RegisterWorker(&context, registration, &registered);
    ASSERT_TRUE(status.ok()) << status.error_message();
    worker_id_ = registered.worker_id();
    worker_secret_ = registered.worker_secret();

    job_id_ = Submit().id;
    const v1::Assignment assignment = AwaitAssignment(worker_id_);
    ASSERT_EQ(assignment.job_id(), job_id_);
    attempt_ = assignment.attempt();
    ASSERT_OK(Heartbeat(worker_id_, {assignment}));
    ASSERT_TRUE(WaitForState(job_id_, JobState::kRunning));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    FleetTest::TearDown();
  }

  // The token, the worker's credentials and a deadline `timeout` from now.
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout) const {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    if (!worker_id_.empty()) {
      context->AddMetadata(kWorkerIdMetadata, worker_id_);
      context->AddMetadata(kWorkerSecretMetadata, worker_secret_);
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
  std::string worker_id_;
  std::string worker_secret_;
  std::string job_id_;
  int64_t attempt_ = 0;
};

// No timeout in the request: the wait lasts until the call's deadline, and the handler must notice
// that its caller is gone, or it would wait for ever.
TEST_F(WorkerServiceTest, AKvWaitWithoutATimeoutEndsAtTheCallersDeadline) {
  grpc::ClientContext context;
  Prepare(&context, std::chrono::milliseconds(300));
  v1::KvWaitResponse response;
  const grpc::Status status = stub_->KvWait(&context, WaitFor("never-set"), &response);
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

}  // namespace
}  // namespace moetrain::server
