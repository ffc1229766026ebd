#include "engine/train/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

// Every message starts with the config field and the file it names.
std::string Where(const std::string& path) { return absl::StrCat("data.path ", path, ": "); }

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Where(path), what));
}

absl::Status FromErrno(int error, const std::string& path, absl::string_view call) {
  return IoError(error, absl::StrCat(Where(path), call, " failed"));
}

// Little-endian reads, whatever the host's byte order.
uint32_t LoadU16(const unsigned char* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8; }
uint32_t LoadU32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
int32_t LoadI32(const unsigned char* p) { return static_cast<int32_t>(LoadU32(p)); }

uint32_t LoadToken(const unsigned char* p, int64_t token_bytes) {
  switch (token_bytes) {
    case 1:
      return p[0];
    case 2:
      return LoadU16(p);
    default:
      return LoadU32(p);
  }
}

absl::string_view FormatName(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::kLlmc:
      return "llm.c token shard";
    case TokenFileFormat::kU16:
      return "uint16 token file";
    case TokenFileFormat::kU32:
      return "uint32 token file";
    case TokenFileFormat::kText:
      return "text file";
  }
  return "token file";
}

// Tokens Open checks per Read while it scans the file: a 1 MiB buffer at most.
constexpr int64_t kScanTokens = int64_t{1} << 18;
// One pread moves at most this much (Linux caps a call near 2 GiB anyway).
constexpr int64_t kMaxReadBytes = int64_t{1} << 30;

}  // namespace

// The open file; closed when the last TokenFile that reads it goes.
class TokenFile::Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { ::close(fd_); }

  int fd() const { return fd_; }

 private:
  const int fd_;
};

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFileFormat format,
                                          int64_t vocab_size, int64_t min_tokens) {
  TokenFile file;
  file.path_ = path;
  file.format_ = format;
  file.vocab_size_ = vocab_size;
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(Where(path), "no such file"));
    return FromErrno(error, path, "open");
  }
  file.file_ = std::make_shared<const Descriptor>(fd);
  struct stat info;
  if (::fstat(fd, &info) != 0) return FromErrno(errno, path, "fstat");
  if (!S_ISREG(info.st_mode)) return Invalid(path, "is not a regular file");
  const int64_t size = static_cast<int64_t>(info.st_size);
  file.file_bytes_ = size;
  file.mtime_ns_ = int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;

  switch (format) {
    case TokenFileFormat::kLlmc: {
      if (size < kLlmcHeaderBytes) {
        return Invalid(path, absl::StrCat("has ", size, " bytes, fewer than the ", kLlmcHeaderBytes,
                                          "-byte llm.c header"));
      }
      unsigned char bytes[12];
      MOETRAIN_RETURN_IF_ERROR(file.ReadBytes(0, sizeof(bytes), bytes));
      const int32_t magic = LoadI32(bytes);
      const int32_t version = LoadI32(bytes + 4);
      const int32_t declared = LoadI32(bytes + 8);
      if (magic != kLlmcMagic) {
        return Invalid(path, absl::StrCat("magic ", magic, " at byte offset 0 is not the llm.c ",
                                          "token shard magic ", kLlmcMagic));
      }
      if (version != kLlmcVersionU16 && version != kLlmcVersionU32) {
        return Invalid(
            path, absl::StrCat("version ", version,
                               " at byte offset 4 is not a supported version: ", kLlmcVersionU16,
                               " (uint16 tokens) or ", kLlmcVersionU32, " (uint32 tokens)"));
      }
      if (declared < 0) {
        return Invalid(path,
                       absl::StrCat("token count ", declared, " at byte offset 8 is negative"));
      }
      const int64_t token_bytes = version == kLlmcVersionU32 ? 4 : 2;
      const int64_t expected = kLlmcHeaderBytes + token_bytes * int64_t{declared};
      if (size != expected) {
        return Invalid(path, absl::StrCat("token count ", declared, " at byte offset 8 needs ",
                                          expected, " bytes (version ", version, ", ", token_bytes,
                                          " bytes per token), but the file has ", size,
                                          size < expected ? " (truncated)"
                                                          : absl::StrCat(" (", size - expected,
                                                                         " extra bytes)")));
      }
      file.data_offset_ = kLlmcHeaderBytes;
      file.token_bytes_ = token_bytes;
      file.num_tokens_ = declared;
      break;
    }
    case TokenFileFormat::kU16:
      if (size % 2 != 0) {
        return Invalid(path, absl::StrCat("has an odd byte count ", size,
                                          "; a uint16 token file has 2 bytes per token"));
      }
      file.data_offset_ = 0;
      file.token_bytes_ = 2;
      file.num_tokens_ = size / 2;
      break;
    case TokenFileFormat::kU32:
      if (size % 4 != 0) {
        return Invalid(path, absl::StrCat("has ", size, " bytes, not a multiple of 4; a uint32 ",
                                          "token file has 4 bytes per token (", size % 4,
                                          " extra bytes at byte offset ", size - size % 4, ")"));
      }
      file.data_offset_ = 0;
      file.token_bytes_ = 4;
      file.num_tokens_ = size / 4;
      break;
    case TokenFileFormat::kText:
      if (vocab_size < kByteVocabSize) {
        return Invalid(path,
                       absl::StrCat("a text file uses the byte-level tokenizer, which needs ",
                                    "model.vocab_size >= ", kByteVocabSize, ", got ", vocab_size));
      }
      file.data_offset_ = 0;
      file.token_bytes_ = 1;
      file.num_tokens_ = size;
      break;
    default:
      return Invalid(
          path, absl::StrCat("format ", static_cast<int>(format), " is not a token file format"));
  }
  if (file.num_tokens_ < min_tokens) {
    return Invalid(path,
                   absl::StrCat(FormatName(format), " has ", file.num_tokens_,
                                " tokens, fewer than one sequence of seq_len + 1 = ", min_tokens));
  }
  // Bytes are always below 256 <= vocab_size (checked above); wider tokens need a scan unless
  // the vocabulary covers all of them. Read returns int32, so uint32 tokens stop below 2^31
  // whatever the vocabulary.
  const int64_t token_limit = std::min(vocab_size, int64_t{1} << 31);
  file.token_limit_ = token_limit < 0 ? 0 : static_cast<uint32_t>(token_limit);
  if (file.token_bytes_ > 1 && token_limit < (int64_t{1} << (8 * file.token_bytes_))) {
    std::vector<int32_t> scratch(static_cast<size_t>(std::min(file.num_tokens_, kScanTokens)));
    for (int64_t begin = 0; begin < file.num_tokens_; begin += kScanTokens) {
      MOETRAIN_RETURN_IF_ERROR(
          file.Read(begin, std::min(kScanTokens, file.num_tokens_ - begin), scratch.data()));
    }
  }
  return file;
}

