// The token-file reader (TokenFile::Open, engine/train/token_file.h) on arbitrary file contents,
// as an llm.c shard first (version 1 or 2), then as raw uint16, raw uint32 and as text. Beyond not
// crashing: a refusal is InvalidArgument, and an accepted file has the token count its format
// implies, reads whole, and every token Read() returns is below the vocabulary.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/train/token_file.h"
#include "tests/fuzz/fuzz_util.h"

namespace moetrain::fuzz {
namespace {

// GPT-2's vocabulary: uint16 tokens above it must be refused.
constexpr int64_t kVocabSize = 50257;
constexpr int64_t kMinTokens = 2;

void Check(const std::string& path, size_t size, TokenFileFormat format) {
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, format, kVocabSize, kMinTokens);
  if (!file.ok()) {
    ExpectCode(file.status(), {absl::StatusCode::kInvalidArgument}, "TokenFile::Open");
    return;
  }
  const int64_t bytes = static_cast<int64_t>(size);
  const int64_t n = file->num_tokens();
  const int64_t width = file->token_bytes();
  const bool width_ok = format == TokenFileFormat::kLlmc  ? width == 2 || width == 4
                        : format == TokenFileFormat::kU16 ? width == 2
                        : format == TokenFileFormat::kU32 ? width == 4
                                                          : width == 1;
  const int64_t header = format == TokenFileFormat::kLlmc ? kLlmcHeaderBytes : 0;
  const bool count_ok = width_ok && bytes == header + width * n;
  if (!count_ok || n < kMinTokens) {
    Fail(absl::StrCat("TokenFile::Open accepted ", bytes, " bytes as ", n, " tokens"));
  }
  // In uneven chunks, as the data loader reads sequences.
  std::vector<int32_t> tokens(97);
  for (int64_t begin = 0; begin < n; begin += static_cast<int64_t>(tokens.size())) {
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(tokens.size()), n - begin);
    const absl::Status read = file->Read(begin, count, tokens.data());
    if (!read.ok()) Fail("Read of an unchanged file failed", read);
    for (int64_t j = 0; j < count; ++j) {
      if (tokens[j] < 0 || tokens[j] >= kVocabSize) {
        Fail(absl::StrCat("token ", begin + j, " = ", tokens[j], " is outside the vocabulary"));
      }
    }
  }
}

}  // namespace
}  // namespace moetrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = moetrain::fuzz::WriteScratchFile("tokens.bin", data, size);
  moetrain::fuzz::Check(path, size, moetrain::TokenFileFormat::kLlmc);
  moetrain::fuzz::Check(path, size, moetrain::TokenFileFormat::kU16);
  moetrain::fuzz::Check(path, size, moetrain::TokenFileFormat::kU32);
  moetrain::fuzz::Check(path, size, moetrain::TokenFileFormat::kText);
  return 0;
}
