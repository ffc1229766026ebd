// Load on the coordinator's job API, end to end: the real moetrain-coordinator binary on a fresh
// state file, with no workers (so every job stays PENDING), and many concurrent clients.
//
//   coordinator_load_bench [--json] [--clients N (default 50)] [--jobs N (default 1000)]
//                          [--coordinator PATH (default: next to this binary)]
//
// Each client has its own channel and connection and submits its share of the jobs (a tiny-moe
// spec with a distinct name and submission id each); once every client has submitted, each one
// pages through ListJobs and calls GetJob on each job it submitted. Every call is timed. Then the
// coordinator gets SIGTERM, a new one starts on the same file, and ListJobs must return every
// submitted job. Exits 1 on any failed call or lost job. The latency targets (p99 of SubmitJob
// and GetJob under 50 ms) are printed, not enforced.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/bench_flags.h"
#include "engine/core/status.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job_spec.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr absl::Duration kCallTimeout = absl::Seconds(30);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kStopTimeout = absl::Seconds(30);
constexpr int kClientPageSize = 100;    // the server's default page, what `moetrain jobs` gets
constexpr int kRestartPageSize = 1000;  // the server's largest page
constexpr size_t kMaxErrorMessages = 5;
constexpr size_t kFdatasyncProbes = 50;
constexpr double kTargetP99Ms = 50;

// examples/tiny-moe.yaml, abridged: the spec is opaque to this load, only its size matters.
constexpr char kSpecYaml[] = R"(name: tiny-moe
model: {vocab_size: 256, hidden_size: 128, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        ffn_dim: 512, first_dense_layers: 1, max_seq_len: 128,
        moe: {num_experts: 8, top_k: 2, expert_ffn_dim: 128}}
data: {format: SYNTHETIC, synthetic_vocab_size: 64, seed: 7}
train: {steps: 300, batch_size: 16, seq_len: 128, precision: FP32, log_every: 10}
resources: {workers: 1, device: CPU}
)";

enum Method { kSubmitJob, kGetJob, kListJobs, kNumMethods };
constexpr const char* kMethodNames[kNumMethods] = {"SubmitJob", "GetJob", "ListJobs"};

// The calls of one method made by one client (or, merged, by all): latencies, the span of time
// they covered, and the failures.
struct MethodLog {
  std::vector<double> latency_ms;
  Clock::time_point first_start = Clock::time_point::max();
  Clock::time_point last_end = Clock::time_point::min();
  int64_t errors = 0;
  std::vector<std::string> error_messages;  // the first kMaxErrorMessages

  void AddError(const std::string& message) {
    ++errors;
    if (error_messages.size() < kMaxErrorMessages) error_messages.push_back(message);
  }
  void Merge(const MethodLog& other) {
    latency_ms.insert(latency_ms.end(), other.latency_ms.begin(), other.latency_ms.end());
    first_start = std::min(first_start, other.first_start);
    last_end = std::max(last_end, other.last_end);
    errors += other.errors;
    for (const std::string& message : other.error_messages) {
      if (error_messages.size() < kMaxErrorMessages) error_messages.push_back(message);
    }
  }
};

// One timed call: `call` issues the RPC on a context carrying the token and a deadline.
absl::Status TimedCall(const Connection& connection, Method method, MethodLog* log,
                       absl::FunctionRef<grpc::Status(grpc::ClientContext*)> call) {
  grpc::ClientContext context;
  connection.Prepare(&context, kCallTimeout);
  const Clock::time_point start = Clock::now();
  const absl::Status status = FromGrpcStatus(call(&context));
  const Clock::time_point end = Clock::now();
  log->latency_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  log->first_start = std::min(log->first_start, start);
  log->last_end = std::max(log->last_end, end);
  if (!status.ok()) log->AddError(absl::StrCat(kMethodNames[method], ": ", status.ToString()));
  return status;
}

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(fraction * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

// A channel with a connection of its own: gRPC otherwise shares one TCP connection among all
// channels with equal arguments, and the 50 clients would be one.
Connection NewConnection(const std::string& address, const std::string& token) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  Connection connection;
  connection.channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
  connection.token = token;
  return connection;
}

