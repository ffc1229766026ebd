#include "engine/train/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/train/safetensors.h"

namespace moetrain {

InputFile::InputFile(std::string path, int fd, int64_t bytes)
    : path_(std::move(path)), fd_(fd), bytes_(bytes) {}

InputFile::InputFile(InputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), bytes_(other.bytes_) {}

InputFile::~InputFile() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::string> InputFile::ReadAll() const {
  std::string text(static_cast<size_t>(bytes_), '\0');
  MOETRAIN_RETURN_IF_ERROR(ReadFileAt(fd_, path_, text.data(), text.size(), 0));
  return text;
}

absl::StatusOr<InputFile> OpenInputFile(const std::string& dir, const std::string& name,
                                        int64_t max_bytes) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ELOOP) {
    std::error_code ec;
    const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a symbolic link", ec ? "" : absl::StrCat(" to ", target.string()),
                     ": only the directory's own regular files are read (copy the files in, "
                     "e.g. with cp -L)"));
  }
  if (fd < 0) return IoError(errno, absl::StrCat("open ", path));
  InputFile file(path, fd, 0);
  struct stat st;
  if (fstat(fd, &st) != 0) return IoError(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO"
                       : S_ISDIR(st.st_mode)                        ? "a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                    : "a socket";
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", kind, ", not a regular file: only regular files are read"));
  }
  if (max_bytes > 0 && st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is ", st.st_size, " bytes, more than the ", max_bytes, " read of such a file"));
  }
  // Reads of a regular file never block; cleared for the reader's sake all the same.
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    return IoError(errno, absl::StrCat("fcntl ", path));
  }
  file.bytes_ = st.st_size;
  return file;
}

}  // namespace moetrain
