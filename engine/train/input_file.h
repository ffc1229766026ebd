// Files that input names, such as the files of a Hugging Face directory that `moetrain import`
// reads: opened only when the name is a regular file of its directory itself, so that a hostile
// or broken directory can neither lead the reader elsewhere (a symbolic link to another job's
// checkpoint) nor block it (a FIFO without a writer blocks an open for reading forever), and
// refused by its size before a byte is read.
#ifndef MOETRAIN_ENGINE_TRAIN_INPUT_FILE_H_
#define MOETRAIN_ENGINE_TRAIN_INPUT_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace moetrain {

// An open file (closed with the object), its path and its size when it was opened.
class InputFile {
 public:
  InputFile(std::string path, int fd, int64_t bytes);
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&&) = delete;
  ~InputFile();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  int64_t bytes() const { return bytes_; }

  // The whole file (bytes() of it); DataLoss when it shrank meanwhile.
  absl::StatusOr<std::string> ReadAll() const;

 private:
  friend absl::StatusOr<InputFile> OpenInputFile(const std::string& dir, const std::string& name,
                                                 int64_t max_bytes);

  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
};

// Opens `name`, a plain file name, in `dir` for reading. InvalidArgument naming the path when it
// is a symbolic link (and where it leads; opened with O_NOFOLLOW), a FIFO (opened without
// blocking, then refused), a device, a directory or a socket, or larger than `max_bytes` (when
// positive); the errno's status otherwise (NotFound when there is no such file).
absl::StatusOr<InputFile> OpenInputFile(const std::string& dir, const std::string& name,
                                        int64_t max_bytes);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_INPUT_FILE_H_
