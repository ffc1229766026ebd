// A JobService on a real grpc::Server (127.0.0.1, ephemeral port) over a Coordinator, a Fleet
// and a SQLite store in a fresh temporary directory, called through the generated stub.
#ifndef MOETRAIN_TESTS_SERVER_GRPC_JOB_SERVICE_FIXTURE_H_
#define MOETRAIN_TESTS_SERVER_GRPC_JOB_SERVICE_FIXTURE_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "server/grpc/job_service.h"
#include "tests/server/grpc/generic_unary_call.h"
#include "tests/testing/testing.h"

namespace moetrain::server {

inline constexpr char kFixtureToken[] = "limits-test-token";

class JobServiceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpoint_dir_ = dir_ / "checkpoints";
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open((dir_ / "coordinator.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    coordinator_ = std::make_unique<Coordinator>(store_.get());
    FleetOptions fleet_options;
    fleet_options.checkpoint_dir = checkpoint_dir_.string();
    absl::StatusOr<std::unique_ptr<Fleet>> fleet =
        Fleet::Create(store_.get(), coordinator_.get(), nullptr, fleet_options);
    ASSERT_TRUE(fleet.ok()) << fleet.status();
    fleet_ = std::move(*fleet);
    JobServiceOptions options;
    options.bearer_token = kFixtureToken;
    options.watch_cancel_check_interval = absl::Milliseconds(20);
    service_ = std::make_unique<JobService>(coordinator_.get(), fleet_.get(), options);

    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakeParseErrorInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(creators));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = v1::JobService::NewStub(channel_);
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
    service_.reset();
    fleet_.reset();
    coordinator_.reset();
    store_.reset();
  }

  static void Authorize(grpc::ClientContext* context, const std::string& token = kFixtureToken) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }

  static v1::SubmitJobRequest Submission(const std::string& submission_id, int32_t priority = 0) {
    v1::SubmitJobRequest request;
    request.set_submission_id(submission_id);
    request.mutable_spec()->set_name("tiny");
    request.set_priority(priority);
    return request;
  }

  grpc::Status Submit(const v1::SubmitJobRequest& request, v1::Job* job) {
    grpc::ClientContext context;
    Authorize(&context);
    return stub_->SubmitJob(&context, request, job);
  }

  v1::Job MustSubmit(const std::string& submission_id) {
    v1::Job job;
    grpc::Status status = Submit(Submission(submission_id), &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  grpc::Status Cancel(const std::string& job_id, const std::string& reason, v1::Job* job) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    request.set_reason(reason);
    grpc::ClientContext context;
    Authorize(&context);
    return stub_->CancelJob(&context, request, job);
  }

  // Every page of ListJobs, as `moetrain jobs` reads them; the first failed call's status.
  grpc::Status ListAll(std::vector<v1::Job>* jobs, int* pages) {
    v1::ListJobsRequest request;
    request.set_page_size(1000);
    *pages = 0;
    do {
      v1::ListJobsResponse response;
      grpc::ClientContext context;
      Authorize(&context);
      grpc::Status status = stub_->ListJobs(&context, request, &response);
      if (!status.ok()) return status;
      ++*pages;
      for (const v1::Job& job : response.jobs()) jobs->push_back(job);
      request.set_page_token(response.next_page_token());
    } while (!request.page_token().empty());
    return grpc::Status::OK;
  }

  // `bytes` sent as the request of `method` through the generic stub, unparsed.
  grpc::Status RawCall(const std::string& method, const std::string& bytes) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    Authorize(&context);
    return testutil::GenericUnaryCall(generic, &context, method, bytes);
  }

  const testutil::TempDir temp_dir_{"job_service_test"};
  const std::filesystem::path dir_ = temp_dir_.path();
  std::filesystem::path checkpoint_dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<JobService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_TESTS_SERVER_GRPC_JOB_SERVICE_FIXTURE_H_
