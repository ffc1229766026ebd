// The assembled coordinator answers requests whose bytes do not parse with INVALID_ARGUMENT and
// a message naming the method, on both services (gRPC's own answer is INTERNAL, no message).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/server/coordinator_server/loopback_coordinator.h"
#include "tests/server/grpc/generic_unary_call.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

constexpr char kToken[] = "malformed-test-token";

TEST(MalformedRequestTest, EveryServiceAnswersInvalidArgumentNamingTheMethod) {
  const testutil::TempDir dir("malformed_request");
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      testutil::StartLoopbackCoordinator(dir.path(), 0, kToken, FleetOptions());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  // Field 1, length-delimited, 127 bytes announced and 2 present.
  const std::string garbage(
      "\x0a\x7f"
      "ab",
      4);
  for (const char* method :
       {"/moetrain.v1.JobService/GetJob", "/moetrain.v1.WorkerService/Heartbeat",
        "/moetrain.v1.WorkerService/ReportStep"}) {
    SCOPED_TRACE(method);
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status status = testutil::GenericUnaryCall(generic, &context, method, garbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find(method), std::string::npos) << status.error_message();
  }
  (*server)->Shutdown();
  server->reset();
}

}  // namespace
}  // namespace moetrain::server
