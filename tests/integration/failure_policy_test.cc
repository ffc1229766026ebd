// Failed attempts, waiting jobs and step reports between real processes (coordinator, worker,
// CLI on 127.0.0.1):
// - a spec no worker of this build can run is refused at submit, exit 2;
// - a job whose data cannot be trained fails at once, without restarts, and says why; so does a
//   `moetrain run --resume` over another model's checkpoint;
// - a failure a retry may fix restarts after a backoff that `describe` shows, and nothing starts
//   before it ends;
// - `describe` of a waiting job says why it waits;
// - ReportStep refuses steps outside the job's range and repeats.
// Where a test plays a worker itself, it speaks the real WorkerService protocol over gRPC.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/proto_time.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// `yaml` with `from` replaced by `to`; fails the test when `from` is not there.
std::string Edit(const std::string& yaml, const std::string& from, const std::string& to) {
  EXPECT_TRUE(absl::StrContains(yaml, from)) << from;
  return absl::StrReplaceAll(yaml, {{from, to}});
}

// A worker without an engine: the test decides what it reports.
class FakeWorker {
 public:
  explicit FakeWorker(Connection connection)
      : connection_(std::move(connection)),
        stub_(v1::WorkerService::NewStub(connection_.channel)) {}

  grpc::Status Register() {
    v1::RegisterWorkerRequest request;
    request.set_name("fake");
    request.set_version("test");
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    connection_.worker_id = id_ = response.worker_id();
    connection_.worker_secret = response.worker_secret();
    return status;
  }

  // Polls for up to `timeout`; an assignment found is shown running in a heartbeat.
  std::optional<v1::Assignment> AwaitAssignment(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      v1::GetAssignmentRequest request;
      request.set_worker_id(id_);
      request.mutable_wait_timeout()->set_seconds(1);
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      connection_.Prepare(&context, absl::Seconds(10));
      const grpc::Status status = stub_->GetAssignment(&context, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) return std::nullopt;
      if (response.has_assignment()) {
        EXPECT_TRUE(Heartbeat(&response.assignment()).ok());
        return response.assignment();
      }
      // Between polls: a worker that is silent for the heartbeat timeout is lost.
      Heartbeat(nullptr).IgnoreError();
    }
    return std::nullopt;
  }

  absl::Status Heartbeat(const v1::Assignment* running) {
    v1::HeartbeatRequest request;
    request.set_worker_id(id_);
    if (running != nullptr) {
      v1::RunningAttempt* attempt = request.add_running();
      attempt->set_job_id(running->job_id());
      attempt->set_attempt(running->attempt());
      attempt->set_rank(running->rank());
    }
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return FromGrpcStatus(stub_->Heartbeat(&context, request, &response));
  }

  grpc::Status ReportStep(const v1::Assignment& assignment, int64_t step) {
    v1::ReportStepRequest request;
    Address(assignment, &request);
    request.mutable_metrics()->set_step(step);
    request.mutable_metrics()->set_loss(2.0);
    request.mutable_metrics()->set_tokens_seen(step * 128);
    v1::ReportStepResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return stub_->ReportStep(&context, request, &response);
  }

  grpc::Status ReportFailure(const v1::Assignment& assignment, v1::FailureKind kind,
                             const std::string& message) {
    v1::ReportAttemptEndRequest request;
    Address(assignment, &request);
    request.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
    request.set_failure_kind(kind);
    request.set_message(message);
    v1::ReportAttemptEndResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return stub_->ReportAttemptEnd(&context, request, &response);
  }

 private:
  template <typename Request>
  void Address(const v1::Assignment& assignment, Request* request) const {
    request->set_worker_id(id_);
    request->set_job_id(assignment.job_id());
    request->set_attempt(assignment.attempt());
    request->set_rank(assignment.rank());
  }

  Connection connection_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string id_;
};

class FailurePolicyTest : public ServiceTest {
 protected:
  std::unique_ptr<FakeWorker> RegisterFakeWorker() {
    auto worker = std::make_unique<FakeWorker>(connection_);
    const grpc::Status status = worker->Register();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return worker;
  }

  // `moetrain describe JOB [--json]`'s standard output.
  std::string Describe(const std::string& job_id, bool json = false) {
    std::vector<std::string> args = {"describe", job_id};
    if (json) args.push_back("--json");
    const Finished described = Moetrain(args);
    EXPECT_EQ(described.exit_code, 0) << described.err;
    return described.out;
  }

