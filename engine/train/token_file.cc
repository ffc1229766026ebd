#include "engine/train/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

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

}  // namespace

// The whole file, mapped read-only (pages come in on demand, so a large shard costs address
// space, not memory). An empty file has no mapping.
class TokenFile::Mapping {
 public:
  static absl::StatusOr<std::shared_ptr<const Mapping>> Map(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == ENOENT) return absl::NotFoundError(absl::StrCat(Where(path), "no such file"));
      return FromErrno(error, path, "open");
    }
    auto mapping = std::shared_ptr<Mapping>(new Mapping);
    absl::Status status = mapping->MapFd(fd, path);
    ::close(fd);
    MOETRAIN_RETURN_IF_ERROR(status);
    return std::shared_ptr<const Mapping>(std::move(mapping));
  }

  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, static_cast<size_t>(size_));
  }

  const unsigned char* data() const { return static_cast<const unsigned char*>(data_); }
  int64_t size() const { return size_; }

 private:
  Mapping() = default;

  absl::Status MapFd(int fd, const std::string& path) {
    struct stat info;
    if (::fstat(fd, &info) != 0) return FromErrno(errno, path, "fstat");
    if (!S_ISREG(info.st_mode)) return Invalid(path, "is not a regular file");
    size_ = static_cast<int64_t>(info.st_size);
    if (size_ == 0) return absl::OkStatus();
    void* data = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) return FromErrno(errno, path, "mmap");
    data_ = data;
    return absl::OkStatus();
  }

  void* data_ = nullptr;
  int64_t size_ = 0;
};

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFileFormat format,
                                          int64_t vocab_size, int64_t min_tokens) {
  TokenFile file;
  file.path_ = path;
  file.format_ = format;
  MOETRAIN_ASSIGN_OR_RETURN(file.mapping_, Mapping::Map(path));
  const unsigned char* bytes = file.mapping_->data();
  const int64_t size = file.mapping_->size();

  switch (format) {
    case TokenFileFormat::kLlmc: {
      if (size < kLlmcHeaderBytes) {
        return Invalid(path, absl::StrCat("has ", size, " bytes, fewer than the ", kLlmcHeaderBytes,
                                          "-byte llm.c header"));
      }
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
  file.tokens_ = bytes == nullptr ? nullptr : bytes + file.data_offset_;

  if (file.num_tokens_ < min_tokens) {
    return Invalid(path,
                   absl::StrCat(FormatName(format), " has ", file.num_tokens_,
                                " tokens, fewer than one sequence of seq_len + 1 = ", min_tokens));
  }
  // Bytes are always below 256 <= vocab_size (checked above); wider tokens need a scan unless
  // the vocabulary covers all of them. Read returns int32, so uint32 tokens stop below 2^31
  // whatever the vocabulary.
  const int64_t token_limit = std::min(vocab_size, int64_t{1} << 31);
  if (file.token_bytes_ > 1 && token_limit < (int64_t{1} << (8 * file.token_bytes_))) {
    const uint32_t limit = token_limit < 0 ? 0 : static_cast<uint32_t>(token_limit);
    for (int64_t i = 0; i < file.num_tokens_; ++i) {
      const uint32_t token = LoadToken(file.tokens_ + file.token_bytes_ * i, file.token_bytes_);
      if (token >= limit) {
        return Invalid(path,
                       absl::StrCat("token ", token, " at byte offset ", file.ByteOffset(i),
                                    token >= vocab_size
                                        ? absl::StrCat(" is >= model.vocab_size = ", vocab_size)
                                        : std::string(" is >= 2^31, above any token id")));
      }
    }
  }
  return file;
}

void TokenFile::Read(int64_t begin, int64_t count, int32_t* out) const {
  if (token_bytes_ == 1) {
    for (int64_t j = 0; j < count; ++j) out[j] = tokens_[begin + j];
    return;
  }
  const unsigned char* p = tokens_ + token_bytes_ * begin;
  if (token_bytes_ == 2) {
    for (int64_t j = 0; j < count; ++j) out[j] = static_cast<int32_t>(LoadU16(p + 2 * j));
    return;
  }
  // Open checked every uint32 token is below 2^31.
  for (int64_t j = 0; j < count; ++j) out[j] = static_cast<int32_t>(LoadU32(p + 4 * j));
}

}  // namespace moetrain
