// What the service tests share: the real daemons (`moetrain-coordinator`, `moetrain-worker`) as
// background processes on 127.0.0.1 with their output in log files, the real `moetrain` CLI, a
// JobService stub for looking at jobs, a small job spec whose steps take about a millisecond, and a
// real Prometheus server (Debian's `prometheus`) with its HTTP API. Every test works in a fresh
// directory and kills whatever it started.
#ifndef MOETRAIN_TESTS_INTEGRATION_SERVICE_TEST_UTIL_H_
#define MOETRAIN_TESTS_INTEGRATION_SERVICE_TEST_UTIL_H_

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/integration/tiny_spec.h"

namespace moetrain::testutil {

namespace fs = std::filesystem;

inline constexpr char kServiceToken[] = "service-test-token";

inline fs::path Binary(const std::string& name) { return fs::path(MOETRAIN_BIN_DIR) / name; }

inline std::string ReadWholeFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Polls `done` every 50 ms until it holds or `timeout` passes; returns its last answer.
inline bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// A background process whose stdout and stderr go to a log file (a daemon writes more than a pipe
// holds while nobody reads it). SIGKILLed when destroyed unless already reaped.
class Daemon {
 public:
  Daemon() = default;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() { Kill(); }

  // Empty on success, else what went wrong.
  std::string Start(const fs::path& binary, const std::vector<std::string>& args,
                    const fs::path& log, const EnvChanges& env = {}) {
    log_ = log;
    std::vector<std::string> env_storage = ChildEnvironment(env);
    const std::string program = binary.string();
    std::vector<char*> argv = {const_cast<char*>(program.c_str())};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (std::string& entry : env_storage) envp.push_back(entry.data());
    envp.push_back(nullptr);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0) return "cannot open " + log.string();
    const pid_t pid = fork();
    if (pid == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      execve(program.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(out);
    if (pid < 0) return "fork failed";
    pid_ = pid;
    return "";
  }

  std::string Log() const { return ReadWholeFile(log_); }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

  // SIGTERM, then waits up to `timeout` (SIGKILL after it); the exit code, or -1.
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    const bool exited = WaitUntil([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!exited) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = 0;
    return exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // Waits for the process to exit by itself; its exit code, or -1 (killed after `timeout`).
  int WaitExit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    int status = 0;
    const bool exited = WaitUntil([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!exited) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = 0;
    return exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = 0;
  fs::path log_;
};

// A port nobody listens on right now (bound, read back, released): Prometheus has no "any free
// port" of its own.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

inline constexpr char kPrometheusBinary[] = "/usr/bin/prometheus";

// Starts Prometheus in `dir` with `config` as its prometheus.yml, on a free 127.0.0.1 port, and
// waits until it is ready; its port, or 0 (with the reason as a test failure).
inline int StartPrometheus(Daemon& prometheus, const fs::path& dir, const std::string& config) {
  if (access(kPrometheusBinary, X_OK) != 0) {
    ADD_FAILURE() << "Debian's prometheus is not installed: run scripts/setup.sh";
    return 0;
  }
  std::ofstream(dir / "prometheus.yml") << config;
  const int port = FreePort();
  const std::string error =
      prometheus.Start(kPrometheusBinary,
                       {"--config.file=" + (dir / "prometheus.yml").string(),
                        "--storage.tsdb.path=" + (dir / "tsdb").string(),
                        absl::StrCat("--web.listen-address=127.0.0.1:", port)},
                       dir / "prometheus.log");
  if (!error.empty()) {
    ADD_FAILURE() << error;
    return 0;
  }
  httplib::Client client("127.0.0.1", port);
  const bool ready = WaitUntil(
      [&] {
        auto response = client.Get("/-/ready");
        return response && response->status == 200;
      },
      std::chrono::seconds(60));
  if (!ready) {
    ADD_FAILURE() << "Prometheus did not become ready:\n" << prometheus.Log();
    return 0;
  }
  return port;
}

// GET `path` of Prometheus' HTTP API with `params`: the `data` of a "success" answer, or null
// (with the answer in `error`).
inline nlohmann::json PrometheusApi(httplib::Client& client, const std::string& path,
                                    const httplib::Params& params, std::string* error = nullptr) {
  auto response = client.Get(path, params, httplib::Headers{});
  if (!response) {
    if (error != nullptr) *error = "no answer from Prometheus";
    return nullptr;
  }
  nlohmann::json answer = nlohmann::json::parse(response->body, nullptr, false);
  if (response->status != 200 || !answer.is_object() || answer.value("status", "") != "success") {
    if (error != nullptr) *error = absl::StrCat("HTTP ", response->status, ": ", response->body);
    return nullptr;
  }
  return answer["data"];
}

// The test job: TinySpec without evaluations (the tests follow training, not eval).
// Losses by step of `moetrain run SPEC --json` on one rank and one thread, checkpointing under
// dir/reference: the single-process reference the service's jobs are compared with.
inline std::map<int64_t, double> RunLosses(const fs::path& spec, const fs::path& dir) {
  Child run(Binary("moetrain"));
  EXPECT_EQ(
      run.Start({"run", spec.string(), "--checkpoint-dir", (dir / "reference").string(), "--json"},
                dir, {{"MOETRAIN_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}}),
      "");
  const Finished finished = run.Wait(std::chrono::seconds(300));
  EXPECT_EQ(finished.exit_code, 0) << finished.err;
  std::map<int64_t, double> losses;
  for (const nlohmann::json& line : JsonLines(finished.out)) {
    if (line.contains("loss") && !line.contains("summary")) {
      losses[line.at("step").get<int64_t>()] = line.at("loss").get<double>();
    }
  }
  return losses;
}

inline TinySpec ServiceSpec(const std::string& name = "tiny") {
  TinySpec spec;
  spec.name = name;
  spec.steps = 60;
  spec.eval_every = 0;
  spec.checkpoint_every = 20;
  return spec;
}

// A coordinator, workers and the CLI, all real processes, in a fresh directory.
class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "moetrain_service_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "token") << kServiceToken << "\n";
  }

  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Starts the coordinator on `port` (0 = any) with a short heartbeat timeout; records the ports.
  void StartCoordinator(int port = 0, const std::vector<std::string>& extra = {}) {
    coordinator_ = std::make_unique<Daemon>();
    const fs::path log = dir_ / "coordinator.log";
    const size_t before = fs::exists(log) ? ReadWholeFile(log).size() : 0;
    std::vector<std::string> args = {"--listen",
                                     absl::StrCat("127.0.0.1:", port),
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--state-db",
                                     (dir_ / "state.db").string(),
                                     "--checkpoint-dir",
                                     (dir_ / "checkpoints").string(),
                                     "--token-file",
                                     (dir_ / "token").string(),
                                     "--heartbeat-timeout",
                                     "2s"};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_EQ(coordinator_->Start(Binary("moetrain-coordinator"), args, log), "");
    std::smatch match;
    const std::regex serving(R"(serving: grpc 127\.0\.0\.1:(\d+), http 127\.0\.0\.1:(\d+))");
    std::string text;
    ASSERT_TRUE(WaitUntil(
        [&] {
          text = ReadWholeFile(log).substr(before);
          return std::regex_search(text, match, serving);
        },
        std::chrono::seconds(30)))
        << "the coordinator did not start:\n"
        << text;
    grpc_port_ = std::stoi(match[1]);
    http_port_ = std::stoi(match[2]);
    ConnectOptions options;
    options.address = address();
    options.token_file = (dir_ / "token").string();
    absl::StatusOr<Connection> connection = Connect(options);
    ASSERT_TRUE(connection.ok()) << connection.status();
    connection_ = *connection;
    jobs_ = v1::JobService::NewStub(connection_.channel);
  }

  // Starts a worker named `name` (one thread, its own work directory).
  Daemon& StartWorker(const std::string& name, const std::vector<std::string>& extra = {}) {
    auto worker = std::make_unique<Daemon>();
    std::vector<std::string> args = {
        "--coordinator", address(), "--token-file", (dir_ / "token").string(),
        "--threads",     "1",       "--work-dir",   (dir_ / name).string(),
        "--name",        name};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string error =
        worker->Start(Binary("moetrain-worker"), args, dir_ / (name + ".log"),
                      {{"MOETRAIN_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}});
    EXPECT_EQ(error, "");
    Daemon& started = *worker;
    workers_[name] = std::move(worker);
    return started;
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

  fs::path WriteSpec(const TinySpec& job) {
    const fs::path path = dir_ / (job.name + ".yaml");
    std::ofstream(path) << job.Yaml();
    return path;
  }

  // `moetrain args... --coordinator ADDR --token-file FILE`, to its end.
  Finished Moetrain(std::vector<std::string> args, bool with_token = true,
                    std::chrono::seconds timeout = std::chrono::seconds(120)) {
    args.insert(args.end(), {"--coordinator", address()});
    if (with_token) args.insert(args.end(), {"--token-file", (dir_ / "token").string()});
    Child child(Binary("moetrain"));
    EXPECT_EQ(child.Start(args, dir_, {{"MOETRAIN_TOKEN_FILE", std::nullopt}}), "");
    Finished finished = child.Wait(timeout);
    EXPECT_FALSE(finished.timed_out) << "moetrain hung; stderr:\n" << finished.err;
    return finished;
  }

  // Submits through the CLI and returns the job id.
  std::string Submit(const TinySpec& job, const std::string& submission_id = "") {
    std::vector<std::string> args = {"submit", WriteSpec(job).string(), "--json"};
    if (!submission_id.empty()) args.insert(args.end(), {"--id", submission_id});
    const Finished submitted = Moetrain(args);
    EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
    const nlohmann::json job_json = nlohmann::json::parse(submitted.out, nullptr, false);
    EXPECT_TRUE(job_json.is_object()) << submitted.out;
    return job_json.is_object() ? job_json.value("id", "") : "";
  }

  std::optional<v1::Job> GetJob(const std::string& job_id) {
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(5));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    if (!jobs_->GetJob(&context, request, &job).ok()) return std::nullopt;
    return job;
  }

  v1::JobState StateOf(const std::string& job_id) {
    std::optional<v1::Job> job = GetJob(job_id);
    return job.has_value() ? job->state() : v1::JOB_STATE_UNSPECIFIED;
  }

  bool WaitForState(const std::string& job_id, v1::JobState state,
                    std::chrono::seconds timeout = std::chrono::seconds(120)) {
    return WaitUntil([&] { return StateOf(job_id) == state; }, timeout);
  }

  // The job's whole recorded history.
  std::vector<v1::JobEvent> Events(const std::string& job_id) {
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(30));
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_no_wait(true);
    std::vector<v1::JobEvent> events;
    auto reader = jobs_->WatchJob(&context, request);
    for (v1::JobEvent event; reader->Read(&event);) events.push_back(event);
    EXPECT_TRUE(reader->Finish().ok());
    return events;
  }

  std::vector<v1::WorkerInfo> Workers() {
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(5));
    v1::ListWorkersResponse response;
    if (!jobs_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok()) return {};
    return {response.workers().begin(), response.workers().end()};
  }

  fs::path dir_;
  std::unique_ptr<Daemon> coordinator_;
  std::map<std::string, std::unique_ptr<Daemon>> workers_;
  int grpc_port_ = 0;
  int http_port_ = 0;
  Connection connection_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// The time an event was recorded, for ordering events of different jobs.
inline int64_t EventMicros(const v1::JobEvent& event) {
  return event.time().seconds() * 1000000 + event.time().nanos() / 1000;
}

// The first event moving the job to `state`, or nullptr.
inline const v1::JobEvent* FirstTransitionTo(const std::vector<v1::JobEvent>& events,
                                             v1::JobState state) {
  for (const v1::JobEvent& event : events) {
    if (event.has_state_change() && event.state_change().to() == state) return &event;
  }
  return nullptr;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_INTEGRATION_SERVICE_TEST_UTIL_H_
