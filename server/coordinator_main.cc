// moetrain-coordinator: the coordinator daemon. Accepts jobs over gRPC, keeps them in a SQLite
// file, schedules them onto registered workers, and serves /metrics and health over HTTP.
//
// Lifecycle: parse flags → block SIGINT/SIGTERM (before any thread starts) → start (store,
// reconciliation, listeners) → wait for a signal → drain and stop → exit 0. A start that fails
// (bad flags, a state file that is damaged, not writable or held by another coordinator, a port
// in use) prints why and exits 2 (flags) or 1.
#include <signal.h>

#include <cstdio>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/core/log.h"
#include "moetrain/v1/connect.h"
#include "server/coordinator_server.h"

namespace {

// A duration flag ("10s", "500ms", "1m"): the flag's name and value go into the error.
bool ParseDurationFlag(const std::string& flag, const std::string& text, absl::Duration* out) {
  if (!absl::ParseDuration(text, out) || *out <= absl::ZeroDuration()) {
    std::fprintf(stderr, "moetrain-coordinator: %s = '%s' is not a positive duration (e.g. 10s)\n",
                 flag.c_str(), text.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using moetrain::server::CheckpointNaming;
  moetrain::server::CoordinatorServerOptions options;
  std::string token_file, heartbeat_timeout = "10s", grace, metrics_retention = "1h";
  std::string worker_token_file;

  CLI::App app{"moetrain-coordinator: accepts MoE training jobs and schedules them onto workers"};
  app.set_version_flag("--version", MOETRAIN_VERSION);
  app.add_option("--listen", options.listen, "gRPC address, host:port (port 0 = any free port)")
      ->capture_default_str();
  app.add_option("--http-listen", options.http_listen,
                 "HTTP address for /metrics, /healthz and /readyz; empty = none")
      ->capture_default_str();
  app.add_option("--state-db", options.state_db, "SQLite state file, created when missing")
      ->capture_default_str();
  app.add_option("--checkpoint-dir", options.fleet.checkpoint_dir,
                 "checkpoint root as the workers see it; job J writes to <dir>/J/step-NNNNNNNN")
      ->capture_default_str();
  app.add_option("--data-root", options.data_roots,
                 "a directory, as the workers see it, that a spec's data.path must lie in "
                 "(repeatable; checked at submit); none = not checked");
  app.add_option("--token-file", token_file,
                 "file holding the users' bearer token every call must carry (workers too, "
                 "unless --worker-token-file is given)");
  app.add_option("--worker-token-file", worker_token_file,
                 "file holding the workers' bearer token: WorkerService calls (registering a "
                 "worker, its reports) must carry it and no other, JobService calls must not");
  app.add_option("--tls-cert", options.tls_cert_file, "PEM server certificate (enables TLS)");
  app.add_option("--tls-key", options.tls_key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", options.tls_client_ca_file,
                 "PEM CA that client certificates must be signed by (enables mTLS)");
  app.add_option("--heartbeat-timeout", heartbeat_timeout,
                 "a worker silent this long is lost and its job restarts; workers heartbeat every "
                 "min(1s, timeout/4)")
      ->capture_default_str();
  app.add_option("--reconcile-grace", grace,
                 "after a restart, how long workers have to report the jobs they run before those "
                 "jobs restart from their checkpoints (default: the heartbeat timeout)");
  app.add_option("--metrics-retention", metrics_retention,
                 "how long a job's series stay on /metrics after it ends (SUCCEEDED, FAILED, "
                 "CANCELLED), so that Prometheus scrapes its final values")
      ->capture_default_str();
  app.add_flag("--metrics-per-expert", options.metrics_per_expert,
               "also export FP8 statistics per routed expert on /metrics "
               "(moetrain_job_fp8_expert_*: layers x experts x 3 series per metric and job)");
  app.add_option("--grpc-max-threads", options.grpc_max_threads,
                 "most gRPC calls served at once (threads); one beyond is RESOURCE_EXHAUSTED. "
                 "Size it as workers x (3 + ranks per worker) + clients (docs/service.md)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 prints the help, the version or the problem; any usage error is exit code 2.
    return app.exit(error) == 0 ? 0 : 2;
  }

  if (!ParseDurationFlag("--heartbeat-timeout", heartbeat_timeout,
                         &options.fleet.heartbeat_timeout)) {
    return 2;
  }
  options.fleet.heartbeat_interval =
      std::min(absl::Seconds(1), options.fleet.heartbeat_timeout / 4);
  if (!grace.empty() &&
      !ParseDurationFlag("--reconcile-grace", grace, &options.fleet.reconcile_grace)) {
    return 2;
  }
  if (!ParseDurationFlag("--metrics-retention", metrics_retention,
                         &options.fleet.metrics_retention)) {
    return 2;
  }
  for (const auto& [file, token] : {std::pair{&token_file, &options.bearer_token},
                                    std::pair{&worker_token_file, &options.worker_token}}) {
    if (file->empty()) continue;
    absl::StatusOr<std::string> read = moetrain::ReadTokenFile(*file);
    if (!read.ok()) {
      std::fprintf(stderr, "moetrain-coordinator: %s\n",
                   std::string(read.status().message()).c_str());
      return 2;
    }
    *token = *std::move(read);
  }
  if (absl::Status valid = options.Validate(); !valid.ok()) {
    std::fprintf(stderr, "moetrain-coordinator: %s\n", std::string(valid.message()).c_str());
    return 2;
  }

  // Blocked here, before gRPC starts its threads, so that every thread inherits the mask and the
  // signals wait for sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<moetrain::server::CoordinatorServer>> server =
      moetrain::server::CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "moetrain-coordinator: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  const std::string http_host = options.http_listen.substr(0, options.http_listen.rfind(':'));
  moetrain::Log(absl::StrCat(
      "moetrain-coordinator serving: grpc ", host, ":", (*server)->grpc_port(),
      options.tls_cert_file.empty() ? ""
                                    : (options.tls_client_ca_file.empty() ? " (TLS)" : " (mTLS)"),
      ", http ",
      options.http_listen.empty() ? "off" : absl::StrCat(http_host, ":", (*server)->http_port()),
      ", state ", options.state_db, ", checkpoints ", options.fleet.checkpoint_dir,
      options.bearer_token.empty() ? ", no token" : ", token required"));

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  moetrain::Log(absl::StrCat("received ", strsignal(signal_number), ": draining"));
  (*server)->Shutdown();
  moetrain::Log("stopped");
  return 0;
}
