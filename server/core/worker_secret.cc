#include "server/core/worker_secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "engine/core/sha256.h"

namespace moetrain::server {

absl::StatusOr<std::string> NewWorkerSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("the system's random generator failed to make a worker secret");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string WorkerSecretDigest(absl::string_view secret) {
  absl::StatusOr<std::string> digest = Sha256Digest(secret);
  return digest.ok() ? *std::move(digest) : std::string();
}

bool WorkerSecretMatches(absl::string_view digest, absl::string_view secret) {
  const std::string presented = WorkerSecretDigest(secret);
  // Both are SHA-256 digests of 32 bytes unless `digest` is damaged or OpenSSL failed (an empty
  // digest): then nothing matches.
  return presented.size() == kSha256Bytes && digest.size() == presented.size() &&
         CRYPTO_memcmp(digest.data(), presented.data(), presented.size()) == 0;
}

}  // namespace moetrain::server
