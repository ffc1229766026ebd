// The whole coordinator in one object, for `moetrain-coordinator` and for the in-process
// coordinator of `moetrain run`: the store, the job API, the fleet, the gRPC services
// (JobService, WorkerService, grpc.health.v1.Health) and the HTTP endpoint (/metrics, /healthz,
// /readyz, the dashboard page at / and its JSON API under /api/v1/), started and stopped in order
// around one readiness state.
//
//   MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
//                             CoordinatorServer::Start(options));
//   ... server->grpc_port(), server->InProcessChannel() ...
//   server->Shutdown();   // also on destruction
//
// Start: STARTING → lock the state file (one coordinator per file) → open the store (a damaged file
// fails here, untouched) → reload the fleet → listen (gRPC, then HTTP) → SERVING. Shutdown:
// DRAINING (health probes fail, watches end, long polls return) → stop the servers, finishing calls
// in flight → STOPPED.
#ifndef MOETRAIN_SERVER_COORDINATOR_SERVER_H_
#define MOETRAIN_SERVER_COORDINATOR_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/coordinator.h"
#include "server/core/fleet.h"
#include "server/core/readiness.h"
#include "server/core/service_metrics.h"
#include "server/core/store.h"
#include "server/grpc/job_service.h"
#include "server/grpc/worker_service.h"
#include "server/http/dashboard_page.h"
#include "server/http/http_server.h"
#include "server/http/json_api.h"
#include "server/http/metrics.h"

namespace moetrain::server {

// Fewest gRPC threads a coordinator runs with: a few workers and a client.
inline constexpr int kMinGrpcThreads = 16;

struct CoordinatorServerOptions {
  // gRPC address, host:port; port 0 picks a free one (grpc_port() tells which). Empty = no
  // listening socket: in-process clients only.
  std::string listen = "127.0.0.1:7070";
  // HTTP address for /metrics, health, the dashboard and its API, host:port; empty = no HTTP
  // endpoint.
  std::string http_listen = "127.0.0.1:7071";
  // The SQLite state file; created when missing.
  std::string state_db = "moetrain-coordinator.db";
  // Every call must carry it when not empty (gRPC, and the HTTP API under /api/): the users'
  // token. Workers too, unless `worker_token` is set.
  std::string bearer_token;
  // When not empty, WorkerService calls must carry this token instead, and no other call may:
  // a user's token cannot act as a worker, nor a worker's as a user. Must differ from
  // `bearer_token`.
  std::string worker_token;
  // PEM files. With a certificate and key the gRPC port speaks TLS; with a client CA too, clients
  // must present a certificate it signed (mTLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Largest request the gRPC server accepts.
  int max_receive_message_bytes = 4 << 20;
  // Most threads the gRPC server runs calls on (its ResourceQuota): each call in progress holds
  // one, so this bounds how many the coordinator answers at once; a call beyond it is
  // RESOURCE_EXHAUSTED. docs/service.md ("Security and limits") sizes it: a worker holds at most
  // one GetAssignment, one KvWait per rank, a heartbeat and a report at once, a client one call
  // (a watch) or a few short ones.
  int grpc_max_threads = 1024;
  FleetOptions fleet;
  // Directories a spec's data.path must lie in, as the workers see them (checked at submit, as
  // far as the text tells; the workers' own --data-root flags decide); empty = not checked.
  std::vector<std::string> data_roots;
  // /metrics also carries the series per routed expert (ServiceMetricsOptions::per_expert).
  bool metrics_per_expert = false;

  // InvalidArgument naming the option: bad addresses, a key without a certificate (or the other
  // way round), a client CA without both, a worker token equal to the users' token, a
  // non-positive message size, fewer than kMinGrpcThreads gRPC threads; and the fleet's options.
  absl::Status Validate() const;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options);
  ~CoordinatorServer();  // Shutdown()
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  // Idempotent; the first call does the work.
  void Shutdown();

  // Bound ports; 0 when not listening.
  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_ != nullptr ? http_->port() : 0; }
  // A channel into this server without a socket (no TLS; the bearer token still applies).
  std::shared_ptr<grpc::Channel> InProcessChannel();
  Readiness& readiness() { return readiness_; }
  // Every family the coordinator registered (what /metrics writes from).
  const MetricsRegistry& metrics_registry() const { return registry_; }

 private:
  CoordinatorServer() = default;
  absl::Status Build(const CoordinatorServerOptions& options);

  Readiness readiness_;
  MetricsRegistry registry_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<Fleet> fleet_;
  std::unique_ptr<JobService> job_service_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<JsonApi> json_api_;
  std::unique_ptr<DashboardPage> dashboard_page_;
  std::unique_ptr<HttpServer> http_;
  Readiness::ListenerId health_listener_ = 0;
  int grpc_port_ = 0;
  bool shut_down_ = false;
  // The state file, flock'ed: this process owns it. Closed only after the store.
  int state_lock_fd_ = -1;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_COORDINATOR_SERVER_H_
