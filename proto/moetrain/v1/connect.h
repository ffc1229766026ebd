// How the CLI and the workers reach a coordinator: the channel (plain, TLS, or mTLS), the bearer
// token, and what a failed call means for the caller.
//
//   MOETRAIN_ASSIGN_OR_RETURN(Connection connection, Connect(options));
//   grpc::ClientContext context;
//   connection.Prepare(&context, absl::Seconds(10));
//   stub->GetJob(&context, request, &response);
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_CONNECT_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_CONNECT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace moetrain {

struct ConnectOptions {
  // host:port of the coordinator's gRPC port.
  std::string address = "127.0.0.1:7070";
  // A file holding the bearer token (surrounding whitespace ignored); empty = no token.
  std::string token_file;
  // PEM CA certificate to verify the coordinator with; set = TLS.
  std::string tls_ca_file;
  // PEM client certificate and key, for a coordinator that requires them (mTLS); need tls_ca_file.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// The token in `path`, trimmed. NotFound when the file cannot be read; InvalidArgument when it
// is empty or holds more than one line or non-printable characters.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The gRPC metadata that carries a worker's identity on WorkerService calls (see worker.proto).
inline constexpr char kWorkerIdMetadata[] = "x-moetrain-worker-id";
inline constexpr char kWorkerSecretMetadata[] = "x-moetrain-worker-secret";

struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::string token;  // empty = none
  // A registered worker's identity, from RegisterWorker; empty = none (the CLI, a registration).
  std::string worker_id;
  std::string worker_secret;

  // Sets the authorization metadata (when there is a token), the worker's id and secret (when
  // set) and a deadline `timeout` from now (none when infinite).
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;
};

// Builds the channel (it connects lazily, on the first call). InvalidArgument / NotFound naming
// the option for unreadable files or incomplete TLS options.
absl::StatusOr<Connection> Connect(const ConnectOptions& options);

// grpc::Status → absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace moetrain

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_CONNECT_H_
