#include "server/coordinator_server.h"

#include <fcntl.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "server/grpc/rpc_metrics.h"

namespace moetrain::server {
namespace {

constexpr auto kShutdownGrace = std::chrono::seconds(5);

absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  if (contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is not a PEM file"));
  }
  return contents.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const CoordinatorServerOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  MOETRAIN_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("--tls-cert", options.tls_cert_file));
  MOETRAIN_ASSIGN_OR_RETURN(pair.private_key, ReadPem("--tls-key", options.tls_key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    MOETRAIN_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                              ReadPem("--tls-client-ca", options.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::Status CoordinatorServerOptions::Validate() const {
  if (!listen.empty()) MOETRAIN_RETURN_IF_ERROR(ParseHostPort("--listen", listen).status());
  if (!http_listen.empty()) {
    MOETRAIN_RETURN_IF_ERROR(ParseHostPort("--http-listen", http_listen).status());
  }
  if (state_db.empty()) return absl::InvalidArgumentError("--state-db is empty");
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!tls_client_ca_file.empty() && tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS with client certificates)");
  }
  if (!worker_token.empty() && worker_token == bearer_token) {
    return absl::InvalidArgumentError(
        "--worker-token-file holds the same token as --token-file: the worker token must differ, "
        "or a user could act as a worker");
  }
  if (max_receive_message_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_receive_message_bytes = ", max_receive_message_bytes, " must be positive"));
  }
  if (grpc_max_threads < kMinGrpcThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grpc-max-threads = ", grpc_max_threads, " is below ", kMinGrpcThreads));
  }
  return fleet.Validate();
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options) {
  MOETRAIN_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  absl::Status built = server->Build(options);
  if (!built.ok()) {
    server->Shutdown();
    return built;
  }
  return server;
}

namespace {

// One coordinator per state file: two would schedule the same jobs twice. The lock is a flock on
// the database file itself, so a coordinator that reaches the same file through a symbolic or a
// hard link (another name, the same inode) is refused too; the kernel releases it however the
// holder dies (kill -9 included). flock locks and SQLite's own fcntl locks on the file do not
// interact on Linux. The descriptor must stay open until the store is closed: closing any
// descriptor of the file drops every fcntl lock this process holds on it, SQLite's included.
absl::StatusOr<int> LockStateFile(const std::string& state_db) {
  // Read-only: the lock needs no more, and Store::Open says better why a file it cannot write is
  // refused. Created here when missing, as SQLite would (an empty file is a new database).
  const int fd = open(state_db.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-db = '", state_db, "': cannot open or create it: ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int lock_errno = errno;
    close(fd);
    if (lock_errno != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state-db = '", state_db, "': cannot lock it: ", strerror(lock_errno)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-db = '", state_db,
        "' is in use by another coordinator: another process holds the lock on this database file "
        "(perhaps under another name: a symbolic or hard link reaches the same file)"));
  }
  return fd;
}

}  // namespace

absl::Status CoordinatorServer::Build(const CoordinatorServerOptions& options) {
  MOETRAIN_ASSIGN_OR_RETURN(state_lock_fd_, LockStateFile(options.state_db));
  MOETRAIN_ASSIGN_OR_RETURN(store_, Store::Open(options.state_db));
  coordinator_ = std::make_unique<Coordinator>(store_.get());
  ServiceMetricsOptions metrics_options;
  metrics_options.per_expert = options.metrics_per_expert;
  MOETRAIN_ASSIGN_OR_RETURN(metrics_, ServiceMetrics::Create(&registry_, metrics_options));
  MOETRAIN_ASSIGN_OR_RETURN(
      fleet_, Fleet::Create(store_.get(), coordinator_.get(), metrics_.get(), options.fleet));
  coordinator_->SetSubmittedListener([fleet = fleet_.get()](const std::string&) { fleet->Wake(); });
  registry_.AddCollector([this] {
    absl::StatusOr<std::map<JobState, int64_t>> jobs = store_->CountJobsByState();
    if (jobs.ok()) metrics_->SetJobsByState(*jobs);
    metrics_->SetWorkersByState(fleet_->CountWorkersByState());
  });

  JobServiceOptions job_options;
  job_options.bearer_token = options.bearer_token;
  job_options.worker_token = options.worker_token;
  job_options.checkpoint_root = options.fleet.checkpoint_dir;
  job_options.data_roots = options.data_roots;
  job_service_ = std::make_unique<JobService>(coordinator_.get(), fleet_.get(), job_options);
  worker_service_ =
      std::make_unique<WorkerService>(fleet_.get(), options.bearer_token, options.worker_token);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (!options.listen.empty()) {
    MOETRAIN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                              Credentials(options));
    builder.AddListeningPort(options.listen, credentials, &grpc_port_);
  }
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // Each call in progress holds a thread: without a bound, a flood of long calls makes threads
  // until the process's limit, and then no heartbeat gets one.
  grpc::ResourceQuota quota("moetrain-coordinator");
  quota.SetMaxThreads(options.grpc_max_threads);
  builder.SetResourceQuota(quota);
  // gRPC sets SO_REUSEPORT by default: a second coordinator on the same port would start, and
  // silently take half the connections of the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(MakeParseErrorInterceptorFactory());
  MOETRAIN_ASSIGN_OR_RETURN(
      creators.emplace_back(),
      MakeRpcMetricsInterceptorFactory(&registry_,
                                       {"moetrain.v1.JobService", "moetrain.v1.WorkerService"}));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  grpc_ = builder.BuildAndStart();
  if (grpc_ == nullptr || (!options.listen.empty() && grpc_port_ == 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --listen = '", options.listen,
                     "' (address in use, or not an address of this machine)"));
  }
  grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
  health_listener_ = readiness_.AddListener([health](ReadinessState state, const std::string&) {
    health->SetServingStatus(state == ReadinessState::kServing);
  });

  if (!options.http_listen.empty()) {
    MOETRAIN_ASSIGN_OR_RETURN(HostPort http, ParseHostPort("--http-listen", options.http_listen));
    HttpServerOptions http_options;
    http_options.host = http.host;
    http_options.port = http.port;
    http_options.registry = &registry_;
    http_options.readiness = &readiness_;
    json_api_ = std::make_unique<JsonApi>(coordinator_.get(), fleet_.get(), options.bearer_token);
    dashboard_page_ = std::make_unique<DashboardPage>(!options.bearer_token.empty());
    http_options.handlers = {dashboard_page_.get(), json_api_.get()};
    MOETRAIN_ASSIGN_OR_RETURN(http_, HttpServer::Create(http_options));
    MOETRAIN_RETURN_IF_ERROR(http_->Start());
  }
  fleet_->Start();
  return readiness_.Transition(ReadinessState::kServing,
                               absl::StrCat("serving jobs from ", options.state_db));
}

std::shared_ptr<grpc::Channel> CoordinatorServer::InProcessChannel() {
  return grpc_->InProcessChannel(grpc::ChannelArguments());
}

void CoordinatorServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  readiness_.Transition(ReadinessState::kDraining, "shutting down").IgnoreError();
  // Long-lived calls end first (watches, polls), so the server's shutdown does not wait on them.
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (fleet_ != nullptr) fleet_->Stop();
  if (grpc_ != nullptr) grpc_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  if (http_ != nullptr) http_->Stop();
  readiness_.Transition(ReadinessState::kStopped, "stopped").IgnoreError();
  readiness_.RemoveListener(health_listener_);
}

CoordinatorServer::~CoordinatorServer() {
  Shutdown();
  store_.reset();
  if (state_lock_fd_ >= 0) close(state_lock_fd_);
}

}  // namespace moetrain::server
