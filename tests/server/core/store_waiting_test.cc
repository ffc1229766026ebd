// The job row's waiting_reason and next_attempt_at: written by SetWaitingReasons and by the
// transition into RESTARTING, cleared by every transition, kept across a reopen, and added to a
// store written by the previous schema.
#include <string>

#include "tests/server/core/store_test_util.h"

namespace moetrain::server {
namespace {

TEST_F(StoreTest, WaitingReasonIsKeptUntilTheJobMovesOn) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string pending = JobIn(*store, S::kPending);
  const std::string running = JobIn(*store, S::kRunning);
  EXPECT_EQ(store->GetJob(pending)->waiting_reason, "");
  ASSERT_OK(store->SetWaitingReasons({{pending, "needs 4 CPU workers, 1 registered"},
                                      {running, "not a waiting job"},
                                      {"job-unknown", "skipped"}}));
  EXPECT_EQ(store->GetJob(pending)->waiting_reason, "needs 4 CPU workers, 1 registered");
  EXPECT_EQ(store->GetJob(running)->waiting_reason, "") << "only waiting jobs take a reason";

  // Kept across a reopen, cleared by the next transition.
  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->GetJob(pending)->waiting_reason, "needs 4 CPU workers, 1 registered");
  ASSERT_OK(store->TransitionJob(pending, S::kPending, S::kScheduled, "attempt 1").status());
  EXPECT_EQ(store->GetJob(pending)->waiting_reason, "");
}

TEST_F(StoreTest, NextAttemptTimeIsSetByTheTransitionIntoRestartingOnly) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string id = JobIn(*store, S::kRunning);
  EXPECT_FALSE(store->GetJob(id)->next_attempt_at.has_value());
  TransitionOptions backoff;
  backoff.next_attempt_at = absl::FromUnixSeconds(1'800'000'000);
  auto restarting = store->TransitionJob(id, S::kRunning, S::kRestarting, "failed", backoff);
  ASSERT_OK(restarting.status());
  EXPECT_EQ(restarting->next_attempt_at, absl::FromUnixSeconds(1'800'000'000));
  EXPECT_EQ(restarting->restarts, 1);

  store.reset();
  store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->GetJob(id)->next_attempt_at, absl::FromUnixSeconds(1'800'000'000));
  ASSERT_OK(store->TransitionJob(id, S::kRestarting, S::kScheduled, "attempt 2").status());
  EXPECT_FALSE(store->GetJob(id)->next_attempt_at.has_value());
}

TEST_F(StoreTest, StoreOfThePreviousSchemaGainsTheWaitingColumns) {
  std::string id;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    id = JobIn(*store, S::kPending);
  }
  // As schema 2 left it: without schema 3's columns, nor schema 4's table of deleted submissions.
  RawExec(path_,
          "ALTER TABLE jobs DROP COLUMN waiting_reason; ALTER TABLE jobs DROP COLUMN "
          "next_attempt_us; DROP TABLE deleted_submissions; UPDATE schema_version SET version = 2");
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RawQuery(path_, "SELECT version FROM schema_version"),
            absl::StrCat(Store::kSchemaVersion));
  auto job = store->GetJob(id);
  ASSERT_OK(job.status());
  EXPECT_EQ(job->waiting_reason, "");
  EXPECT_FALSE(job->next_attempt_at.has_value());
}

}  // namespace
}  // namespace moetrain::server
