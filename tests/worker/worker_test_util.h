// What the worker tests share: a real CoordinatorServer on a loopback port over a state file in a
// fresh directory, a Connection to it (moetrain::Connect, with the bearer token when the test sets
// one), and the workers' side of getting a job running: register, submit a job of one or two
// workers, take its assignments and heartbeat the ranks from a thread of the test until TearDown.
#ifndef MOETRAIN_TESTS_WORKER_WORKER_TEST_UTIL_H_
#define MOETRAIN_TESTS_WORKER_WORKER_TEST_UTIL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/proto_time.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "server/coordinator_server.h"
#include "tests/server/coordinator_server/loopback_coordinator.h"
#include "tests/testing/testing.h"

namespace moetrain::worker_test {

// How long a test waits for what should happen soon; only a failing test waits this long.
inline constexpr absl::Duration kPatience = absl::Seconds(30);

// Polls `done` until it holds or kPatience runs out; true when it held.
template <typename Condition>
bool WaitUntil(Condition done) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class CoordinatorFixture : public ::testing::Test {
 protected:
  // `name` names the temporary directory, the worker, the job and its submission.
  explicit CoordinatorFixture(std::string name, std::string bearer_token = "")
      : name_(std::move(name)), bearer_token_(std::move(bearer_token)), dir_(name_) {}

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(0));
    ConnectOptions options;
    options.address = address();
    ASSERT_OK_AND_ASSIGN(connection_, Connect(options));
    connection_.token = bearer_token_;
    jobs_ = v1::JobService::NewStub(connection_.channel);
    workers_ = v1::WorkerService::NewStub(connection_.channel);
  }

  void TearDown() override {
    StopHeartbeats();
    StopCoordinator();
  }

  std::string state_db() const { return testutil::LoopbackStateDb(dir_.path()).string(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // Starts the coordinator on `port` (0 = any free one) over this test's state file. The grace
  // period is long enough for the heartbeats to come back through a reconnecting channel.
  void StartCoordinator(int port) {
    server::FleetOptions fleet;
    fleet.heartbeat_interval = absl::Milliseconds(100);
    fleet.heartbeat_timeout = absl::Seconds(20);
    fleet.reconcile_grace = absl::Seconds(20);
    fleet.control_interval = absl::Milliseconds(20);
    ASSERT_OK_AND_ASSIGN(
        coordinator_, testutil::StartLoopbackCoordinator(dir_.path(), port, bearer_token_, fleet));
    port_ = coordinator_->grpc_port();
  }

  void StopCoordinator() {
    if (coordinator_ != nullptr) coordinator_->Shutdown();
    coordinator_.reset();
  }

  // Registers a worker, submits a job of `workers` workers (1 or 2; the second registered as
  // "<name>-peer", on peer_connection_), takes its ranks and heartbeats them from a thread of the
  // test until TearDown: the job is RUNNING when this returns. This worker runs rank 0.
  void StartRunningJob(int workers = 1) {
    ASSERT_NO_FATAL_FAILURE(RegisterOn(name_, &connection_));
    worker_id_ = connection_.worker_id;
    if (workers > 1) {
      peer_connection_ = connection_;
      ASSERT_NO_FATAL_FAILURE(RegisterOn(absl::StrCat(name_, "-peer"), &peer_connection_));
    }

    v1::SubmitJobRequest submit;
    submit.set_submission_id(absl::StrCat(name_, "-1"));
    const std::string spec = absl::StrCat("name: ", name_, "\ntrain:\n  steps: ", steps_,
                                          "\nresources:\n  workers: ", workers, "\n");
    ASSERT_OK_AND_ASSIGN(*submit.mutable_spec(), ParseJobSpecYaml(spec));
    v1::Job job;
    grpc::ClientContext submit_context;
    connection_.Prepare(&submit_context, absl::Seconds(10));
    const grpc::Status submitted = jobs_->SubmitJob(&submit_context, submit, &job);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    job_id_ = job.id();

    ASSERT_NO_FATAL_FAILURE(AwaitAssignment(connection_, &assignment_));
    if (workers > 1) {
      ASSERT_NO_FATAL_FAILURE(AwaitAssignment(peer_connection_, &peer_assignment_));
      if (assignment_.rank() != 0) {
        std::swap(connection_, peer_connection_);
        std::swap(assignment_, peer_assignment_);
        worker_id_ = connection_.worker_id;
      }
    }
    StartHeartbeats();
    ASSERT_TRUE(WaitUntil([&] { return GetJob().state() == v1::JOB_STATE_RUNNING; }));
  }

  // Registers a worker named `name` with `connection`'s channel and token; sets its worker_id
  // and worker_secret, so that every later call on it (and of the stores and reporters made
  // from it) proves that worker.
  void RegisterOn(const std::string& name, Connection* connection) {
    v1::RegisterWorkerRequest registration;
    registration.set_name(name);
    registration.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    registration.mutable_resources()->set_device_count(1);
    registration.mutable_resources()->set_threads(1);
    v1::RegisterWorkerResponse registered;
    grpc::ClientContext context;
    connection->Prepare(&context, absl::Seconds(10));
    const grpc::Status status = workers_->RegisterWorker(&context, registration, &registered);
    ASSERT_TRUE(status.ok()) << status.error_message();
    connection->worker_id = registered.worker_id();
    connection->worker_secret = registered.worker_secret();
  }

  // Polls as `connection`'s worker until it is given a rank of the job.
  void AwaitAssignment(const Connection& connection, v1::Assignment* assignment) {
    const absl::Time deadline = absl::Now() + kPatience;
    while (!assignment->has_spec()) {
      ASSERT_LT(absl::Now(), deadline) << "no assignment";
      v1::GetAssignmentRequest poll;
      poll.set_worker_id(connection.worker_id);
      ToProtoDuration(absl::Seconds(1), poll.mutable_wait_timeout());
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      connection.Prepare(&context, absl::Seconds(10));
      const grpc::Status polled = workers_->GetAssignment(&context, poll, &response);
      ASSERT_TRUE(polled.ok()) << polled.error_message();
      if (response.has_assignment()) *assignment = response.assignment();
    }
    ASSERT_EQ(assignment->job_id(), job_id_);
  }

  void StartHeartbeats() {
    heartbeat_thread_ = std::thread([this] {
      const std::unique_ptr<v1::WorkerService::Stub> stub =
          v1::WorkerService::NewStub(connection_.channel);
      while (!stop_heartbeats_.load()) {
        for (const auto& [connection, assignment] :
             {std::pair(&connection_, &assignment_),
              std::pair(&peer_connection_, &peer_assignment_)}) {
          if (connection->worker_id.empty()) continue;  // no peer
          v1::HeartbeatRequest request;
          request.set_worker_id(connection->worker_id);
          v1::RunningAttempt* running = request.add_running();
          running->set_job_id(assignment->job_id());
          running->set_attempt(assignment->attempt());
          running->set_rank(assignment->rank());
          v1::HeartbeatResponse response;
          grpc::ClientContext context;
          connection->Prepare(&context, absl::Seconds(2));
          // Failures are expected while the coordinator restarts.
          stub->Heartbeat(&context, request, &response);
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
    });
  }

  void StopHeartbeats() {
    stop_heartbeats_.store(true);
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }

  v1::Job GetJob() {
    v1::GetJobRequest request;
    request.set_job_id(job_id_);
    v1::Job job;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    const grpc::Status status = jobs_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  const std::string name_;
  // The job's train.steps: where SUCCEEDED may end it, with the checkpoint of that step.
  int64_t steps_ = 20;
  const std::string bearer_token_;  // empty = the coordinator asks for none
  const testutil::TempDir dir_;     // named after name_; declared before coordinator_, outlives it
  std::unique_ptr<server::CoordinatorServer> coordinator_;
  int port_ = 0;
  Connection connection_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::string worker_id_;
  std::string job_id_;
  v1::Assignment assignment_;  // set before the heartbeat thread starts, then only read
  // The second worker of a two-worker job, and its rank (1); no worker_id without one.
  Connection peer_connection_;
  v1::Assignment peer_assignment_;
  std::atomic<bool> stop_heartbeats_{false};
  std::thread heartbeat_thread_;
};

}  // namespace moetrain::worker_test

#endif  // MOETRAIN_TESTS_WORKER_WORKER_TEST_UTIL_H_
