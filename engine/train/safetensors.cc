#include "engine/train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/core/json.h"
#include "engine/core/sha256.h"
#include "engine/core/status.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is read and written as raw memory");

constexpr char kMetadataKey[] = "__metadata__";
// The format's own limit (MAX_HEADER_SIZE of Hugging Face's safetensors, which refuses larger
// headers); a corrupt length must not become an allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Strided tensors are gathered into chunks of about this size before they are written.
constexpr size_t kGatherChunkBytes = size_t{4} << 20;
// One read or write call moves at most this much (Linux caps a call near 2 GiB anyway).
constexpr size_t kMaxIoBytes = size_t{1} << 30;

// Debian's Abseil is built with its own string_view, which StrCat needs.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Closes a descriptor when it goes out of scope (read paths only: close errors do not matter).
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::Status ReadFileAt(int fd, const std::string& path, void* data, size_t bytes,
                        uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd, p, std::min(bytes, kMaxIoBytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(errno, absl::StrCat("read ", path));
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, ": unexpected end of file at byte ", offset));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Hashed, synced files.

struct HashingFileWriter::HashState {
  Sha256Hasher sha256;
};

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  Sha256Hasher hash;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, absl::StrCat("open ", path));
  FdCloser closer{fd};
  std::vector<char> buffer(size_t{1} << 20);
  FileDigest digest;
  while (true) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    MOETRAIN_RETURN_IF_ERROR(hash.Update(buffer.data(), static_cast<size_t>(n)));
    digest.bytes += n;
  }
  MOETRAIN_ASSIGN_OR_RETURN(const std::string sha256, hash.Finish());
  digest.sha256 = absl::BytesToHexString(sha256);
  return digest;
}

HashingFileWriter::HashingFileWriter(std::string path, int fd, std::unique_ptr<HashState> hash)
    : path_(std::move(path)), fd_(fd), hash_(std::move(hash)) {}

HashingFileWriter::HashingFileWriter(HashingFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_(other.bytes_),
      hash_(std::move(other.hash_)) {}

HashingFileWriter& HashingFileWriter::operator=(HashingFileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_ = other.bytes_;
    hash_ = std::move(other.hash_);
  }
  return *this;
}

HashingFileWriter::~HashingFileWriter() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<HashingFileWriter> HashingFileWriter::Create(const std::string& path) {
  auto hash = std::make_unique<HashState>();
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError(errno, absl::StrCat("create ", path));
  return HashingFileWriter(path, fd, std::move(hash));
}

absl::Status HashingFileWriter::Append(const void* data, size_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  MOETRAIN_RETURN_IF_ERROR(hash_->sha256.Update(data, bytes));
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd_, p, std::min(bytes, kMaxIoBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(errno, absl::StrCat("write ", path_));
    p += n;
    bytes -= static_cast<size_t>(n);
    bytes_ += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> HashingFileWriter::Close() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  const int fd = std::exchange(fd_, -1);
  if (fsync(fd) != 0) {
    const int error_number = errno;
    close(fd);
    return IoError(error_number, absl::StrCat("fsync ", path_));
  }
  if (close(fd) != 0) return IoError(errno, absl::StrCat("close ", path_));
  FileDigest digest;
  digest.bytes = bytes_;
  MOETRAIN_ASSIGN_OR_RETURN(const std::string sha256, hash_->sha256.Finish());
  digest.sha256 = absl::BytesToHexString(sha256);
  return digest;
}

absl::StatusOr<FileDigest> WriteFileSynced(const std::string& path, std::string_view contents) {
  MOETRAIN_ASSIGN_OR_RETURN(HashingFileWriter writer, HashingFileWriter::Create(path));
  MOETRAIN_RETURN_IF_ERROR(writer.Append(contents));
  return writer.Close();
}

// ---------------------------------------------------------------------------------------------
// Dtypes.

namespace {
constexpr std::pair<DType, std::string_view> kDTypeNames[] = {
    {DType::kF32, "F32"},        {DType::kBF16, "BF16"}, {DType::kF8E4M3, "F8_E4M3"},
    {DType::kF8E5M2, "F8_E5M2"}, {DType::kI32, "I32"},   {DType::kI64, "I64"}};
}  // namespace

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, absl::StrCat("open ", dir));
  const int result = fsync(fd);
  const int error_number = errno;
  close(fd);
  if (result != 0) return IoError(error_number, absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& [d, name] : kDTypeNames) {
    if (d == dtype) return name;
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (const auto& [dtype, dtype_name] : kDTypeNames) {
    if (dtype_name == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", ToAbsl(name),
                   "\" (supported: F32, BF16, F8_E4M3, F8_E5M2, I32, I64)"));
}

