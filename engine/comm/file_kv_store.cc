#include "engine/comm/file_kv_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace moetrain {
namespace {

// Longest file name Linux file systems take.
constexpr size_t kMaxFileName = 255;

// Letters, digits, '-' and '_' stay; every other byte becomes %XX, so that '/', "." and ".."
// cannot escape the directory and two keys never share a file.
std::string FileNameOf(const std::string& key) {
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      name.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&name, "%%%02X", c);
    }
  }
  return name.empty() ? "%" : name;  // the empty key has a name too
}

std::string ErrnoText() { return std::strerror(errno); }

// Writes all of `data` to `fd`.
bool WriteAll(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<size_t>(n);
  }
  return true;
}

// The whole file at `path`; NotFound when it does not exist.
absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path.string());
    return absl::UnavailableError(absl::StrCat("cannot open ", path.string(), ": ", ErrnoText()));
  }
  std::string data;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = ErrnoText();
      close(fd);
      return absl::UnavailableError(absl::StrCat("cannot read ", path.string(), ": ", error));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

}  // namespace

absl::StatusOr<std::shared_ptr<FileKeyValueStore>> FileKeyValueStore::Open(
    const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    return absl::UnavailableError(absl::StrCat("key-value store directory ", dir.string(),
                                               " cannot be created: ", error.message()));
  }
  return std::shared_ptr<FileKeyValueStore>(new FileKeyValueStore(dir));
}

absl::Status FileKeyValueStore::Set(const std::string& key, const std::string& value) {
  const std::string name = FileNameOf(key);
  if (name.size() > kMaxFileName - 16) {  // room for the temporary name's suffix
    return absl::InvalidArgumentError(
        absl::StrCat("key-value store key '", key, "' is too long (", key.size(), " bytes)"));
  }
  // Unique among processes (pid) and among the threads of one (counter).
  static std::atomic<uint64_t> counter{0};
  const std::filesystem::path temp =
      dir_ / absl::StrCat(".tmp.", getpid(), ".", counter.fetch_add(1), ".", name.substr(0, 200));
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("key-value store: cannot create ", temp.string(), ": ", ErrnoText()));
  }
  const bool written = WriteAll(fd, value);
  const std::string write_error = written ? "" : ErrnoText();
  close(fd);
  if (!written || rename(temp.c_str(), (dir_ / name).c_str()) != 0) {
    const std::string error = written ? ErrnoText() : write_error;
    unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat("key-value store: cannot set key '", key, "' in ",
                                               dir_.string(), ": ", error));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  const std::filesystem::path path = dir_ / FileNameOf(key);
  const absl::Time deadline = absl::Now() + timeout;
  // Poll fast at first (peers usually arrive together), then back off to spare the CPU.
  absl::Duration pause = absl::Milliseconds(1);
  for (;;) {
    absl::StatusOr<std::string> value = ReadFile(path);
    if (!absl::IsNotFound(value.status())) return value;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("key-value store: key '", key,
                                                      "' was not set in ", dir_.string(),
                                                      " within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(pause, left));
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
}

}  // namespace moetrain
