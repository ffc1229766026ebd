#include "engine/core/sha256.h"

#include <algorithm>
#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

std::string HexDigest(absl::string_view bytes) {
  absl::StatusOr<std::string> digest = Sha256Digest(bytes);
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.ok() ? absl::BytesToHexString(*digest) : "";
}

// FIPS 180-4's examples (and the empty message).
TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(HexDigest(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HexDigest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexDigest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, DigestIsThirtyTwoRawBytes) {
  absl::StatusOr<std::string> digest = Sha256Digest("abc");
  ASSERT_TRUE(digest.ok()) << digest.status();
  ASSERT_EQ(digest->size(), kSha256Bytes);
  EXPECT_EQ(static_cast<unsigned char>((*digest)[0]), 0xba);
  EXPECT_EQ(static_cast<unsigned char>((*digest)[31]), 0xad);
}

// Bytes with every value, NULs included, cut at ragged points: the hasher's digest is the
// one-shot digest of the whole.
TEST(Sha256Test, HasherInPiecesMatchesOneShot) {
  std::string message;
  for (int i = 0; i < 1000; ++i) message.push_back(static_cast<char>((i * 37 + 11) % 256));
  absl::StatusOr<std::string> whole = Sha256Digest(message);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (size_t piece : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{999}}) {
    Sha256Hasher hasher;
    for (size_t at = 0; at < message.size(); at += piece) {
      const size_t n = std::min(piece, message.size() - at);
      ASSERT_TRUE(hasher.Update(message.data() + at, n).ok());
    }
    absl::StatusOr<std::string> digest = hasher.Finish();
    ASSERT_TRUE(digest.ok()) << digest.status();
    EXPECT_EQ(*digest, *whole) << "pieces of " << piece;
  }
}

TEST(Sha256Test, SpentHasherRefuses) {
  Sha256Hasher hasher;
  ASSERT_TRUE(hasher.Update("abc", 3).ok());
  ASSERT_TRUE(hasher.Finish().ok());
  EXPECT_EQ(hasher.Update("abc", 3).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(hasher.Finish().status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace moetrain
