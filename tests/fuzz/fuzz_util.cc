#include "tests/fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace moetrain::fuzz {
namespace {

namespace fs = std::filesystem;

std::string MakeScratchDir() {
  std::string parent = "/dev/shm";
  if (access(parent.c_str(), W_OK) != 0) {
    const char* tmpdir = std::getenv("TMPDIR");
    parent = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
  }
  std::string templ = parent + "/moetrain-fuzz-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    std::perror(templ.c_str());
    std::abort();
  }
  return templ;
}

void RemoveScratchDir() {
  std::error_code ignored;
  fs::remove_all(ScratchDir(), ignored);
}

}  // namespace

const std::string& ScratchDir() {
  static const std::string* const dir = [] {
    auto* made = new std::string(MakeScratchDir());
    std::atexit(RemoveScratchDir);
    return made;
  }();
  return *dir;
}

std::string WriteScratchFile(absl::string_view name, const uint8_t* data, size_t size) {
  const fs::path path = fs::path(ScratchDir()) / std::string(name);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      std::perror(path.c_str());
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return path.string();
}

void Fail(absl::string_view what, const absl::Status& status) {
  std::fprintf(stderr, "fuzz check failed: %.*s%s%s\n", static_cast<int>(what.size()), what.data(),
               status.ok() ? "" : ": ", status.ok() ? "" : status.ToString().c_str());
  std::abort();
}

void ExpectCode(const absl::Status& status, std::initializer_list<absl::StatusCode> allowed,
                absl::string_view reader) {
  for (absl::StatusCode code : allowed) {
    if (status.code() == code) return;
  }
  Fail(absl::StrCat(reader, " returned an undocumented error code"), status);
}

}  // namespace moetrain::fuzz
