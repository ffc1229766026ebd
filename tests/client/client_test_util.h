// What the client command tests share: a real CoordinatorServer in the test process on
// 127.0.0.1 (with a bearer token, a SQLite state file and a checkpoint directory in a fresh
// temporary directory), a test worker that speaks the real WorkerService protocol, and the real
// `moetrain` binary run as a child process against them.
#ifndef MOETRAIN_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
#define MOETRAIN_TESTS_CLIENT_CLIENT_TEST_UTIL_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "server/coordinator_server.h"
#include "tests/integration/child_process.h"
#include "tests/integration/tiny_spec.h"
#include "tests/server/coordinator_server/loopback_coordinator.h"
#include "tests/testing/testing.h"

namespace moetrain::testutil {

inline constexpr char kToken[] = "client-test-token";
// Only catches a hang: every command here takes well under a second.
inline constexpr std::chrono::seconds kCommandTimeout{60};

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// "127.0.0.1:PORT" where nothing listens: a port bound once by the kernel's choice, then released.
inline std::string DeadAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return absl::StrCat("127.0.0.1:", port);
}

inline void WriteTextFile(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A small valid spec; `top_k_line` is replaced to make bad ones.
inline std::string TinySpecYaml(const std::string& name, int64_t steps,
                                const std::string& top_k_line = "top_k: 2") {
  TinySpec spec;
  spec.name = name;
  spec.steps = steps;
  spec.eval_every = 0;
  spec.checkpoint_every = 5;
  spec.max_restarts = 1;
  spec.top_k_line = top_k_line;
  return spec.Yaml();
}

// The metrics the test worker reports for `step`: values a test can predict.
inline v1::StepMetrics TestStepMetrics(int64_t step) {
  v1::StepMetrics metrics;
  metrics.set_step(step);
  metrics.set_loss(4.0 - 0.015625 * static_cast<double>(step));
  if (step % 5 == 0) metrics.set_eval_loss(3.5);
  metrics.set_lr(1e-3);
  metrics.set_grad_norm(0.5);
  metrics.set_tokens_per_s(1000);
  metrics.set_expert_load_max_over_mean(1.25);
  metrics.set_tokens_seen(step * 128);
  metrics.set_aux_loss(0.01);
  metrics.set_step_seconds(0.01);
  return metrics;
}

// A worker without an engine: registers, takes one assignment, heartbeats it as running from a
// background thread, and reports what the test tells it to, through the real WorkerService.
class TestWorker {
 public:
  static absl::StatusOr<std::unique_ptr<TestWorker>> Register(
      const std::string& address, const std::string& token_file,
      const std::string& name = "test-worker") {
    ConnectOptions options;
    options.address = address;
    options.token_file = token_file;
    absl::StatusOr<Connection> connection = Connect(options);
    if (!connection.ok()) return connection.status();
    std::unique_ptr<TestWorker> worker(new TestWorker(*std::move(connection)));
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    request.set_version("test");
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    worker->connection_.Prepare(&context, absl::Seconds(10));
    absl::Status status =
        FromGrpcStatus(worker->stub_->RegisterWorker(&context, request, &response));
    if (!status.ok()) return status;
    worker->id_ = response.worker_id();
    worker->connection_.worker_id = response.worker_id();
    worker->connection_.worker_secret = response.worker_secret();
    return worker;
  }

  ~TestWorker() { StopHeartbeats(); }

  const std::string& id() const { return id_; }

  // Polls until the coordinator assigns a rank, then heartbeats it as running.
  absl::StatusOr<v1::Assignment> AwaitAssignment(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      v1::GetAssignmentRequest request;
      request.set_worker_id(id_);
      request.mutable_wait_timeout()->set_seconds(1);
      v1::GetAssignmentResponse response;
      grpc::ClientContext context;
      connection_.Prepare(&context, absl::Seconds(10));
      absl::Status status = FromGrpcStatus(stub_->GetAssignment(&context, request, &response));
      if (!status.ok()) return status;
      if (response.has_assignment()) {
        assignment_ = response.assignment();
        StartHeartbeats();
        return assignment_;
      }
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no assignment for worker ", id_, " within ", absl::FormatDuration(timeout)));
  }

  // Heartbeats that the coordinator answered OK so far.
  int64_t heartbeats_ok() const { return heartbeats_ok_.load(); }

  // Waits until a heartbeat sent after this call is answered OK (the coordinator has seen the
  // rank running).
  absl::Status AwaitHeartbeat(absl::Duration timeout) {
    const int64_t before = heartbeats_ok_.load();
    const absl::Time deadline = absl::Now() + timeout;
    // Two more: the one in flight at the call may have been sent before it.
    while (heartbeats_ok_.load() < before + 2) {
      if (absl::Now() >= deadline) {
        std::lock_guard<std::mutex> lock(mu_);
        return absl::DeadlineExceededError(absl::StrCat(
            "no heartbeat of worker ", id_, " answered OK; last error: ", last_heartbeat_error_));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::OkStatus();
  }

  absl::Status ReportStep(int64_t step) {
    v1::ReportStepRequest request;
    request.set_worker_id(id_);
    request.set_job_id(assignment_.job_id());
    request.set_attempt(assignment_.attempt());
    request.set_rank(assignment_.rank());
    *request.mutable_metrics() = TestStepMetrics(step);
    v1::ReportStepResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    last_step_ = step;
    return FromGrpcStatus(stub_->ReportStep(&context, request, &response));
  }

  absl::Status ReportLog(const std::vector<std::string>& lines) {
    v1::ReportLogRequest request;
    request.set_worker_id(id_);
    request.set_job_id(assignment_.job_id());
    request.set_attempt(assignment_.attempt());
    request.set_rank(assignment_.rank());
    for (const std::string& line : lines) request.add_lines(line);
    v1::ReportLogResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return FromGrpcStatus(stub_->ReportLog(&context, request, &response));
  }

  // Creates the step directory (the coordinator lists only checkpoints still on disk), then
  // reports it at the path the coordinator expects.
  absl::Status ReportCheckpoint(int64_t step) {
    const std::string path = absl::StrFormat("%s/step-%08d", assignment_.checkpoint_dir(), step);
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error)
      return absl::InternalError(absl::StrCat("cannot create ", path, ": ", error.message()));
    v1::ReportCheckpointRequest request;
    request.set_worker_id(id_);
    request.set_job_id(assignment_.job_id());
    request.set_attempt(assignment_.attempt());
    request.set_rank(assignment_.rank());
    request.set_step(step);
    request.set_path(path);
    request.set_tokens_seen(step * 128);
    v1::ReportCheckpointResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return FromGrpcStatus(stub_->ReportCheckpoint(&context, request, &response));
  }

  absl::Status ReportAttemptEnd(v1::AttemptOutcome outcome, int64_t step) {
    StopHeartbeats();
    v1::ReportAttemptEndRequest request;
    request.set_worker_id(id_);
    request.set_job_id(assignment_.job_id());
    request.set_attempt(assignment_.attempt());
    request.set_rank(assignment_.rank());
    request.set_outcome(outcome);
    request.set_step(step);
    v1::ReportAttemptEndResponse response;
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    return FromGrpcStatus(stub_->ReportAttemptEnd(&context, request, &response));
  }

 private:
  explicit TestWorker(Connection connection)
      : connection_(std::move(connection)),
        stub_(v1::WorkerService::NewStub(connection_.channel)) {}

  void StartHeartbeats() {
    stop_.store(false);
    heartbeat_thread_ = std::thread([this] {
      while (!stop_.load()) {
        v1::HeartbeatRequest request;
        request.set_worker_id(id_);
        v1::RunningAttempt* running = request.add_running();
        running->set_job_id(assignment_.job_id());
        running->set_attempt(assignment_.attempt());
        running->set_rank(assignment_.rank());
        running->set_step(last_step_.load());
        v1::HeartbeatResponse response;
        grpc::ClientContext context;
        connection_.Prepare(&context, absl::Seconds(2));
        const grpc::Status status = stub_->Heartbeat(&context, request, &response);
        if (status.ok()) {
          heartbeats_ok_.fetch_add(1);
        } else {
          // Expected while the coordinator restarts; kept for the test's failure messages.
          std::lock_guard<std::mutex> lock(mu_);
          last_heartbeat_error_ = FromGrpcStatus(status).ToString();
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
  }

  void StopHeartbeats() {
    stop_.store(true);
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }

  Connection connection_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string id_;
  v1::Assignment assignment_;  // set before the heartbeat thread starts, then only read
  std::atomic<int64_t> last_step_{0};
  std::atomic<int64_t> heartbeats_ok_{0};
  std::atomic<bool> stop_{false};
  std::thread heartbeat_thread_;
  std::mutex mu_;
  std::string last_heartbeat_error_;  // guarded by mu_
};

// A temporary directory with a token file and a coordinator serving from it; `moetrain` runs
// against it with --coordinator and --token-file (the environment's MOETRAIN_* settings removed).
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(MoetrainBinary())) << MoetrainBinary() << " is not built";
    token_file_ = (dir_ / "token").string();
    WriteTextFile(token_file_, std::string(kToken) + "\n");
    StartCoordinator(0);
  }

  void TearDown() override { StopCoordinator(); }

  static std::filesystem::path MoetrainBinary() {
    return std::filesystem::path(MOETRAIN_BIN_DIR) / "moetrain";
  }

  // Starts the coordinator on `port` (0 = any free one) over this test's state file; a restart
  // passes the port of the last one.
  void StartCoordinator(int port) {
    server::FleetOptions fleet;
    fleet.heartbeat_interval = absl::Milliseconds(200);
    fleet.heartbeat_timeout = absl::Seconds(2);
    fleet.reconcile_grace = absl::Milliseconds(300);
    fleet.control_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> server =
        testutil::StartLoopbackCoordinator(dir_, port, kToken, fleet);
    ASSERT_TRUE(server.ok()) << server.status();
    coordinator_ = *std::move(server);
    port_ = coordinator_->grpc_port();
  }

  void StopCoordinator() {
    if (coordinator_ != nullptr) coordinator_->Shutdown();
    coordinator_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  std::unique_ptr<TestWorker> RegisterWorker(const std::string& name = "test-worker") {
    absl::StatusOr<std::unique_ptr<TestWorker>> worker =
        TestWorker::Register(address(), token_file_, name);
    EXPECT_TRUE(worker.ok()) << worker.status();
    return worker.ok() ? *std::move(worker) : nullptr;
  }

  // Writes `yaml` as <dir>/<file>; returns the path.
  std::string WriteSpec(const std::string& yaml, const std::string& file = "spec.yaml") {
    WriteTextFile(dir_ / file, yaml);
    return (dir_ / file).string();
  }

  // `args` plus the coordinator flags, unless `with_flags` is false.
  std::vector<std::string> Args(std::vector<std::string> args, bool with_flags = true) const {
    if (with_flags) {
      args.insert(args.end(), {"--coordinator", address(), "--token-file", token_file_});
    }
    return args;
  }

  static EnvChanges CleanEnv() {
    return {{"MOETRAIN_COORDINATOR", std::nullopt}, {"MOETRAIN_TOKEN_FILE", std::nullopt}};
  }

  // Runs `moetrain args...` to its end (killed past kCommandTimeout).
  Finished Moetrain(const std::vector<std::string>& args, const EnvChanges& env = CleanEnv()) {
    Child child(MoetrainBinary());
    const std::string error = child.Start(args, dir_, env);
    if (!error.empty()) {
      ADD_FAILURE() << "cannot start moetrain: " << error;
      return Finished();
    }
    Finished finished = child.Wait(kCommandTimeout);
    EXPECT_FALSE(finished.timed_out) << "moetrain hung and was killed; stderr:\n" << finished.err;
    return finished;
  }

  // `moetrain submit spec --json`, expected to succeed; the job's id.
  std::string Submit(const std::string& spec_path, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"submit", spec_path, "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Finished submit = Moetrain(Args(args));
    EXPECT_EQ(submit.exit_code, 0) << submit.err;
    const std::vector<nlohmann::json> lines = JsonLines(submit.out);
    EXPECT_EQ(lines.size(), 1u) << submit.out;
    return lines.empty() ? "" : lines[0].value("id", "");
  }

  const testutil::TempDir temp_dir_{"moetrain_client"};
  const std::filesystem::path dir_ = temp_dir_.path();
  std::string token_file_;
  std::unique_ptr<server::CoordinatorServer> coordinator_;
  int port_ = 0;
};

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
