// Token files on disk, validated once when opened, then read with pread as the loader needs them.
// They are not memory-mapped: a file truncated or rewritten while a job reads it must be an error
// naming the file, not a SIGBUS that kills the process.
//
// Formats (every integer little-endian):
//   llm.c shard: 256 int32 header (header[0] = 20240520 magic, header[1] = version, header[2] =
//                N token count), then N tokens whose width the version selects: version 1 =
//                uint16 (the file is exactly 1024 + 2N bytes), version 2 = uint32 (exactly
//                1024 + 4N bytes, for vocabularies above 65,536).
//   raw uint16:  the whole file is uint16 tokens (a byte count that is a multiple of 2).
//   raw uint32:  the whole file is uint32 tokens (a byte count that is a multiple of 4).
//   text:        byte-level tokenizer: every byte is one token in [0, 256); any bytes, valid
//                UTF-8 or not.
#ifndef MOETRAIN_ENGINE_TRAIN_TOKEN_FILE_H_
#define MOETRAIN_ENGINE_TRAIN_TOKEN_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace moetrain {

inline constexpr int32_t kLlmcMagic = 20240520;
// header[1] of an llm.c shard: the token width.
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcVersionU32 = 2;
inline constexpr int64_t kLlmcHeaderInts = 256;
inline constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;
// Tokens of the byte-level text tokenizer.
inline constexpr int64_t kByteVocabSize = 256;

// kLlmc reads both llm.c versions; the header says which.
enum class TokenFileFormat { kLlmc, kU16, kU32, kText };

class TokenFile {
 public:
  // Opens `path` read-only and checks it: a regular file, the header (llm.c), the byte count
  // against the format, every token < vocab_size (the model's vocabulary, reported as
  // model.vocab_size) and < 2^31 (Read's int32), and at least min_tokens tokens. NotFound for a
  // missing file; InvalidArgument for a malformed one, naming the path, the byte offset where one
  // applies, and what is wrong:
  // "data.path /x/a.bin: token 70000 at byte offset 1052 is >= model.vocab_size = 50257".
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenFileFormat format,
                                        int64_t vocab_size, int64_t min_tokens);

  const std::string& path() const { return path_; }
  TokenFileFormat format() const { return format_; }
  int64_t num_tokens() const { return num_tokens_; }
  // 1 (text), 2 (uint16, llm.c version 1) or 4 (uint32, llm.c version 2).
  int64_t token_bytes() const { return token_bytes_; }
  // Where token i starts in the file (after the header for llm.c).
  int64_t ByteOffset(int64_t i) const { return data_offset_ + i * token_bytes_; }
  // The file's size and modification time (st_mtim, in nanoseconds since the Unix epoch) when Open
  // checked it: what a checkpoint records of the data it was trained on.
  int64_t file_bytes() const { return file_bytes_; }
  int64_t mtime_ns() const { return mtime_ns_; }

  // out[j] = token begin + j for j < count. Needs 0 <= begin <= begin + count <= num_tokens().
  // Reads the file again, with one pread for the whole range (into `out` itself: no other
  // buffer; more than 1 GiB takes several), and checks each token as Open did. When the file
  // changed since Open: FailedPrecondition if it is now too short, naming the path, the byte offset
  // and both sizes; InvalidArgument, as Open's, for a token out of range. Another read error is
  // Unavailable or as IoError maps it.
  absl::Status Read(int64_t begin, int64_t count, int32_t* out) const;

 private:
  class Descriptor;

  TokenFile() = default;

  // Exactly `bytes` bytes at `offset` into `out`; FailedPrecondition when the file ends first.
  absl::Status ReadBytes(int64_t offset, int64_t bytes, void* out) const;

  std::string path_;
  TokenFileFormat format_ = TokenFileFormat::kU16;
  std::shared_ptr<const Descriptor> file_;  // shared: copies of a TokenFile read one descriptor
  int64_t data_offset_ = 0;                 // bytes before the first token
  int64_t token_bytes_ = 2;                 // 1 (text), 2 (uint16) or 4 (uint32)
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;    // model.vocab_size, for the messages
  uint32_t token_limit_ = 0;  // every token is below it: min(vocab_size, 2^31)
  int64_t file_bytes_ = 0;
  int64_t mtime_ns_ = 0;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_TOKEN_FILE_H_
