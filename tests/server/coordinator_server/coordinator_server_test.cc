// The assembled coordinator in this process, on 127.0.0.1: one readiness state behind gRPC health
// and /readyz, the token on both services, TLS and mTLS with certificates made by openssl for the
// test, request size limits, and the start-up errors (bad options, a port in use, a damaged state
// file left as it was).
#include "server/coordinator_server.h"

#include <grpcpp/generic/generic_stub.h>
#include <httplib.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.listen = "127.0.0.1:0";
    options_.http_listen = "127.0.0.1:0";
    options_.state_db = (dir_ / "state.db").string();
    options_.fleet.checkpoint_dir = (dir_ / "checkpoints").string();
  }

  std::unique_ptr<CoordinatorServer> Start() {
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }

  // grpc.health.v1.Health/Check for the whole server: the status byte of the answer (1 SERVING,
  // 2 NOT_SERVING), or the call's error.
  static absl::StatusOr<int> Health(const std::shared_ptr<grpc::Channel>& channel) {
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request(nullptr, 0), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                   &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status status = done.get_future().get();
    if (!status.ok()) return FromGrpcStatus(status);
    std::vector<grpc::Slice> slices;
    if (!response.Dump(&slices).ok()) return absl::InternalError("cannot read the answer");
    std::string bytes;
    for (const grpc::Slice& slice : slices) bytes.append(slice.begin(), slice.end());
    // HealthCheckResponse{status} encodes to 08 <status>.
    if (bytes.size() != 2 || bytes[0] != 0x08) return absl::InternalError("unexpected answer");
    return static_cast<int>(bytes[1]);
  }

  static grpc::Status RegisterWorker(const Connection& connection) {
    auto workers = v1::WorkerService::NewStub(connection.channel);
    grpc::ClientContext context;
    connection.Prepare(&context, absl::Seconds(10));
    v1::RegisterWorkerRequest request;
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    v1::RegisterWorkerResponse response;
    return workers->RegisterWorker(&context, request, &response);
  }

  static grpc::Status ListJobs(const Connection& connection) {
    auto stub = v1::JobService::NewStub(connection.channel);
    grpc::ClientContext context;
    connection.Prepare(&context, absl::Seconds(10));
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
  }

  Connection Plain(const CoordinatorServer& server, const std::string& token = "") {
    ConnectOptions connect;
    connect.address = absl::StrCat("127.0.0.1:", server.grpc_port());
    if (!token.empty()) {
      connect.token_file = (dir_ / "client-token").string();
      std::ofstream(connect.token_file) << token;
    }
    absl::StatusOr<Connection> connection = Connect(connect);
    EXPECT_TRUE(connection.ok()) << connection.status();
    return *connection;
  }

  // A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
  void MakeCertificates() {
    const std::string d = dir_.string();
    const std::string script =
        absl::StrCat("set -e; cd '", d, "';",
                     "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 "
                     "-subj /CN=moetrain-test-ca;",
                     "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
                     "-subj /CN=127.0.0.1;",
                     "printf 'subjectAltName=IP:127.0.0.1' > san.ext;",
                     "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                     "-out server.pem -days 1 -extfile san.ext;",
                     "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
                     "-subj /CN=moetrain-client;",
                     "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                     "-out client.pem -days 1",
                     " > openssl.log 2>&1");
    ASSERT_EQ(std::system(script.c_str()), 0) << ReadAll(dir_ / "openssl.log");
  }

  const testutil::TempDir temp_dir_{"coordinator_server_test"};
  const fs::path dir_ = temp_dir_.path();
  CoordinatorServerOptions options_;
};

