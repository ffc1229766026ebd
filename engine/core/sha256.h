// SHA-256 over OpenSSL's EVP interface, every call checked: incrementally (files streamed through
// a hasher) or of bytes in one call. Digests are the 32 raw bytes; absl::BytesToHexString gives
// the 64 lowercase hex digits that checkpoints and the store keep.
#ifndef MOETRAIN_ENGINE_CORE_SHA256_H_
#define MOETRAIN_ENGINE_CORE_SHA256_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// OpenSSL's EVP_MD_CTX, so that this header needs none of OpenSSL's.
struct evp_md_ctx_st;

namespace moetrain {

inline constexpr size_t kSha256Bytes = 32;

// Hashes what is given to Update, in order. Internal errors when OpenSSL fails, and when the
// hasher is used after Finish.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  absl::Status Update(const void* data, size_t bytes);
  // The digest of everything updated so far; the hasher is spent.
  absl::StatusOr<std::string> Finish();

 private:
  evp_md_ctx_st* ctx_;
  bool ok_;  // initialized, and neither failed nor finished
};

// The digest of `bytes` (32 raw bytes).
absl::StatusOr<std::string> Sha256Digest(absl::string_view bytes);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_SHA256_H_