  // `describe job_id` once it mentions `needle` (expected within a minute), or its last output.
  std::string DescribeOnceItSays(const std::string& job_id, const std::string& needle) {
    std::string text;
    EXPECT_TRUE(WaitUntil(
        [&] {
          text = Describe(job_id);
          return absl::StrContains(text, needle);
        },
        std::chrono::seconds(60)))
        << text;
    return text;
  }

  // How many attempts the job's history started.
  int AttemptsStarted(const std::string& job_id) {
    int started = 0;
    for (const v1::JobEvent& event : Events(job_id)) {
      started += event.has_state_change() && event.state_change().to() == v1::JOB_STATE_SCHEDULED;
    }
    return started;
  }
};

// A spec no worker could run (here an FP8 option its recipe does not read) exits 2 naming the
// field, and nothing is stored.
TEST_F(FailurePolicyTest, SubmitRefusesAnFp8OptionTheRecipeIgnoresWithExitTwo) {
  StartCoordinator();
  const std::string yaml = ServiceSpec("unrunnable").Yaml();
  std::ofstream(dir_ / "unrunnable.yaml")
      << Edit(yaml, "train:\n",
              "train:\n  precision: FP8\n  fp8: {recipe: DELAYED, power_2_scales: true}\n");
  const Finished submitted = Moetrain({"submit", (dir_ / "unrunnable.yaml").string()});
  EXPECT_EQ(submitted.exit_code, 2) << submitted.out << submitted.err;
  EXPECT_THAT(submitted.err, HasSubstr("train.fp8.power_2_scales = true"));
  const Finished jobs = Moetrain({"jobs", "--json"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_EQ(jobs.out, "{\"jobs\":[]}\n") << "a refused job was stored";
}

// The coordinator needs no GPU to accept a CUDA job; it never gives it to a CPU worker.
TEST_F(FailurePolicyTest, ACudaJobIsAcceptedAndWaitsForCudaWorkers) {
  StartCoordinator();
  StartWorker("a");
  ASSERT_TRUE(WaitUntil([&] { return Workers().size() == 1; }, std::chrono::seconds(60)));
  const std::string yaml = ServiceSpec("on-gpus").Yaml();
  std::ofstream(dir_ / "on-gpus.yaml")
      << Edit(yaml, "resources:\n", "resources:\n  device: CUDA\n");
  const Finished submitted = Moetrain({"submit", (dir_ / "on-gpus.yaml").string(), "--json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  const std::string id = nlohmann::json::parse(submitted.out)["id"];
  // `moetrain submit` stated the device memory a rank needs by the plan (client/job_plan.h).
  const std::string text = DescribeOnceItSays(id, "0 registered");
  EXPECT_THAT(text, HasSubstr("needs 1 CUDA worker with a device of "));
  EXPECT_THAT(text, HasSubstr("PENDING"));
}

TEST_F(FailurePolicyTest, DataWithTokenIdsPastTheVocabularyFailsTheJobAtOnce) {
  // 2,000 raw uint16 tokens below the vocabulary (64), but one.
  std::vector<uint16_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 64);
  tokens[1234] = 300;
  const fs::path data = dir_ / "tokens.u16";
  std::ofstream(data, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  TinySpec job = ServiceSpec("bad-data");
  job.max_restarts = 3;
  const std::string yaml = Edit(job.Yaml(), "  format: SYNTHETIC\n  synthetic_vocab_size: 32\n",
                                absl::StrCat("  format: U16\n  path: ", data.string(), "\n"));
  std::ofstream(dir_ / "bad-data.yaml") << yaml;

  StartCoordinator();
  StartWorker("a");
  const Finished submitted = Moetrain({"submit", (dir_ / "bad-data.yaml").string(), "--json"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = nlohmann::json::parse(submitted.out).value("id", "");
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FAILED, std::chrono::seconds(120)))
      << coordinator_->Log() << workers_.at("a")->Log();
  const std::optional<v1::Job> failed = GetJob(id);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->restarts(), 0);
  EXPECT_EQ(AttemptsStarted(id), 1);
  EXPECT_THAT(failed->state_reason(), HasSubstr("token 300"));
  EXPECT_THAT(failed->state_reason(), HasSubstr("not restarted"));
  EXPECT_THAT(Describe(id), HasSubstr("not restarted"));
}

TEST_F(FailurePolicyTest, ResumeOverAnotherModelsCheckpointFailsAtOnce) {
  TinySpec job = ServiceSpec("model");
  job.steps = 4;
  job.checkpoint_every = 2;
  std::ofstream(dir_ / "first.yaml") << job.Yaml();
  std::ofstream(dir_ / "other.yaml") << Edit(job.Yaml(), "hidden_size: 32", "hidden_size: 64");
  const std::vector<std::string> flags = {"--checkpoint-dir", (dir_ / "checkpoints").string()};
  Child first(Binary("moetrain"));
  std::vector<std::string> args = {"run", (dir_ / "first.yaml").string()};
  args.insert(args.end(), flags.begin(), flags.end());
  ASSERT_EQ(first.Start(args, dir_, {{"OMP_NUM_THREADS", "1"}}), "");
  const Finished trained = first.Wait(std::chrono::seconds(120));
  ASSERT_EQ(trained.exit_code, 0) << trained.err;

  Child other(Binary("moetrain"));
  args = {"run", (dir_ / "other.yaml").string(), "--resume"};
  args.insert(args.end(), flags.begin(), flags.end());
  ASSERT_EQ(other.Start(args, dir_, {{"OMP_NUM_THREADS", "1"}}), "");
  const Finished refused = other.Wait(std::chrono::seconds(120));
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("holds a different model"));
  EXPECT_THAT(refused.err, HasSubstr("not restarted"));
  EXPECT_THAT(refused.err, Not(HasSubstr("no restarts left")));
}

TEST_F(FailurePolicyTest, TransientFailureRestartsAfterABackoffThatDescribeShows) {
  StartCoordinator();
  std::unique_ptr<FakeWorker> worker = RegisterFakeWorker();
  const std::string id = Submit(ServiceSpec("flaky"));
  std::optional<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(60));
  ASSERT_TRUE(assignment.has_value());

  const absl::Time before = absl::Now();
  const grpc::Status reported = worker->ReportFailure(*assignment, v1::FAILURE_KIND_TRANSIENT,
                                                      "allreduce lost a peer: connection reset");
  ASSERT_TRUE(reported.ok()) << reported.error_message();
  const absl::Time after = absl::Now();
  std::optional<v1::Job> job = GetJob(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RESTARTING);
  EXPECT_EQ(job->restarts(), 1);
  ASSERT_TRUE(job->has_next_attempt_time()) << job->DebugString();
  const absl::Time due = FromProtoTimestamp(job->next_attempt_time());
  // The first backoff is 1 s.
  EXPECT_GE(due, before + absl::Seconds(1) - absl::Milliseconds(1));
  EXPECT_LE(due, after + absl::Seconds(1) + absl::Milliseconds(1));

  const std::string text = Describe(id);
  EXPECT_THAT(text, HasSubstr("Next attempt:"));
  EXPECT_THAT(text, HasSubstr("restart 1 of 3 in 1s"));
  EXPECT_THAT(Describe(id, /*json=*/true), HasSubstr("\"next_attempt_time\""));

  assignment = worker->AwaitAssignment(absl::Seconds(60));
  ASSERT_TRUE(assignment.has_value());
  EXPECT_GE(absl::Now(), due) << "the next attempt started before the backoff ended";
  EXPECT_EQ(assignment->attempt(), 2);
}

TEST_F(FailurePolicyTest, DescribeOfAWaitingJobSaysWhy) {
  StartCoordinator();
  StartWorker("a");
  ASSERT_TRUE(WaitUntil([&] { return Workers().size() == 1; }, std::chrono::seconds(60)));
  TinySpec gang = ServiceSpec("gang");
  gang.workers = 4;
  const std::string id = Submit(gang);
  const std::string reason = "needs 4 CPU workers, 1 registered";
  const std::string text = DescribeOnceItSays(id, "Waiting:");
  EXPECT_THAT(text, HasSubstr(reason));
  EXPECT_THAT(Describe(id, /*json=*/true),
              HasSubstr(absl::StrCat("\"waiting_reason\":\"", reason, "\"")));
}

TEST_F(FailurePolicyTest, ReportStepRefusesStepsOutsideTheJobAndRepeats) {
  StartCoordinator();
  std::unique_ptr<FakeWorker> worker = RegisterFakeWorker();
  const std::string id = Submit(ServiceSpec("steps"));  // train.steps = 60
  std::optional<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(60));
  ASSERT_TRUE(assignment.has_value());

  grpc::Status status = worker->ReportStep(*assignment, 1000000000000000000);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("metrics.step = 1000000000000000000"));
  status = worker->ReportStep(*assignment, 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();

  ASSERT_TRUE(worker->ReportStep(*assignment, 5).ok());
  status = worker->ReportStep(*assignment, 5);  // a retry whose first answer was lost
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  status = worker->ReportStep(*assignment, 4);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  // The real reports after the refused ones still count.
  ASSERT_TRUE(worker->ReportStep(*assignment, 6).ok());
  const std::optional<v1::Job> job = GetJob(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->last_metrics().step(), 6);
}

}  // namespace
}  // namespace moetrain::testutil
