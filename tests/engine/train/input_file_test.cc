// OpenInputFile: a regular file of the directory is read whole; a symbolic link (named with where
// it leads), a FIFO (without waiting for a writer), a directory and a file over the cap are
// refused naming the path; a missing file is NotFound.
#include "engine/train/input_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class InputFileTest : public ::testing::Test {
 protected:
  InputFileTest() { std::ofstream(dir_ / "file") << "twelve bytes"; }

  absl::Status Refusal(const std::string& name, int64_t max_bytes = 0) {
    return OpenInputFile(dir_.string(), name, max_bytes).status();
  }

  const testutil::TempDir temp_dir_{"input_file_test"};
  const fs::path dir_ = temp_dir_.path();
};

TEST_F(InputFileTest, ReadsARegularFileWhole) {
  ASSERT_OK_AND_ASSIGN(const InputFile file, OpenInputFile(dir_.string(), "file", 12));
  EXPECT_EQ(file.path(), (dir_ / "file").string());
  EXPECT_EQ(file.bytes(), 12);
  ASSERT_OK_AND_ASSIGN(const std::string text, file.ReadAll());
  EXPECT_EQ(text, "twelve bytes");
}

TEST_F(InputFileTest, RefusesWhatIsNotARegularFileOfTheDirectory) {
  fs::create_symlink(dir_ / "file", dir_ / "link");
  ASSERT_EQ(mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  fs::create_directory(dir_ / "dir");
  const std::pair<const char*, std::string> cases[] = {
      {"link", absl::StrCat(" is a symbolic link to ", (dir_ / "file").string())},
      {"fifo", " is a FIFO, not a regular file"},
      {"dir", " is a directory, not a regular file"},
  };
  for (const auto& [name, why] : cases) {
    const absl::Status status = Refusal(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr((dir_ / name).string() + why));
  }
  const absl::Status too_big = Refusal("file", 11);
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument) << too_big;
  EXPECT_THAT(too_big.message(), HasSubstr("file is 12 bytes, more than the 11"));
  EXPECT_EQ(Refusal("missing").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moetrain
