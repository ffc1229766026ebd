#include "tests/testing/testing.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace moetrain::testutil {

namespace fs = std::filesystem;

TempDir::TempDir(std::string_view prefix) {
  std::string pattern =
      (fs::path(::testing::TempDir()) / (std::string(prefix) + ".XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp %s: %s\n", pattern.c_str(), std::strerror(errno));
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;  // a test that removed it already, or a read-only tree, fails nothing
  fs::remove_all(path_, ignored);
}

absl::StatusOr<PromtoolResult> PromtoolCheckMetrics(std::string_view exposition) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  if (access(kPromtool, X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(kPromtool,
                                            " is not installed (Debian's prometheus "
                                            "package has it; scripts/setup.sh installs it)"));
  }
  TempDir dir("promtool");
  const fs::path printed = dir.path() / "output.txt";
  const std::string command =
      absl::StrCat(kPromtool, " check metrics >'", printed.string(), "' 2>&1");
  FILE* pipe = popen(command.c_str(), "w");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("popen '", command, "': ", std::strerror(errno)));
  }
  std::fwrite(exposition.data(), 1, exposition.size(), pipe);
  const int status = pclose(pipe);
  if (status == -1 || !WIFEXITED(status)) {
    return absl::InternalError(
        absl::StrCat("'", command, "' did not exit normally (wait status ", status, ")"));
  }
  PromtoolResult result;
  result.exit_code = WEXITSTATUS(status);
  std::ifstream in(printed, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  result.output = contents.str();
  return result;
}

std::string NestedJsonArrays(int64_t depth) {
  std::string text(static_cast<size_t>(depth), '[');
  text += '0';
  text.append(static_cast<size_t>(depth), ']');
  return text;
}

void ExitWithError(const absl::Status& status) {
  const std::string text = status.ToString();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
  _exit(status.ok() ? 1 : 0);
}

}  // namespace moetrain::testutil