// ---------------------------------------------------------------------------------------------
// Writing.

namespace {

int64_t ByteSize(const TensorView& t) {
  return t.numel() * static_cast<int64_t>(DTypeSize(t.dtype()));
}

// Appends a non-contiguous view in row-major order, gathering innermost rows into chunks.
absl::Status AppendStrided(HashingFileWriter& out, const TensorView& t) {
  const size_t element_bytes = DTypeSize(t.dtype());
  const int rank = t.rank();
  const int64_t inner = t.dim(rank - 1);  // rank >= 1: a scalar is always contiguous
  const int64_t inner_stride = t.stride(rank - 1);
  const int64_t rows = t.numel() / inner;
  std::vector<char> chunk;
  chunk.reserve(kGatherChunkBytes + static_cast<size_t>(inner) * element_bytes);
  int64_t index[kMaxRank] = {};  // position in dimensions [0, rank - 1)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t offset = 0;
    for (int d = 0; d < rank - 1; ++d) offset += index[d] * t.stride(d);
    const char* src = static_cast<const char*>(t.raw()) + offset * element_bytes;
    for (int64_t i = 0; i < inner; ++i) {
      const char* element = src + i * inner_stride * element_bytes;
      chunk.insert(chunk.end(), element, element + element_bytes);
    }
    if (chunk.size() >= kGatherChunkBytes) {
      MOETRAIN_RETURN_IF_ERROR(out.Append(chunk.data(), chunk.size()));
      chunk.clear();
    }
    for (int d = rank - 2; d >= 0; --d) {
      if (++index[d] < t.dim(d)) break;
      index[d] = 0;
    }
  }
  return out.Append(chunk.data(), chunk.size());
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              FileDigest* digest) {
  // Built as text: nlohmann's ordered objects look keys up linearly, and models have many
  // thousands of tensors. dump() escapes names and throws on invalid UTF-8.
  std::string header_text = "{";
  std::set<std::string> seen;
  uint64_t offset = 0;
  try {
    if (!metadata.empty()) {
      header_text += absl::StrCat("\"", kMetadataKey, "\":", nlohmann::json(metadata).dump());
    }
    // Not a structured binding: clang before 16 (the fuzz build) cannot capture one in a lambda.
    for (const auto& named : tensors) {
      const std::string& name = named.first;
      const TensorView& t = named.second;
      auto error = [&](std::string_view what) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor \"", name, "\": ", ToAbsl(what)));
      };
      if (name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": empty tensor name"));
      }
      if (name == kMetadataKey) return error("the name is reserved for the metadata");
      if (!seen.insert(name).second) return error("duplicate name");
      if (t.empty() && t.numel() != 0) return error("the view has no data");
      if (!t.device().is_cpu()) {
        return error(absl::StrCat("the view is of ", t.device().DebugString(),
                                  " memory; tensors are written from host memory"));
      }
      const uint64_t bytes = static_cast<uint64_t>(ByteSize(t));
      const nlohmann::json entry = {
          {"dtype", SafetensorsDTypeName(t.dtype())},
          {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())},
          {"data_offsets", {offset, offset + bytes}}};
      if (header_text.size() > 1) header_text += ",";
      header_text += absl::StrCat(nlohmann::json(name).dump(), ":", entry.dump());
      offset += bytes;
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor names and metadata must be valid UTF-8 (", e.what(), ")"));
  }
  header_text += "}";
  // The data section then starts 8-byte aligned, as the format asks.
  header_text.resize((header_text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_length = header_text.size();

  MOETRAIN_ASSIGN_OR_RETURN(HashingFileWriter out, HashingFileWriter::Create(path));
  MOETRAIN_RETURN_IF_ERROR(out.Append(&header_length, sizeof(header_length)));
  MOETRAIN_RETURN_IF_ERROR(out.Append(header_text));
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      MOETRAIN_RETURN_IF_ERROR(out.Append(t.raw(), static_cast<size_t>(ByteSize(t))));
    } else {
      MOETRAIN_RETURN_IF_ERROR(AppendStrided(out, t));
    }
  }
  MOETRAIN_ASSIGN_OR_RETURN(FileDigest written, out.Close());
  if (digest != nullptr) *digest = std::move(written);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Reading.