TEST_F(CoordinatorServerTest, HealthAndReadinessFollowOneState) {
  std::unique_ptr<CoordinatorServer> server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->readiness().state(), ReadinessState::kServing);
  EXPECT_EQ(Health(server->InProcessChannel()).value_or(-1), 1);
  httplib::Client http("127.0.0.1", server->http_port());
  auto ready = http.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);

  // Draining: both say so, from the same transition.
  ASSERT_TRUE(server->readiness().Transition(ReadinessState::kDraining, "test drain").ok());
  EXPECT_EQ(Health(server->InProcessChannel()).value_or(-1), 2);
  ready = http.Get("/readyz");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503);
  EXPECT_THAT(ready->body, HasSubstr("test drain"));
  server->Shutdown();
  EXPECT_EQ(server->readiness().state(), ReadinessState::kStopped);
}

TEST_F(CoordinatorServerTest, TheTokenGuardsBothServicesButNotHealth) {
  options_.bearer_token = "the-token";
  std::unique_ptr<CoordinatorServer> server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(ListJobs(Plain(*server)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListJobs(Plain(*server, "wrong")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListJobs(Plain(*server, "the-token")).ok());
  for (const std::string& token : {std::string(), std::string("wrong")}) {
    EXPECT_EQ(RegisterWorker(Plain(*server, token)).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Probes carry no token: health answers anyway.
  EXPECT_EQ(Health(Plain(*server).channel).value_or(-1), 1);
}

// Issue 31, item 3: with one shared token, any user could register a worker of their own and be
// given ranks of other users' jobs. A worker token (--worker-token-file) separates the two: it
// alone admits WorkerService, and JobService refuses it.
TEST_F(CoordinatorServerTest, AWorkerTokenSeparatesWorkersFromUsers) {
  options_.bearer_token = "users-token";
  options_.worker_token = "workers-token";
  std::unique_ptr<CoordinatorServer> server = Start();
  ASSERT_NE(server, nullptr);
  auto register_worker = [&](const std::string& token) {
    return RegisterWorker(Plain(*server, token));
  };
  const grpc::Status by_user = register_worker("users-token");
  EXPECT_EQ(by_user.error_code(), grpc::StatusCode::PERMISSION_DENIED) << by_user.error_message();
  EXPECT_THAT(by_user.error_message(), HasSubstr("--worker-token-file"));
  EXPECT_EQ(register_worker("wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(register_worker("").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status by_worker = register_worker("workers-token");
  EXPECT_TRUE(by_worker.ok()) << by_worker.error_message();

  const grpc::Status listed_by_worker = ListJobs(Plain(*server, "workers-token"));
  EXPECT_EQ(listed_by_worker.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(listed_by_worker.error_message(), HasSubstr("admits WorkerService only"));
  EXPECT_TRUE(ListJobs(Plain(*server, "users-token")).ok());
  // The JSON API takes the users' token only.
  httplib::Client http("127.0.0.1", server->http_port());
  auto as_worker = http.Get("/api/v1/jobs", {{"Authorization", "Bearer workers-token"}});
  ASSERT_TRUE(as_worker);
  EXPECT_EQ(as_worker->status, 401);

  // Without a users' token JobService is open, but still not to the worker token.
  server.reset();
  options_.bearer_token.clear();
  server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(ListJobs(Plain(*server)).ok());
  EXPECT_EQ(ListJobs(Plain(*server, "workers-token")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(register_worker("").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // The two tokens must differ.
  CoordinatorServerOptions same = options_;
  same.bearer_token = same.worker_token = "one-token";
  same.state_db = (dir_ / "same.db").string();
  EXPECT_THAT(CoordinatorServer::Start(same).status().message(),
              HasSubstr("--worker-token-file holds the same token as --token-file"));
}

TEST_F(CoordinatorServerTest, OversizedRequestsAreRefusedAndStoreNothing) {
  options_.max_receive_message_bytes = 64 << 10;
  std::unique_ptr<CoordinatorServer> server = Start();
  ASSERT_NE(server, nullptr);
  const Connection connection = Plain(*server);
  auto jobs = v1::JobService::NewStub(connection.channel);
  grpc::ClientContext context;
  connection.Prepare(&context, absl::Seconds(10));
  v1::SubmitJobRequest request;
  request.set_submission_id(std::string(128 << 10, 'x'));
  request.mutable_spec()->set_name("big");
  v1::Job job;
  EXPECT_EQ(jobs->SubmitJob(&context, request, &job).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  grpc::ClientContext list_context;
  connection.Prepare(&list_context, absl::Seconds(10));
  v1::ListJobsResponse listed;
  ASSERT_TRUE(jobs->ListJobs(&list_context, v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
}

TEST_F(CoordinatorServerTest, TlsAndMutualTls) {
  MakeCertificates();
  options_.tls_cert_file = (dir_ / "server.pem").string();
  options_.tls_key_file = (dir_ / "server.key").string();
  {
    std::unique_ptr<CoordinatorServer> server = Start();
    ASSERT_NE(server, nullptr);
    ConnectOptions tls;
    tls.address = absl::StrCat("127.0.0.1:", server->grpc_port());
    tls.tls_ca_file = (dir_ / "ca.pem").string();
    EXPECT_TRUE(ListJobs(*Connect(tls)).ok());
    // A plaintext client cannot talk to a TLS port.
    EXPECT_EQ(ListJobs(Plain(*server)).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  options_.tls_client_ca_file = (dir_ / "ca.pem").string();
  std::unique_ptr<CoordinatorServer> server = Start();
  ASSERT_NE(server, nullptr);
  ConnectOptions mtls;
  mtls.address = absl::StrCat("127.0.0.1:", server->grpc_port());
  mtls.tls_ca_file = (dir_ / "ca.pem").string();
  EXPECT_EQ(ListJobs(*Connect(mtls)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "a client without a certificate got in";
  mtls.tls_cert_file = (dir_ / "client.pem").string();
  mtls.tls_key_file = (dir_ / "client.key").string();
  EXPECT_TRUE(ListJobs(*Connect(mtls)).ok());
}

TEST_F(CoordinatorServerTest, StartUpErrorsNameTheProblem) {
  CoordinatorServerOptions bad = options_;
  bad.listen = "nowhere";
  EXPECT_THAT(CoordinatorServer::Start(bad).status().message(), HasSubstr("--listen"));
  bad = options_;
  bad.tls_key_file = "key.pem";
  EXPECT_THAT(CoordinatorServer::Start(bad).status().message(), HasSubstr("--tls-cert"));
  bad = options_;
  bad.fleet.heartbeat_interval = absl::Seconds(20);
  EXPECT_THAT(CoordinatorServer::Start(bad).status().message(), HasSubstr("heartbeat_interval"));

  // A port in use.
  std::unique_ptr<CoordinatorServer> first = Start();
  ASSERT_NE(first, nullptr);
  CoordinatorServerOptions second = options_;
  second.listen = absl::StrCat("127.0.0.1:", first->grpc_port());
  second.state_db = (dir_ / "other.db").string();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> clash = CoordinatorServer::Start(second);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable) << clash.status();
  // The same state file, on another port: refused while the first one runs.
  second.listen = "127.0.0.1:0";
  second.state_db = options_.state_db;
  clash = CoordinatorServer::Start(second);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition) << clash.status();
  EXPECT_THAT(clash.status().message(), HasSubstr("in use by another coordinator"));
  first.reset();

  // A state file that is not a database: refused, and left exactly as it was.
  const std::string garbage(10000, 'z');
  fs::remove(dir_ / "state.db-wal");
  fs::remove(dir_ / "state.db-shm");
  std::ofstream(dir_ / "state.db", std::ios::binary | std::ios::trunc) << garbage;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> damaged = CoordinatorServer::Start(options_);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_THAT(damaged.status().message(), HasSubstr("state.db"));
  EXPECT_EQ(ReadAll(dir_ / "state.db"), garbage);
}

}  // namespace
}  // namespace moetrain::server
