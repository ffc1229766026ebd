// A KeyValueStore in a directory, for tests and for ranks on one host: one file per key. Set
// writes a temporary file and renames it into place, so a reader sees the whole value or
// nothing; Get polls until the file appears.
#ifndef MOETRAIN_ENGINE_COMM_FILE_KV_STORE_H_
#define MOETRAIN_ENGINE_COMM_FILE_KV_STORE_H_

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"

namespace moetrain {

class FileKeyValueStore final : public KeyValueStore {
 public:
  // Creates `dir` (and its parents) when missing; Unavailable naming it when that fails.
  static absl::StatusOr<std::shared_ptr<FileKeyValueStore>> Open(const std::filesystem::path& dir);

  // Overwrites an existing value. Any key works: '/' and other bytes are escaped in file names.
  absl::Status Set(const std::string& key, const std::string& value) override;
  // DeadlineExceeded naming the key and the directory when no value appears within `timeout`.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  explicit FileKeyValueStore(std::filesystem::path dir) : dir_(std::move(dir)) {}

  const std::filesystem::path dir_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_FILE_KV_STORE_H_
