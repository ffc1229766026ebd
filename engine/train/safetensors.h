// The Hugging Face safetensors format, and the hashed, fsynced file writes that checkpoints use.
//
// Layout: an 8-byte little-endian header length N; N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [4, 8], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>", ...}}
// padded with spaces to a multiple of 8; then the raw little-endian data of every tensor,
// contiguous, with offsets relative to the end of the header. Supported dtypes: F32, BF16,
// F8_E4M3, F8_E5M2, I32, I64.
#ifndef MOETRAIN_ENGINE_TRAIN_SAFETENSORS_H_
#define MOETRAIN_ENGINE_TRAIN_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace moetrain {

// The size and SHA-256 of a file's contents.
struct FileDigest {
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

// Streams the file at `path` through SHA-256.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// Writes a new file front to back, hashing what it writes; Close() fsyncs it. A writer destroyed
// without Close() closes the file unsynced (the caller is abandoning it after an error).
class HashingFileWriter {
 public:
  // Creates (or truncates) `path`.
  static absl::StatusOr<HashingFileWriter> Create(const std::string& path);

  HashingFileWriter(HashingFileWriter&& other) noexcept;
  HashingFileWriter& operator=(HashingFileWriter&& other) noexcept;
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;
  ~HashingFileWriter();

  absl::Status Append(const void* data, size_t bytes);
  absl::Status Append(std::string_view data) { return Append(data.data(), data.size()); }
  // fsync, close; the digest of everything appended.
  absl::StatusOr<FileDigest> Close();

 private:
  struct HashState;
  HashingFileWriter(std::string path, int fd, std::unique_ptr<HashState> hash);

  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  std::unique_ptr<HashState> hash_;
};

// Writes `contents` to a new file at `path` and fsyncs it.
absl::StatusOr<FileDigest> WriteFileSynced(const std::string& path, std::string_view contents);

// Makes a directory's entries (files created in it, renames into it) durable: fsyncs `dir`.
absl::Status SyncDirectory(const std::string& dir);

// "F32", "BF16", "F8_E4M3", "F8_E5M2", "I32", "I64".
std::string_view SafetensorsDTypeName(DType dtype);
// Inverse of SafetensorsDTypeName; InvalidArgument naming the value otherwise.
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);

// Writes `tensors` in the given order (strided views are written contiguous) with `metadata`
// under "__metadata__", then fsyncs the file. Names must be unique, non-empty and not
// "__metadata__"; a view may lack data only when it has no elements. When `digest` is given it
// receives the file's size and SHA-256, computed while writing.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              FileDigest* digest = nullptr);

// A safetensors file read into memory: one owned, 64-byte aligned tensor per entry.
class SafetensorsFile {
 public:
  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Names in data order (the order they were written), except that zero-byte tensors sharing an
  // offset come by name: the header is a JSON object, which keeps no order of its own.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  // A view of the tensor called `name`, valid while this file lives; NotFound otherwise.
  absl::StatusOr<TensorView> View(const std::string& name) const;
  // An owned copy of the tensor called `name`; NotFound otherwise.
  absl::StatusOr<Tensor> Copy(const std::string& name) const;
  // Moves every tensor out, by name; the file holds no tensors afterwards.
  std::map<std::string, Tensor> TakeTensors();

 private:
  friend absl::StatusOr<SafetensorsFile> ReadSafetensors(int fd, const std::string& path);

  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::pair<std::string, Tensor>> tensors_;  // data order
  std::map<std::string, size_t> index_;                  // name -> position in tensors_
};

// Reads and validates the whole file: the header length fits the file, the header is a JSON
// object, every entry has a supported dtype, a shape of at most kMaxRank non-negative extents
// whose byte size equals its data_offsets span, and the spans tile the data section exactly (in
// order, no overlap, no gap, nothing past the end of the file or left over). Errors are
// InvalidArgument naming the file, the tensor and the problem; NotFound when there is no file.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
// The same, of a file the caller opened (`fd`, left open; `path` names it in errors).
absl::StatusOr<SafetensorsFile> ReadSafetensors(int fd, const std::string& path);

// Reads exactly `bytes` of `fd` at `offset`: IoError naming `path`, DataLoss when the file ends
// first (it shrank underneath the reader).
absl::Status ReadFileAt(int fd, const std::string& path, void* data, size_t bytes, uint64_t offset);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_SAFETENSORS_H_
