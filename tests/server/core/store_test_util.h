// The store tests' fixture: a fresh directory per test, a fake clock and id source, and helpers
// to create jobs and read the file through a plain sqlite3 connection.
#ifndef MOETRAIN_TESTS_SERVER_CORE_STORE_TEST_UTIL_H_
#define MOETRAIN_TESTS_SERVER_CORE_STORE_TEST_UTIL_H_

#include <sqlite3.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/core/store.h"
#include "tests/testing/testing.h"

namespace moetrain::server {

namespace fs = std::filesystem;
using S = JobState;

// A clock that ticks one second per call (or as told), and ids from a queue when one is given.
class FakeEnv : public StoreEnv {
 public:
  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    now_ += step_;
    return now_;
  }
  std::string NewJobId() override {
    absl::MutexLock lock(&mu_);
    if (ids_.empty()) return DefaultStoreEnv()->NewJobId();
    std::string id = ids_.front();
    if (ids_.size() > 1 || !repeat_last_) ids_.pop_front();
    return id;
  }
  void QueueIds(std::vector<std::string> ids, bool repeat_last = false) {
    absl::MutexLock lock(&mu_);
    ids_.assign(ids.begin(), ids.end());
    repeat_last_ = repeat_last;
  }
  void SetStep(absl::Duration step) {
    absl::MutexLock lock(&mu_);
    step_ = step;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  absl::Duration step_ = absl::Seconds(1);
  std::deque<std::string> ids_;
  bool repeat_last_ = false;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// One query's first column of the first row, through a plain sqlite3 connection.
inline std::string RawQuery(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  std::string value;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
  if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

inline void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = (fs::path(dir_) / "coordinator.db").string(); }

  std::unique_ptr<Store> OpenStore(StoreOptions options = {}) {
    if (options.env == nullptr) options.env = &env_;
    auto store = Store::Open(path_, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  static NewJob Job(std::string name, std::string submission_id = "", std::string spec = "spec") {
    NewJob job;
    job.name = std::move(name);
    job.submission_id = std::move(submission_id);
    job.spec = std::move(spec);
    return job;
  }

  // Drives a fresh job along legal transitions into `state`.
  std::string JobIn(Store& store, S state) {
    auto job = store.CreateJob(Job("walk"));
    EXPECT_TRUE(job.ok()) << job.status();
    const std::map<S, std::vector<S>> paths = {
        {S::kPending, {}},
        {S::kScheduled, {S::kScheduled}},
        {S::kRunning, {S::kScheduled, S::kRunning}},
        {S::kRestarting, {S::kScheduled, S::kRunning, S::kRestarting}},
        {S::kSucceeded, {S::kScheduled, S::kRunning, S::kSucceeded}},
        {S::kFailed, {S::kScheduled, S::kRunning, S::kFailed}},
        {S::kCancelled, {S::kCancelled}},
    };
    S at = S::kPending;
    for (S next : paths.at(state)) {
      auto moved = store.TransitionJob(job->id, at, next, "walk");
      EXPECT_TRUE(moved.ok()) << moved.status();
      at = next;
    }
    return job->id;
  }

  FakeEnv env_;
  const testutil::TempDir temp_dir_{"store_test"};
  const std::string dir_ = temp_dir_.path().string();
  std::string path_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_TESTS_SERVER_CORE_STORE_TEST_UTIL_H_