// Every job id ListJobs returns, page by page.
absl::StatusOr<std::vector<std::string>> ListAllJobIds(const Connection& connection, int page_size,
                                                       MethodLog* log) {
  const std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(connection.channel);
  std::vector<std::string> ids;
  v1::ListJobsRequest request;
  request.set_page_size(page_size);
  do {
    v1::ListJobsResponse response;
    MOETRAIN_RETURN_IF_ERROR(TimedCall(connection, kListJobs, log, [&](grpc::ClientContext* c) {
      return stub->ListJobs(c, request, &response);
    }));
    for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return ids;
}

// Median time of a 4 KiB write's fdatasync in `dir`: the floor under every store commit (SQLite
// WAL, synchronous=FULL), and what moves most between runs on a shared disk.
absl::StatusOr<double> MedianFdatasyncMs(const fs::path& dir) {
  const fs::path path = dir / "fdatasync-probe";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const std::string block(4096, 'x');
  std::vector<double> ms;
  while (fd >= 0 && ms.size() < kFdatasyncProbes && write(fd, block.data(), block.size()) > 0) {
    const Clock::time_point start = Clock::now();
    if (fdatasync(fd) != 0) break;
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  const int error = errno;
  if (fd >= 0) close(fd);
  std::error_code ignored;
  fs::remove(path, ignored);
  if (ms.size() < kFdatasyncProbes) {
    return absl::InternalError(
        absl::StrCat("fdatasync probe ", path.string(), ": ", strerror(error)));
  }
  std::sort(ms.begin(), ms.end());
  return Percentile(ms, 0.5);
}

// The bench's temporary folder, removed on every exit path: by the destructor, or, on SIGINT,
// SIGTERM or SIGHUP, by a watcher thread that first kills the coordinator (destructors do not run
// then). Create it before any other thread: they inherit the blocked signals, which then reach
// only the watcher.
class Workspace {
 public:
  static absl::StatusOr<std::unique_ptr<Workspace>> Create() {
    std::string dir = (fs::temp_directory_path() / "coordinator_load_bench.XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", dir, ": ", std::strerror(errno)));
    }
    return std::unique_ptr<Workspace>(new Workspace(dir));
  }
  ~Workspace() {
    stop_ = true;
    watcher_.join();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const fs::path& dir() const { return dir_; }
  std::atomic<pid_t> child{0};  // the running coordinator; 0 = none

 private:
  explicit Workspace(fs::path dir) : dir_(std::move(dir)) {
    sigemptyset(&signals_);
    for (int signal_number : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals_, signal_number);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    watcher_ = std::thread([this] { Watch(); });
  }
  void Watch() {
    const timespec poll_interval = {0, 100'000'000};  // how soon the destructor's stop_ is seen
    while (!stop_) {
      const int signal_number = sigtimedwait(&signals_, nullptr, &poll_interval);
      if (signal_number <= 0) continue;
      if (const pid_t pid = child.load(); pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      std::error_code ignored;
      fs::remove_all(dir_, ignored);
      std::fprintf(stderr, "coordinator_load_bench: %s\n", strsignal(signal_number));
      _exit(128 + signal_number);
    }
  }
  const fs::path dir_;
  sigset_t signals_;
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

struct CoordinatorArgs {
  fs::path binary;
  fs::path state_db, checkpoint_dir, token_file;
  fs::path log_file;  // its stderr and stdout; one per process, as the port is read from it
  std::string token;
};

// One moetrain-coordinator process on 127.0.0.1 with a free port. Killed (SIGKILL) when destroyed
// while still running; it also dies with the bench (PR_SET_PDEATHSIG) if the bench crashes.
class CoordinatorProcess {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(const CoordinatorArgs& args,
                                                                   Workspace* workspace) {
    std::unique_ptr<CoordinatorProcess> process(new CoordinatorProcess(args, workspace));
    MOETRAIN_RETURN_IF_ERROR(process->Spawn());
    MOETRAIN_RETURN_IF_ERROR(process->WaitUntilServing());
    return process;
  }
  ~CoordinatorProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    workspace_->child = 0;
  }

  // SIGTERM, then waits for a clean exit (status 0).
  absl::Status Stop() {
    const Clock::time_point signalled = Clock::now();
    kill(pid_, SIGTERM);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() - signalled > absl::ToChronoMilliseconds(kStopTimeout)) {
        return absl::DeadlineExceededError(absl::StrCat("the coordinator did not exit within ",
                                                        absl::FormatDuration(kStopTimeout),
                                                        " of SIGTERM; log:\n", LogTail()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop_s_ = std::chrono::duration<double>(Clock::now() - signalled).count();
    pid_ = 0;
    workspace_->child = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("the coordinator exited with status ", status,
                                              " after SIGTERM; log:\n", LogTail()));
    }
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }
  // From the spawn until the first answered call; from SIGTERM until the exit.
  double ready_s() const { return ready_s_; }
  double stop_s() const { return stop_s_; }

 private:
  CoordinatorProcess(CoordinatorArgs args, Workspace* workspace)
      : args_(std::move(args)), workspace_(workspace) {}

  absl::Status Spawn() {
    const std::string binary = args_.binary.string(), state_db = args_.state_db.string(),
                      checkpoint_dir = args_.checkpoint_dir.string(),
                      token_file = args_.token_file.string();
    const char* const argv[] = {binary.c_str(),   "--listen",         "127.0.0.1:0",
                                "--http-listen",  "127.0.0.1:0",      "--state-db",
                                state_db.c_str(), "--checkpoint-dir", checkpoint_dir.c_str(),
                                "--token-file",   token_file.c_str(), nullptr};
    const int log_fd =
        open(args_.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0) {
      return absl::InternalError(
          absl::StrCat("open ", args_.log_file.string(), ": ", strerror(errno)));
    }
    const pid_t parent = getpid();
    spawned_at_ = Clock::now();
    const pid_t pid = fork();
    if (pid == 0) {  // only async-signal-safe calls from here to exec
      sigset_t none;
      sigemptyset(&none);
      pthread_sigmask(SIG_SETMASK, &none, nullptr);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
      execv(argv[0], const_cast<char* const*>(argv));
      _exit(127);
    }
    close(log_fd);
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
    pid_ = pid;
    workspace_->child = pid;
    return absl::OkStatus();
  }

  std::string ReadLog() const {
    std::ifstream in(args_.log_file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string LogTail() const {
    const std::string log = ReadLog();
    return log.size() > 2000 ? log.substr(log.size() - 2000) : log;
  }

  // Reads the port from the "serving: grpc HOST:PORT," log line, then calls ListJobs until it
  // answers, as a client would before relying on it.
  absl::Status WaitUntilServing() {
    const Clock::time_point deadline = Clock::now() + absl::ToChronoMilliseconds(kStartTimeout);
    constexpr char kServing[] = "serving: grpc ";
    while (address_.empty()) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        workspace_->child = 0;
        return absl::InternalError(
            absl::StrCat("the coordinator exited at start; log:\n", LogTail()));
      }
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("the coordinator did not log its port; log:\n", LogTail()));
      }
      const std::string log = ReadLog();
      if (const size_t at = log.find(kServing); at != std::string::npos) {
        const size_t begin = at + sizeof(kServing) - 1, end = log.find(',', begin);
        if (end != std::string::npos) address_ = log.substr(begin, end - begin);
      }
      if (address_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const Connection connection = NewConnection(address_, args_.token);
    const std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(connection.channel);
    for (;;) {
      grpc::ClientContext context;
      connection.Prepare(&context, absl::Seconds(1));
      v1::ListJobsRequest request;
      request.set_page_size(1);
      v1::ListJobsResponse response;
      const absl::Status status = FromGrpcStatus(stub->ListJobs(&context, request, &response));
      if (status.ok()) break;
      // Anything but "not yet" (a wrong token, say) will not get better by waiting.
      if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return status;
      if (Clock::now() > deadline) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ready_s_ = std::chrono::duration<double>(Clock::now() - spawned_at_).count();
    return absl::OkStatus();
  }

  const CoordinatorArgs args_;
  Workspace* const workspace_;
  pid_t pid_ = 0;
  Clock::time_point spawned_at_;
  std::string address_;
  double ready_s_ = 0, stop_s_ = 0;
};

struct LoadOptions {
  std::string address, token;
  int clients = 50;
  int jobs = 1000;
  v1::JobSpec spec;
};

// What one client did; merged over the clients afterwards.
struct ClientResult {
  MethodLog logs[kNumMethods];
  std::vector<std::string> job_ids;  // of the jobs it submitted
};

// Client `index` submits jobs index, index + clients, ...; waits until every client has; then
// lists every job and gets its own. Failures are counted in `result` and never end the client
// early: every client must reach the barrier.
void RunClient(const LoadOptions& options, int index, std::barrier<>* all_submitted,
               std::atomic<int64_t>* jobs_created, ClientResult* result) {
  const Connection connection = NewConnection(options.address, options.token);
  const std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(connection.channel);
  for (int job = index; job < options.jobs; job += options.clients) {
    v1::SubmitJobRequest request;
    request.set_submission_id(absl::StrCat("load-bench-", job));
    *request.mutable_spec() = options.spec;
    request.mutable_spec()->set_name(absl::StrCat("load-", job));
    v1::Job response;
    const absl::Status status =
        TimedCall(connection, kSubmitJob, &result->logs[kSubmitJob],
                  [&](grpc::ClientContext* c) { return stub->SubmitJob(c, request, &response); });
    if (status.ok()) result->job_ids.push_back(response.id());
  }
  *jobs_created += static_cast<int64_t>(result->job_ids.size());
  all_submitted->arrive_and_wait();

  MethodLog& list_log = result->logs[kListJobs];
  absl::StatusOr<std::vector<std::string>> listed =
      ListAllJobIds(connection, kClientPageSize, &list_log);
  if (listed.ok()) {
    const std::set<std::string> seen(listed->begin(), listed->end());
    const int64_t missing = std::count_if(result->job_ids.begin(), result->job_ids.end(),
                                          [&](const std::string& id) { return !seen.count(id); });
    if (static_cast<int64_t>(listed->size()) != jobs_created->load() || missing > 0) {
      list_log.AddError(absl::StrCat("ListJobs: listed ", listed->size(), " jobs, expected ",
                                     jobs_created->load(), "; ", missing, " of client ", index,
                                     "'s jobs missing"));
    }
  }
  for (const std::string& id : result->job_ids) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job response;
    const absl::Status status =
        TimedCall(connection, kGetJob, &result->logs[kGetJob],
                  [&](grpc::ClientContext* c) { return stub->GetJob(c, request, &response); });
    if (status.ok() && (response.id() != id || response.state() != v1::JOB_STATE_PENDING)) {
      result->logs[kGetJob].AddError(absl::StrCat("GetJob ", id, ": got job ", response.id(),
                                                  " in ", v1::JobState_Name(response.state())));
    }
  }
}

struct RestartReport {
  int64_t listed = 0;     // jobs the second coordinator lists
  bool all_kept = false;  // exactly the submitted ones
  double first_stop_s = 0, ready_s = 0, second_stop_s = 0;
};

// Stops `first` with SIGTERM, starts another coordinator on the same state file and compares
// what it lists with `submitted`. An error means the restart itself failed.
absl::Status CheckRestart(CoordinatorArgs args, CoordinatorProcess* first,
                          std::vector<std::string> submitted, Workspace* workspace,
                          RestartReport* report) {
  MOETRAIN_RETURN_IF_ERROR(first->Stop());
  report->first_stop_s = first->stop_s();
  args.log_file.replace_filename("coordinator-2.log");
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorProcess> second,
                            CoordinatorProcess::Start(args, workspace));
  report->ready_s = second->ready_s();
  MethodLog untimed;
  MOETRAIN_ASSIGN_OR_RETURN(
      std::vector<std::string> listed,
      ListAllJobIds(NewConnection(second->address(), args.token), kRestartPageSize, &untimed));
  report->listed = static_cast<int64_t>(listed.size());
  std::sort(listed.begin(), listed.end());
  std::sort(submitted.begin(), submitted.end());
  report->all_kept = listed == submitted;
  MOETRAIN_RETURN_IF_ERROR(second->Stop());
  report->second_stop_s = second->stop_s();
  return absl::OkStatus();
}

// One method's entry in the report; sorts the latencies.
nlohmann::json MethodReport(MethodLog& log) {
  std::sort(log.latency_ms.begin(), log.latency_ms.end());
  const double span_s = log.latency_ms.empty()
                            ? 0
                            : std::chrono::duration<double>(log.last_end - log.first_start).count();
  return {{"count", log.latency_ms.size()},
          {"p50_ms", Percentile(log.latency_ms, 0.50)},
          {"p99_ms", Percentile(log.latency_ms, 0.99)},
          {"max_ms", log.latency_ms.empty() ? 0.0 : log.latency_ms.back()},
          // All clients together, over the span from the first call's start to the last's end.
          {"calls_per_s", span_s > 0 ? static_cast<double>(log.latency_ms.size()) / span_s : 0.0},
          {"errors", log.errors}};
}

void PrintTable(const nlohmann::json& report) {
  std::printf("%d clients, %d jobs, %d threads; load %.2f s, total %.2f s; fdatasync %.2f ms\n",
              report["clients"].get<int>(), report["jobs"].get<int>(),
              report["machine_threads"].get<int>(), report["load_wall_s"].get<double>(),
              report["total_wall_s"].get<double>(), report["fdatasync_p50_ms"][0].get<double>());
  std::printf("%-10s %7s %9s %9s %9s %9s %7s\n", "method", "count", "p50 ms", "p99 ms", "max ms",
              "calls/s", "errors");
  for (const char* name : kMethodNames) {
    const nlohmann::json& row = report["methods"][name];
    std::printf("%-10s %7lld %9.2f %9.2f %9.2f %9.0f %7lld\n", name, row["count"].get<long long>(),
                row["p50_ms"].get<double>(), row["p99_ms"].get<double>(),
                row["max_ms"].get<double>(), row["calls_per_s"].get<double>(),
                row["errors"].get<long long>());
  }
  for (const auto& message : report["error_messages"]) {
    std::printf("error: %s\n", message.get<std::string>().c_str());
  }
  const std::string restart_error = report["restart_error"];
  std::printf("restart: listed %lld jobs (%s)%s%s\n", report["restart_listed"].get<long long>(),
              report["restart_ok"].get<bool>() ? "all kept" : "JOBS LOST OR RESTART FAILED",
              restart_error.empty() ? "" : ": ", restart_error.c_str());
  std::printf("targets (no errors, p99 of SubmitJob and GetJob < %.0f ms): %s\n", kTargetP99Ms,
              report["targets_met"].get<bool>() ? "met" : "missed");
}

// --coordinator, else the one beside this binary, else the build's.
absl::StatusOr<fs::path> CoordinatorBinary(const std::string& flag) {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  const std::vector<fs::path> candidates =
      !flag.empty() ? std::vector<fs::path>{flag}
                    : std::vector<fs::path>{self.parent_path() / "moetrain-coordinator",
                                            fs::path(MOETRAIN_BIN_DIR) / "moetrain-coordinator"};
  for (const fs::path& path : candidates) {
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return absl::NotFoundError(
      absl::StrCat(candidates.front().string(), " is not an executable moetrain-coordinator"));
}

absl::Status WriteTokenFile(const fs::path& path, const std::string& token) {
  std::ofstream out(path);
  out << token << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  return absl::OkStatus();
}

// The whole run; an error means the bench could not run, not that the coordinator misbehaved.
absl::StatusOr<nlohmann::json> Run(LoadOptions load, const std::string& coordinator_flag) {
  const Clock::time_point bench_start = Clock::now();
  // Before gRPC or any client starts a thread.
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Workspace> workspace, Workspace::Create());
  MOETRAIN_ASSIGN_OR_RETURN(load.spec, ParseJobSpecYaml(kSpecYaml));
  const fs::path dir = workspace->dir();
  CoordinatorArgs args;
  MOETRAIN_ASSIGN_OR_RETURN(args.binary, CoordinatorBinary(coordinator_flag));
  args.state_db = dir / "state.db";
  args.checkpoint_dir = dir / "checkpoints";
  args.token_file = dir / "token";
  args.log_file = dir / "coordinator-1.log";
  args.token = absl::StrCat("load-bench-", getpid(), "-", Clock::now().time_since_epoch().count());
  MOETRAIN_RETURN_IF_ERROR(WriteTokenFile(args.token_file, args.token));
  MOETRAIN_ASSIGN_OR_RETURN(const double fdatasync_before_ms, MedianFdatasyncMs(dir));
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorProcess> coordinator,
                            CoordinatorProcess::Start(args, workspace.get()));
  load.address = coordinator->address();
  load.token = args.token;
  std::fprintf(stderr, "coordinator_load_bench: %d clients, %d jobs against %s...\n", load.clients,
               load.jobs, load.address.c_str());

  std::vector<ClientResult> results(load.clients);
  std::barrier all_submitted(load.clients);
  std::atomic<int64_t> jobs_created{0};
  const Clock::time_point load_start = Clock::now();
  {
    std::vector<std::thread> clients;
    for (int i = 0; i < load.clients; ++i) {
      clients.emplace_back(RunClient, std::cref(load), i, &all_submitted, &jobs_created,
                           &results[i]);
    }
    for (std::thread& client : clients) client.join();
  }
  const double load_wall_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  MethodLog merged[kNumMethods];
  std::vector<std::string> submitted_ids;
  for (const ClientResult& result : results) {
    for (int m = 0; m < kNumMethods; ++m) merged[m].Merge(result.logs[m]);
    submitted_ids.insert(submitted_ids.end(), result.job_ids.begin(), result.job_ids.end());
  }
  MOETRAIN_ASSIGN_OR_RETURN(const double fdatasync_after_ms, MedianFdatasyncMs(dir));
  RestartReport restart;
  const absl::Status restarted =
      CheckRestart(args, coordinator.get(), submitted_ids, workspace.get(), &restart);

  nlohmann::json methods;
  MethodLog all;
  for (int m = 0; m < kNumMethods; ++m) {
    methods[kMethodNames[m]] = MethodReport(merged[m]);
    all.Merge(merged[m]);
  }
  const bool targets_met = all.errors == 0 && methods["SubmitJob"]["p99_ms"] < kTargetP99Ms &&
                           methods["GetJob"]["p99_ms"] < kTargetP99Ms;
  return nlohmann::json{
      {"machine_threads", std::thread::hardware_concurrency()},
      {"clients", load.clients},
      {"jobs", load.jobs},
      {"methods", methods},
      {"errors", all.errors},
      {"error_messages", all.error_messages},
      // The disk's commit latency before and after the load: every latency here scales with it.
      {"fdatasync_p50_ms", {fdatasync_before_ms, fdatasync_after_ms}},
      {"coordinator_ready_s", coordinator->ready_s()},
      {"load_wall_s", load_wall_s},
      // SIGTERM to exit: of the loaded coordinator, then of the restarted one.
      {"stop_s", {restart.first_stop_s, restart.second_stop_s}},
      {"restart_ready_s", restart.ready_s},
      {"restart_listed", restart.listed},
      {"restart_ok", restarted.ok() && restart.all_kept},
      {"restart_error", restarted.ok() ? "" : restarted.ToString()},
      {"total_wall_s", std::chrono::duration<double>(Clock::now() - bench_start).count()},
      {"targets", {{"errors", 0}, {"p99_ms_below", kTargetP99Ms}}},
      {"targets_met", targets_met}};
}

int Main(int argc, char** argv) {
  bool json = false;
  LoadOptions load;
  std::string coordinator_flag;
  CLI::App app{"coordinator_load_bench: many concurrent clients against a real coordinator"};
  app.add_flag("--json", json, "print one JSON object instead of a table");
  app.add_option("--clients", load.clients, "concurrent clients, each with its own connection")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--jobs", load.jobs, "jobs submitted, shared out among the clients")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--coordinator", coordinator_flag,
                 "the moetrain-coordinator binary (default: the one next to this binary, else the "
                 "build's)");
  app.footer(
      "Exit status: 0 no failed call and no job lost; 1 a failed call, a lost job, or the bench "
      "could not run; 2 bad usage.");
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  const absl::StatusOr<nlohmann::json> report = Run(load, coordinator_flag);
  if (!report.ok()) {
    std::fprintf(stderr, "coordinator_load_bench: %s\n", report.status().ToString().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", report->dump().c_str());
  } else {
    PrintTable(*report);
  }
  return (*report)["errors"] == 0 && (*report)["restart_ok"] == true ? 0 : 1;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
