// A holder of the shared bearer token who is not a worker, against a real coordinator and a real
// worker running a job: the worker ids ListWorkers publishes are no credential, so every forged
// WorkerService call about the worker's rank (progress, checkpoint, success, the rendezvous, its
// heartbeat and poll) is refused, and the job trains to its real end.
#include <chrono>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

constexpr int64_t kSteps = 1500;

// Who the script claims to be in the call's metadata, and what the coordinator must answer.
struct Disguise {
  std::string label;
  std::string metadata_id;       // x-moetrain-worker-id
  std::string secret;            // x-moetrain-worker-secret; empty = none
  grpc::StatusCode report_code;  // to calls whose request names the honest worker
  grpc::StatusCode kv_code;      // to the rendezvous calls
};

class WorkerAuthTest : public ServiceTest {
 protected:
  // A context as a script holding the shared token prepares it, in `disguise`.
  void PrepareForged(grpc::ClientContext* context, const Disguise& disguise) {
    connection_.Prepare(context, absl::Seconds(10));
    context->AddMetadata("x-moetrain-worker-id", disguise.metadata_id);
    if (!disguise.secret.empty()) context->AddMetadata("x-moetrain-worker-secret", disguise.secret);
  }
};

TEST_F(WorkerAuthTest, ATokenHolderWithAWorkerIdCannotActAsThatWorker) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  StartWorker("honest");
  TinySpec spec = ServiceSpec("long");
  spec.steps = kSteps;
  spec.log_every = 50;
  spec.checkpoint_every = 500;
  const std::string job_id = Submit(spec);
  ASSERT_FALSE(job_id.empty());
  ASSERT_TRUE(WaitForState(job_id, v1::JOB_STATE_RUNNING)) << coordinator_->Log();

  // What ListWorkers tells any token holder.
  std::string worker_id;
  int64_t attempt = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const v1::WorkerInfo& info : Workers()) {
          if (info.current_job_id() == job_id) {
            worker_id = info.id();
            attempt = info.current_attempt();
          }
        }
        return !worker_id.empty();
      },
      std::chrono::seconds(30)));
  auto stub = v1::WorkerService::NewStub(connection_.channel);
  const std::string checkpoint =
      absl::StrFormat("%s/%s/step-%08d", (dir_ / "checkpoints").string(), job_id, 39);

  // The token lets the script register a worker of its own, with a secret of its own; it stays
  // idle (the job runs on the honest worker) and is kept alive below.
  v1::RegisterWorkerRequest registration;
  registration.set_name("impostor");
  registration.mutable_resources()->set_device(v1::ResourceConfig::CPU);
  registration.mutable_resources()->set_device_count(1);
  registration.mutable_resources()->set_threads(1);
  v1::RegisterWorkerResponse own;
  {
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    ASSERT_TRUE(stub->RegisterWorker(&context, registration, &own).ok());
  }
  Connection impostor = connection_;
  impostor.worker_id = own.worker_id();
  impostor.worker_secret = own.worker_secret();
  auto keep_alive = [&] {
    v1::HeartbeatRequest request;
    request.set_worker_id(own.worker_id());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    impostor.Prepare(&context, absl::Seconds(10));
    const grpc::Status status = stub->Heartbeat(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  };

  const Disguise disguises[] = {
      {"no worker secret", worker_id, "", grpc::StatusCode::UNAUTHENTICATED,
       grpc::StatusCode::UNAUTHENTICATED},
      {"a guessed worker secret", worker_id, std::string(64, 'a'),
       grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::UNAUTHENTICATED},
      {"its own worker's secret as the honest worker's", worker_id, own.worker_secret(),
       grpc::StatusCode::UNAUTHENTICATED, grpc::StatusCode::UNAUTHENTICATED},
      {"its own worker's credentials", own.worker_id(), own.worker_secret(),
       grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::PERMISSION_DENIED}};
  for (const Disguise& disguise : disguises) {
    SCOPED_TRACE(disguise.label);
    keep_alive();
    {
      v1::ReportStepRequest request;
      request.set_worker_id(worker_id);
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_rank(0);
      request.mutable_metrics()->set_step(39);
      request.mutable_metrics()->set_loss(0.001);
      v1::ReportStepResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->ReportStep(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.report_code) << status.error_message();
    }
    {
      v1::ReportCheckpointRequest request;
      request.set_worker_id(worker_id);
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_rank(0);
      request.set_step(39);
      request.set_path(checkpoint);  // where a step 39 would be; none was written
      v1::ReportCheckpointResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->ReportCheckpoint(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.report_code) << status.error_message();
    }
    {
      v1::KvSetRequest request;
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_key("forged");
      request.set_value(std::string(1024, 'x'));
      v1::KvSetResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->KvSet(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.kv_code) << status.error_message();
    }
    {
      v1::HeartbeatRequest request;  // listing nothing would free the worker's rank
      request.set_worker_id(worker_id);
      v1::HeartbeatResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->Heartbeat(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.report_code) << status.error_message();
    }
    {
      v1::GetAssignmentRequest request;  // would read the worker's orders
      request.set_worker_id(worker_id);
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->GetAssignment(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.report_code) << status.error_message();
    }
    {
      v1::ReportAttemptEndRequest request;
      request.set_worker_id(worker_id);
      request.set_job_id(job_id);
      request.set_attempt(attempt);
      request.set_rank(0);
      request.set_outcome(v1::ATTEMPT_OUTCOME_SUCCEEDED);
      request.set_step(39);
      v1::ReportAttemptEndResponse response;
      grpc::ClientContext context;
      PrepareForged(&context, disguise);
      const grpc::Status status = stub->ReportAttemptEnd(&context, request, &response);
      EXPECT_EQ(status.error_code(), disguise.report_code) << status.error_message();
    }
    EXPECT_NE(StateOf(job_id), v1::JOB_STATE_SUCCEEDED) << "a forged end report finished the job";
  }

  // The honest worker's calls still go through: the job trains to its last step, unrestarted.
  ASSERT_TRUE(WaitForState(job_id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(600)))
      << "state " << v1::JobState_Name(StateOf(job_id)) << "\n"
      << coordinator_->Log();
  std::optional<v1::Job> job = GetJob(job_id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->last_metrics().step(), kSteps);
  EXPECT_EQ(job->latest_checkpoint_step(), kSteps);
  EXPECT_EQ(job->restarts(), 0);
  EXPECT_EQ(job->attempt(), 1);
}

