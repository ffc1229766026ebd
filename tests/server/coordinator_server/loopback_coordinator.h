// A real CoordinatorServer inside the test process, for the tests of its clients (the worker, the
// CLI): gRPC on 127.0.0.1 only (no HTTP endpoint), its state file and checkpoint root in `dir`.
//
//   server::FleetOptions fleet;
//   fleet.heartbeat_timeout = absl::Seconds(2);   // each suite picks its own timings
//   absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> coordinator =
//       testutil::StartLoopbackCoordinator(dir, /*port=*/0, token, fleet);
//
// Port 0 picks a free one (grpc_port() tells which); a restart passes the port of the last one.
// The fleet's checkpoint_dir is set to dir/checkpoints.
#ifndef MOETRAIN_TESTS_SERVER_COORDINATOR_SERVER_LOOPBACK_COORDINATOR_H_
#define MOETRAIN_TESTS_SERVER_COORDINATOR_SERVER_LOOPBACK_COORDINATOR_H_

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/coordinator_server.h"

namespace moetrain::testutil {

inline std::filesystem::path LoopbackStateDb(const std::filesystem::path& dir) {
  return dir / "coordinator.db";
}

inline absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> StartLoopbackCoordinator(
    const std::filesystem::path& dir, int port, const std::string& bearer_token,
    server::FleetOptions fleet) {
  server::CoordinatorServerOptions options;
  options.listen = absl::StrCat("127.0.0.1:", port);
  options.http_listen = "";
  options.state_db = LoopbackStateDb(dir).string();
  options.bearer_token = bearer_token;
  fleet.checkpoint_dir = (dir / "checkpoints").string();
  options.fleet = std::move(fleet);
  return server::CoordinatorServer::Start(options);
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_SERVER_COORDINATOR_SERVER_LOOPBACK_COORDINATOR_H_
