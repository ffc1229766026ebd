// The per-worker credential the coordinator issues at registration: a random secret, of which it
// keeps only a SHA-256 digest, and the constant-time check of a presented secret against it.
#ifndef MOETRAIN_SERVER_CORE_WORKER_SECRET_H_
#define MOETRAIN_SERVER_CORE_WORKER_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moetrain::server {

// 64 lowercase hex digits: 256 bits from the system's CSPRNG (OpenSSL's RAND_bytes). Internal
// when the generator fails.
absl::StatusOr<std::string> NewWorkerSecret();

// The 32-byte SHA-256 digest of `secret`, as stored; empty when OpenSSL fails (no secret matches
// an empty digest).
std::string WorkerSecretDigest(absl::string_view secret);

// Whether `secret` hashes to `digest`; the comparison takes the same time wherever they differ.
bool WorkerSecretMatches(absl::string_view digest, absl::string_view secret);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_WORKER_SECRET_H_
