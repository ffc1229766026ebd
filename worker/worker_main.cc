// moetrain-worker: runs ranks of training jobs for a coordinator.
//
// Lifecycle: block SIGINT/SIGTERM (before any thread starts, gRPC's included) → parse flags →
// make the path flags absolute → enter --work-dir → register and serve → on a signal, the running
// rank saves a checkpoint at its next step boundary and reports STOPPED (the coordinator resumes
// the job elsewhere, without counting a restart) → exit 0. With --metrics-listen, /metrics is
// served from before the registration until the exit. Exit 2 for bad flags (a --metrics-listen
// that cannot be bound included), 1 when the coordinator refuses the worker (a wrong token).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "engine/backend/device_query.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "engine/train/memory_estimate.h"
#include "moetrain/v1/connect.h"
#include "server/core/readiness.h"
#include "server/http/http_server.h"
#include "server/http/metrics.h"
#include "worker/job_config.h"
#include "worker/rank_main.h"
#include "worker/rendezvous_store.h"
#include "worker/worker.h"
#include "worker/worker_metrics.h"

namespace {

// "cpu", "cuda" (every GPU) or "cuda:0,2" (those GPUs). A CUDA flag needs the GPUs now: a worker
// that cannot use them fails at start instead of being given CUDA jobs it would fail.
absl::Status ParseDevices(const std::string& text, moetrain::WorkerOptions* options) {
  MOETRAIN_ASSIGN_OR_RETURN(const moetrain::DeviceFlag flag, moetrain::ParseDeviceFlag(text));
  moetrain::DeviceReport report;
  if (flag.device == moetrain::v1::ResourceConfig::CUDA) {
    // The ranks see exactly these devices, renumbered from 0. Set before the first CUDA call
    // (QueryDevices), which reads it once per process.
    if (!flag.indexes.empty()) {
      setenv("CUDA_VISIBLE_DEVICES", absl::StrJoin(flag.indexes, ",").c_str(), 1);
    }
    report = moetrain::QueryDevices();
  }
  MOETRAIN_ASSIGN_OR_RETURN(const moetrain::OfferedDevices offered,
                            moetrain::DevicesOffered(text, flag, report));
  options->device = offered.device;
  options->device_count = offered.count;
  options->device_memory_bytes = offered.memory_bytes;
  if (flag.device == moetrain::v1::ResourceConfig::CUDA) {
    moetrain::Log(absl::StrCat("--devices = '", text, "': ", moetrain::DescribeDevices(report)));
  }
  return absl::OkStatus();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "worker";
  return name;
}

const char* Env(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  // A rank of this worker's, in the process the worker started for it (worker/rank_main.h).
  if (moetrain::IsRankProcess(argc, argv)) return moetrain::RankProcessMain(argc, argv);
  // Blocked before any thread starts, so that every thread inherits the mask and only the signal
  // thread below takes them; a thread that did not block them would let the default action kill
  // the worker mid-step.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  moetrain::ConnectOptions connect;
  connect.address = Env("MOETRAIN_COORDINATOR", "127.0.0.1:7070");
  connect.token_file = Env("MOETRAIN_TOKEN_FILE", "");
  std::string worker_token_file = Env("MOETRAIN_WORKER_TOKEN_FILE", "");
  moetrain::WorkerOptions options;
  options.name = HostName();
  options.version = MOETRAIN_VERSION;
  options.threads = std::max(1u, std::thread::hardware_concurrency());
  std::string devices = "cpu", work_dir;

  CLI::App app{"moetrain-worker: runs ranks of MoE training jobs for a moetrain coordinator"};
  app.set_version_flag("--version", MOETRAIN_VERSION);
  app.footer(
      "Each rank runs in a process of its own: this program, started by the worker as\n"
      "`moetrain-worker --moetrain-rank-process=3,<worker pid>` (not for starting by hand).");
  app.add_option("--coordinator", connect.address,
                 "coordinator gRPC address (env MOETRAIN_COORDINATOR)")
      ->capture_default_str();
  app.add_option("--token-file", connect.token_file,
                 "file holding the coordinator's bearer token (env MOETRAIN_TOKEN_FILE)");
  app.add_option("--worker-token-file", worker_token_file,
                 "file holding the coordinator's worker token (its --worker-token-file; env "
                 "MOETRAIN_WORKER_TOKEN_FILE): sent instead of --token-file's");
  app.add_option("--tls-ca", connect.tls_ca_file, "PEM CA to verify the coordinator (enables TLS)");
  app.add_option("--tls-cert", connect.tls_cert_file, "PEM client certificate, for mTLS");
  app.add_option("--tls-key", connect.tls_key_file, "PEM key of --tls-cert");
  app.add_option("--devices", devices,
                 "what this worker offers: 'cpu', 'cuda' (every GPU) or 'cuda:0,2' (those GPUs); "
                 "a CUDA choice fails at start where the GPUs are not usable")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "CPU threads of a rank (default: all)")
      ->check(CLI::PositiveNumber);
  app.add_option("--work-dir", work_dir,
                 "working directory (created when missing); relative checkpoint paths resolve "
                 "against it");
  app.add_option("--name", options.name, "name shown by `moetrain workers` (default: host name)")
      ->capture_default_str();
  app.add_option("--comm-host", options.comm_host,
                 "address the ranks listen on for the other ranks of their gang (default: the "
                 "local address of the route to the coordinator)");
  std::string comm_timeout = "60s";
  app.add_option("--comm-timeout", comm_timeout,
                 "how long a rank waits for its gang to meet and for one collective; a rank whose "
                 "peer died fails after it")
      ->capture_default_str();
  app.add_option("--data-root", options.data_roots,
                 "a directory a job's data.path must lie in, symbolic links followed "
                 "(repeatable); none = any file the worker can read");
  std::string memory_limit;
  app.add_option("--memory-limit", memory_limit,
                 "host memory a rank may use, e.g. 8GiB, 512MiB or bytes (default: the machine's "
                 "memory, or its cgroup's limit when lower); a job whose estimate exceeds it "
                 "fails before allocating");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT to serve Prometheus metrics on, at /metrics (port 0 = any free port; "
                 "default: off)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 prints the help, the version or the problem; any usage error is exit code 2.
    return app.exit(error) == 0 ? 0 : 2;
  }
  // A coordinator with a worker token admits workers by that token alone.
  if (!worker_token_file.empty()) connect.token_file = worker_token_file;
  // Made absolute before --work-dir changes the directory they are relative to (the token file
  // of MOETRAIN_TOKEN_FILE too).
  for (std::string* path :
       {&connect.token_file, &connect.tls_ca_file, &connect.tls_cert_file, &connect.tls_key_file}) {
    std::error_code error;
    if (!path->empty()) *path = std::filesystem::absolute(*path, error).lexically_normal().string();
  }
  if (memory_limit.empty()) {
    absl::StatusOr<int64_t> machine = moetrain::MachineMemoryBytes();
    if (machine.ok()) options.memory_limit_bytes = *machine;
  } else {
    absl::StatusOr<int64_t> limit = moetrain::ParseByteSize(memory_limit, "--memory-limit");
    if (!limit.ok()) {
      std::fprintf(stderr, "moetrain-worker: %s\n", std::string(limit.status().message()).c_str());
      return 2;
    }
    options.memory_limit_bytes = *limit;
  }
  // Made absolute before --work-dir changes the directory they are relative to.
  for (std::string& root : options.data_roots) {
    std::error_code error;
    if (!std::filesystem::is_directory(root, error)) {
      std::fprintf(stderr, "moetrain-worker: --data-root = '%s' is not a directory\n",
                   root.c_str());
      return 2;
    }
    root = std::filesystem::absolute(root, error).lexically_normal().string();
  }

