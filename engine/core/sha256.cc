#include "engine/core/sha256.h"

#include <openssl/evp.h>

namespace moetrain {

Sha256Hasher::Sha256Hasher() : ctx_(EVP_MD_CTX_new()) {
  ok_ = ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1;
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(ctx_); }

absl::Status Sha256Hasher::Update(const void* data, size_t bytes) {
  if (!ok_ || EVP_DigestUpdate(ctx_, data, bytes) != 1) {
    ok_ = false;
    return absl::InternalError("OpenSSL SHA-256 failed (or the hasher was already finished)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Sha256Hasher::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  const bool finished = ok_ && EVP_DigestFinal_ex(ctx_, digest, &size) == 1;
  ok_ = false;
  if (!finished || size != kSha256Bytes) {
    return absl::InternalError("OpenSSL SHA-256 failed (or the hasher was already finished)");
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

absl::StatusOr<std::string> Sha256Digest(absl::string_view bytes) {
  Sha256Hasher hasher;
  absl::Status updated = hasher.Update(bytes.data(), bytes.size());
  if (!updated.ok()) return updated;
  return hasher.Finish();
}

}  // namespace moetrain