// Issue 31, item 3: with a worker token (--worker-token-file), the users' token registers no
// worker, so holding it no longer means being given other users' ranks. Real binaries: the
// worker started with the users' token is refused and exits 1; the one with the worker token
// trains the job.
TEST_F(WorkerAuthTest, WithAWorkerTokenOnlyItsHoldersRegisterWorkers) {
  std::ofstream(dir_ / "worker-token") << "service-test-worker-token\n";
  ASSERT_NO_FATAL_FAILURE(
      StartCoordinator(0, {"--worker-token-file", (dir_ / "worker-token").string()}));
  Daemon& user = StartWorker("user");
  EXPECT_EQ(user.WaitExit(std::chrono::seconds(60)), 1) << user.Log();
  EXPECT_NE(user.Log().find("--worker-token-file"), std::string::npos) << user.Log();
  EXPECT_TRUE(Workers().empty());

  // --token-file is given too (StartWorker's): the worker token is the one sent.
  StartWorker("worker", {"--worker-token-file", (dir_ / "worker-token").string()});
  const std::string job_id = Submit(ServiceSpec("tokened"));
  ASSERT_FALSE(job_id.empty());
  ASSERT_TRUE(WaitForState(job_id, v1::JOB_STATE_SUCCEEDED))
      << "state " << v1::JobState_Name(StateOf(job_id)) << "\n"
      << coordinator_->Log();
}

}  // namespace
}  // namespace moetrain::testutil