  if (!absl::ParseDuration(comm_timeout, &options.comm_timeout)) {
    std::fprintf(stderr, "moetrain-worker: --comm-timeout = '%s' is not a duration (e.g. 60s)\n",
                 comm_timeout.c_str());
    return 2;
  }
  absl::StatusOr<moetrain::server::HostPort> metrics_address;
  if (!metrics_listen.empty()) {
    metrics_address = moetrain::server::ParseHostPort("--metrics-listen", metrics_listen);
    if (!metrics_address.ok()) {
      std::fprintf(stderr, "moetrain-worker: %s\n",
                   std::string(metrics_address.status().message()).c_str());
      return 2;
    }
  }
  if (absl::Status parsed = ParseDevices(devices, &options); !parsed.ok()) {
    std::fprintf(stderr, "moetrain-worker: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  if (!work_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(work_dir, error);
    if (error || chdir(work_dir.c_str()) != 0) {
      std::fprintf(stderr, "moetrain-worker: --work-dir = '%s': cannot create or enter it\n",
                   work_dir.c_str());
      return 2;
    }
  }
  if (options.comm_host.empty()) {
    absl::StatusOr<std::string> local = moetrain::LocalAddressToward(connect.address);
    if (local.ok()) {
      options.comm_host = *local;
    } else {
      // The host name: what a pod of a StatefulSet is reachable at.
      options.comm_host = HostName();
      moetrain::Log(absl::StrCat(local.status().message(), "; gang peers reach this worker at ",
                                 options.comm_host, " (set --comm-host to choose)"));
    }
  }
  absl::StatusOr<moetrain::Connection> connection = moetrain::Connect(connect);
  if (!connection.ok()) {
    std::fprintf(stderr, "moetrain-worker: %s\n",
                 std::string(connection.status().message()).c_str());
    return 2;
  }
  if (absl::Status valid = options.Validate(); !valid.ok()) {
    std::fprintf(stderr, "moetrain-worker: %s\n", std::string(valid.message()).c_str());
    return 2;
  }

  // The endpoint serves the worker's metrics and, as the coordinator's does, /healthz and /readyz
  // (SERVING from here until the signal).
  moetrain::server::MetricsRegistry registry;
  moetrain::server::Readiness readiness;
  std::unique_ptr<moetrain::WorkerMetrics> metrics;
  std::unique_ptr<moetrain::server::HttpServer> http;
  if (!metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<moetrain::WorkerMetrics>> created =
        moetrain::WorkerMetrics::Create(&registry, options.memory_limit_bytes);
    absl::StatusOr<std::unique_ptr<moetrain::server::HttpServer>> server =
        created.ok() ? moetrain::server::HttpServer::Create({.host = metrics_address->host,
                                                             .port = metrics_address->port,
                                                             .registry = &registry,
                                                             .readiness = &readiness})
                     : created.status();
    absl::Status started = server.ok() ? (*server)->Start() : server.status();
    if (!started.ok()) {
      std::fprintf(stderr, "moetrain-worker: --metrics-listen = '%s': %s\n", metrics_listen.c_str(),
                   std::string(started.message()).c_str());
      return 2;
    }
    metrics = *std::move(created);
    http = *std::move(server);
    options.metrics = metrics.get();
    readiness.Transition(moetrain::server::ReadinessState::kServing, "worker running")
        .IgnoreError();
    moetrain::Log(
        absl::StrCat("metrics on http://", metrics_address->host, ":", http->port(), "/metrics"));
  }

  moetrain::Worker worker(*std::move(connection), options);
  std::thread signals([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    moetrain::Log(absl::StrCat("received ", strsignal(signal_number),
                               ": stopping (a running rank first saves a checkpoint at its next "
                               "step boundary and hands its job back)"));
    readiness.Transition(moetrain::server::ReadinessState::kDraining, "stopping").IgnoreError();
    worker.Shutdown();
  });
  moetrain::Log(absl::StrCat(
      "moetrain-worker ", MOETRAIN_VERSION, " (", options.name, ", ", devices, ", ",
      options.threads, " threads, gang address ", options.comm_host, ", memory limit ",
      options.memory_limit_bytes > 0 ? moetrain::FormatBytes(options.memory_limit_bytes)
                                     : std::string("none"),
      ") serving coordinator ", connect.address));
  const absl::Status status = worker.Run();
  if (!status.ok()) {
    moetrain::Log(std::string(status.message()));
  } else {
    moetrain::Log("stopped");
  }
  // The signal thread is blocked in sigwait unless a signal ended the run: it dies with us.
  signals.detach();
  if (http != nullptr) http->Stop();
  return status.ok() ? 0 : 1;
}