namespace {

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// A non-negative JSON integer that fits int64_t, or an error naming `what`.
absl::StatusOr<uint64_t> NonNegativeInteger(const nlohmann::json& value, std::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return v;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(what), " must be a non-negative integer, got ", JsonExcerpt(value)));
}

absl::StatusOr<Entry> ParseEntry(const std::string& name, const nlohmann::json& value) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected an object, got ", JsonExcerpt(value)));
  }
  Entry entry{name, DType::kF32, {}, 0, 0};
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("missing \"dtype\" string");
  }
  MOETRAIN_ASSIGN_OR_RETURN(entry.dtype, ParseSafetensorsDType(dtype->get<std::string>()));

  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("missing \"shape\" array");
  }
  if (shape->size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", JsonExcerpt(*shape), " has rank ",
                                                   shape->size(), ", more than ", kMaxRank));
  }
  // Overflow-checked: a corrupt extent must not wrap into a small, plausible size. The nonzero
  // extents' product must fit in int64 bytes even when another extent is 0: a tensor's strides
  // are products of its trailing extents, whether it has elements or not.
  uint64_t bytes = DTypeSize(entry.dtype);
  uint64_t nonzero_bytes = bytes;
  bool overflow = false;
  for (const nlohmann::json& extent : *shape) {
    MOETRAIN_ASSIGN_OR_RETURN(const uint64_t d, NonNegativeInteger(extent, "every extent"));
    entry.shape.push_back(static_cast<int64_t>(d));
    if (d == 0) {
      bytes = 0;
    } else if (nonzero_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d) {
      overflow = true;
    } else {
      nonzero_bytes *= d;
      bytes *= d;
    }
  }
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", JsonExcerpt(*shape), " is too large"));
  }

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
    return absl::InvalidArgumentError("missing \"data_offsets\" [begin, end]");
  }
  MOETRAIN_ASSIGN_OR_RETURN(entry.begin, NonNegativeInteger((*offsets)[0], "data_offsets begin"));
  MOETRAIN_ASSIGN_OR_RETURN(entry.end, NonNegativeInteger((*offsets)[1], "data_offsets end"));
  if (entry.end < entry.begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets ", JsonExcerpt(*offsets), ": end is before begin"));
  }
  if (entry.end - entry.begin != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", JsonExcerpt(*shape), " ", ToAbsl(dtype->get_ref<const std::string&>()), " needs ",
        bytes, " bytes, but data_offsets ", JsonExcerpt(*offsets), " span ",
        entry.end - entry.begin));
  }
  return entry;
}

}  // namespace

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

absl::StatusOr<TensorView> SafetensorsFile::View(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  return tensors_[it->second].second.view();
}

