// The shared test helpers: TempDir makes a fresh directory and removes its whole tree, the status
// macros pass OK values through and fail with the status in the message, and PromtoolCheckMetrics
// reports what promtool says of a valid and of a malformed exposition.
#include "tests/testing/testing.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace moetrain::testutil {
namespace {

namespace fs = std::filesystem;

TEST(TempDirTest, IsFreshAndRemovesItsWholeTree) {
  fs::path kept;
  {
    const TempDir dir("testing_test");
    const TempDir other("testing_test");
    kept = dir.path();
    EXPECT_NE(dir.path(), other.path());
    EXPECT_TRUE(fs::is_directory(dir.path()));
    EXPECT_TRUE(fs::is_empty(dir.path()));
    EXPECT_TRUE(fs::equivalent(dir.path().parent_path(), ::testing::TempDir())) << dir.path();
    EXPECT_EQ(dir.path().filename().string().rfind("testing_test.", 0), 0u) << dir.path();
    fs::create_directories(dir.path() / "a" / "b");
    std::ofstream(dir.path() / "a" / "b" / "file") << "bytes";
  }
  EXPECT_FALSE(fs::exists(kept));
}

absl::StatusOr<std::unique_ptr<int>> Boxed(int value) {
  if (value < 0) return absl::InvalidArgumentError("value = -1 is negative");
  return std::make_unique<int>(value);
}

TEST(StatusMacrosTest, PassOkValuesThrough) {
  ASSERT_OK(absl::OkStatus());
  EXPECT_OK(Boxed(1));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<int> boxed, Boxed(7));  // a move-only value
  EXPECT_EQ(*boxed, 7);
  ASSERT_OK_AND_ASSIGN(boxed, Boxed(8));
  EXPECT_EQ(*boxed, 8);
}

TEST(StatusMacrosTest, FailuresPrintTheStatus) {
  EXPECT_FATAL_FAILURE(ASSERT_OK(absl::NotFoundError("job j-1 not found")), "job j-1 not found");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(Boxed(-1)), "value = -1 is negative");
  EXPECT_FATAL_FAILURE(
      {
        ASSERT_OK_AND_ASSIGN(std::unique_ptr<int> boxed, Boxed(-1));
        (void)boxed;
      },
      "value = -1 is negative");
}

TEST(PromtoolCheckMetricsTest, AcceptsAValidExpositionAndRefusesAMalformedOne) {
  // promtool is a dependency (scripts/setup.sh installs Debian's prometheus package): without it
  // the metrics tests fail, naming it, rather than pass having checked less.
  ASSERT_EQ(access("/usr/bin/promtool", X_OK), 0) << "/usr/bin/promtool not found";
  absl::StatusOr<PromtoolResult> valid = PromtoolCheckMetrics(
      "# HELP moetrain_test_events_total Events seen by the test.\n"
      "# TYPE moetrain_test_events_total counter\n"
      "moetrain_test_events_total 3\n");
  ASSERT_OK(valid);
  EXPECT_EQ(valid->exit_code, 0) << valid->output;
  EXPECT_EQ(valid->output, "");

  absl::StatusOr<PromtoolResult> malformed = PromtoolCheckMetrics(
      "# TYPE moetrain_test_events_total counter\nmoetrain_test_events_total three\n");
  ASSERT_OK(malformed);
  EXPECT_NE(malformed->exit_code, 0);
  EXPECT_FALSE(malformed->output.empty());
}

}  // namespace
}  // namespace moetrain::testutil
