#include "moetrain/v1/connect.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace moetrain {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read '", path, "'"));
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile("token file", path);
  if (!contents.ok()) return contents.status();
  const std::string token(absl::StripAsciiWhitespace(*contents));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' is empty"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file '", path, "' holds whitespace or non-printable characters inside the token"));
    }
  }
  return token;
}

void Connection::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  if (!worker_id.empty()) context->AddMetadata(kWorkerIdMetadata, worker_id);
  if (!worker_secret.empty()) context->AddMetadata(kWorkerSecretMetadata, worker_secret);
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  }
}

absl::StatusOr<Connection> Connect(const ConnectOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("coordinator address is empty");
  Connection connection;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(options.token_file);
    if (!token.ok()) return token.status();
    connection.token = *token;
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (!options.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile("--tls-ca", options.tls_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!options.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile("--tls-cert", options.tls_cert_file);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile("--tls-key", options.tls_key_file);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  } else if (!options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca (client certificates need TLS)");
  }
  grpc::ChannelArguments arguments;
  // Reconnect quickly after a coordinator restart: the default backoff grows to two minutes.
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
  connection.channel = grpc::CreateCustomChannel(options.address, credentials, arguments);
  return connection;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace moetrain