absl::StatusOr<Tensor> SafetensorsFile::Copy(const std::string& name) const {
  MOETRAIN_ASSIGN_OR_RETURN(const TensorView view, View(name));
  Tensor copy = Tensor::Empty(view.dtype(), view.shape());
  std::memcpy(copy.view().raw(), view.raw(), static_cast<size_t>(ByteSize(view)));
  return copy;
}

std::map<std::string, Tensor> SafetensorsFile::TakeTensors() {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : tensors_) out.emplace(name, std::move(t));
  tensors_.clear();
  index_.clear();
  return out;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(errno, absl::StrCat("open ", path));
  FdCloser closer{fd};
  return ReadSafetensors(fd, path);
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(int fd, const std::string& path) {
  auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  struct stat st;
  if (fstat(fd, &st) != 0) return IoError(errno, absl::StrCat("stat ", path));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    return invalid(
        absl::StrCat("the file has ", file_bytes, " bytes, too few for the 8-byte header length"));
  }
  uint64_t header_length = 0;
  MOETRAIN_RETURN_IF_ERROR(ReadFileAt(fd, path, &header_length, sizeof(header_length), 0));
  if (header_length > file_bytes - 8) {
    return invalid(absl::StrCat("header length ", header_length, " exceeds the ", file_bytes - 8,
                                " bytes after the length field"));
  }
  if (header_length > kMaxHeaderBytes) {
    return invalid(absl::StrCat("header length ", header_length, " exceeds the limit of ",
                                kMaxHeaderBytes, " bytes"));
  }
  std::string header_text(header_length, '\0');
  MOETRAIN_RETURN_IF_ERROR(ReadFileAt(fd, path, header_text.data(), header_text.size(), 8));
  absl::StatusOr<nlohmann::json> parsed = ParseJson(header_text, "the header");
  if (!parsed.ok()) return invalid(std::string(parsed.status().message()));
  const nlohmann::json header = *std::move(parsed);
  if (!header.is_object()) return invalid("the header is not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) return invalid("\"__metadata__\" is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return invalid(
              absl::StrCat("metadata \"", key, "\" is not a string: ", JsonExcerpt(text)));
        }
        file.metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<Entry> entry = ParseEntry(name, value);
    if (!entry.ok()) {
      return invalid(absl::StrCat("tensor \"", name, "\": ", entry.status().message()));
    }
    entries.push_back(*std::move(entry));
  }

  // The spans must tile [0, data_bytes) exactly; zero-byte tensors sort before the one they touch,
  // and among themselves by name (the order items() gave).
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_bytes = file_bytes - 8 - header_length;
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    const std::string span = absl::StrCat("data_offsets [", e.begin, ", ", e.end, "]");
    if (e.begin < covered) {
      return invalid(absl::StrCat("tensor \"", e.name, "\": ", span, " overlap tensor \"",
                                  previous->name, "\" (which ends at ", covered, ")"));
    }
    if (e.begin > covered) {
      return invalid(absl::StrCat("tensor \"", e.name, "\": ", span, " leave a gap of ",
                                  e.begin - covered, " bytes after offset ", covered));
    }
    if (e.end > data_bytes) {
      return invalid(absl::StrCat("tensor \"", e.name, "\": ", span,
                                  " run past the end of the data section (", data_bytes,
                                  " bytes): the file is truncated or the offsets are wrong"));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_bytes) {
    return invalid(absl::StrCat(data_bytes - covered, " bytes after offset ", covered,
                                " of the data section belong to no tensor"));
  }

  try {
    for (const Entry& e : entries) {
      Tensor t = Tensor::Empty(e.dtype, e.shape);
      MOETRAIN_RETURN_IF_ERROR(
          ReadFileAt(fd, path, t.view().raw(), e.end - e.begin, 8 + header_length + e.begin));
      file.index_[e.name] = file.tensors_.size();
      file.tensors_.emplace_back(e.name, std::move(t));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of memory reading ", data_bytes, " bytes of tensors"));
  }
  return file;
}

}  // namespace moetrain