absl::Status TokenFile::ReadBytes(int64_t offset, int64_t bytes, void* out) const {
  auto* p = static_cast<unsigned char*>(out);
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n =
        ::pread(file_->fd(), p + done, std::min(bytes - done, kMaxReadBytes), offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FromErrno(errno, path_, "pread");
    if (n == 0) {
      struct stat info;
      const int64_t now = ::fstat(file_->fd(), &info) == 0 ? int64_t{info.st_size} : -1;
      return absl::FailedPreconditionError(absl::StrCat(
          Where(path_), "byte offset ", offset + done, " is past the end of the file, which has ",
          now, " bytes now and had ", file_bytes_,
          " when it was opened: it was truncated or rewritten while in use. Restore the file, or "
          "train on the new data in a new job"));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status TokenFile::Read(int64_t begin, int64_t count, int32_t* out) const {
  // The raw tokens go into the first count·token_bytes bytes of `out` and are widened in place
  // from the last: token j's 4 bytes overwrite only raw tokens >= j, which are read already.
  auto* raw = reinterpret_cast<unsigned char*>(out);
  MOETRAIN_RETURN_IF_ERROR(ReadBytes(ByteOffset(begin), count * token_bytes_, raw));
  int64_t first_bad = -1;  // the first token out of range, as Open reports it
  uint32_t bad_token = 0;
  for (int64_t j = count - 1; j >= 0; --j) {
    const uint32_t token = LoadToken(raw + token_bytes_ * j, token_bytes_);
    if (token >= token_limit_) {
      first_bad = j;
      bad_token = token;
    }
    out[j] = static_cast<int32_t>(token);
  }
  if (first_bad < 0) return absl::OkStatus();
  return Invalid(
      path_, absl::StrCat("token ", bad_token, " at byte offset ", ByteOffset(begin + first_bad),
                          bad_token >= vocab_size_
                              ? absl::StrCat(" is >= model.vocab_size = ", vocab_size_)
                              : std::string(" is >= 2^31, above any token id")));
}

}  // namespace moetrain
