// What tests across the tree share: assertions on absl::Status and absl::StatusOr that print the
// status when they fail, a scratch directory that removes itself, `promtool check metrics`, and
// what the death tests of crash fixes need (deeply nested JSON, a child's exit by its status).
// Every test executable links it (tests/CMakeLists.txt, target moetrain_testing).
#ifndef MOETRAIN_TESTS_TESTING_TESTING_H_
#define MOETRAIN_TESTS_TESTING_TESTING_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace moetrain::testutil {

// The status of a Status or a StatusOr, for the macros below.
inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// A fresh directory under gtest's temporary directory (TEST_TMPDIR, else /tmp), named
// `<prefix>.XXXXXX`; removed with everything in it when destroyed. When it cannot be created the
// test binary aborts, saying why: nothing a test does without its directory would mean anything.
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "moetrain_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// What `promtool check metrics` says of `exposition` (a Prometheus text exposition, given on its
// stdin): its exit code (0 = valid, lint warnings included in `output`) and everything it printed
// on stdout and stderr. NotFound when /usr/bin/promtool is not installed (Debian's prometheus
// package has it); Internal when it cannot be run.
struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};
absl::StatusOr<PromtoolResult> PromtoolCheckMetrics(std::string_view exposition);

// The value of `result`, for calls used inline that the test expects to succeed; when it holds an
// error, a failure naming it is recorded and T{} (a null pointer, say) comes back.
template <typename T>
T Must(absl::StatusOr<T> result) {
  if (!result.ok()) {
    ADD_FAILURE() << result.status();
    return T{};
  }
  return *std::move(result);
}

// JSON text of `depth` arrays, one inside the other, around a 0: "[[[0]]]" for 3. 10^6 of them
// (2 MB) overflowed the stack of any reader that copied, compared or printed the parsed value.
std::string NestedJsonArrays(int64_t depth);

// The end of a death test's child for a crash fix: prints `status` to stderr and exits, 0 when it
// is an error (the clean refusal the test wants), 1 when it is OK. Before the fix the child dies of
// the signal instead, and the test fails saying which:
//   EXPECT_EXIT(testutil::ExitWithError(ReadSafetensors(path)), ::testing::ExitedWithCode(0),
//               "deeper than 64 levels");
[[noreturn]] void ExitWithError(const absl::Status& status);
template <typename T>
[[noreturn]] void ExitWithError(const absl::StatusOr<T>& status_or) {
  ExitWithError(status_or.status());
}

}  // namespace moetrain::testutil

// ASSERT_TRUE(expr.ok()) / EXPECT_TRUE(expr.ok()) for an absl::Status or absl::StatusOr, printing
// the status when it is not OK.
#define ASSERT_OK(expr)                                                               \
  do {                                                                                \
    const auto& moetrain_testing_status_ = (expr);                                    \
    ASSERT_TRUE(moetrain_testing_status_.ok())                                        \
        << #expr << ": " << ::moetrain::testutil::StatusOf(moetrain_testing_status_); \
  } while (0)
#define EXPECT_OK(expr)                                                               \
  do {                                                                                \
    const auto& moetrain_testing_status_ = (expr);                                    \
    EXPECT_TRUE(moetrain_testing_status_.ok())                                        \
        << #expr << ": " << ::moetrain::testutil::StatusOf(moetrain_testing_status_); \
  } while (0)

// ASSERT_OK_AND_ASSIGN(lhs, expr): evaluates the absl::StatusOr `expr`, asserts it is OK
// (printing its status otherwise) and moves its value into `lhs`, which may declare a variable:
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<Store> store, Store::Open(path));
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                                         \
  MOETRAIN_TESTING_ASSIGN_(MOETRAIN_TESTING_CONCAT_(moetrain_testing_statusor_, __LINE__), lhs, \
                           expr)
#define MOETRAIN_TESTING_ASSIGN_(statusor, lhs, expr)               \
  auto statusor = (expr);                                           \
  ASSERT_TRUE(statusor.ok()) << #expr << ": " << statusor.status(); \
  lhs = std::move(*statusor)
#define MOETRAIN_TESTING_CONCAT_(a, b) MOETRAIN_TESTING_CONCAT_INNER_(a, b)
#define MOETRAIN_TESTING_CONCAT_INNER_(a, b) a##b

#endif  // MOETRAIN_TESTS_TESTING_TESTING_H_
