// Issue 31, item 3: deleting a job used to free its submission id, so a submit retried after the
// delete (its first answer lost) made a second job. The id now stays taken, as a tombstone, for
// kDeletedSubmissionRetention; a store of the previous schema gains the tombstones' table.
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/server/core/store_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

// A job made with `submission_id`, driven to CANCELLED and deleted.
std::string DeletedJob(Store& store, const std::string& submission_id) {
  NewJob job;
  job.name = "deleted";
  job.submission_id = submission_id;
  job.spec = "spec";
  auto created = store.CreateJob(job);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return "";
  EXPECT_TRUE(store.TransitionJob(created->id, S::kPending, S::kCancelled, "done").ok());
  EXPECT_TRUE(store.DeleteJob(created->id).ok());
  return created->id;
}

TEST_F(StoreTest, ADeletedJobsSubmissionIdStaysTakenForTheRetention) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string deleted = DeletedJob(*store, "sub-retried");
  ASSERT_FALSE(deleted.empty());

  // The same submit again (same spec, same priority), as a client retrying it would send.
  auto retried = store->CreateJob(Job("deleted", "sub-retried", "spec"));
  EXPECT_EQ(retried.status().code(), absl::StatusCode::kAlreadyExists) << retried.status();
  EXPECT_THAT(retried.status().message(), HasSubstr(deleted));
  EXPECT_THAT(retried.status().message(), HasSubstr("another id"));
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 0u) << "nothing was created";
  auto known = store->HasSubmission("sub-retried");
  ASSERT_OK(known.status());
  EXPECT_TRUE(*known);
  // Other ids are not affected.
  ASSERT_OK(store->CreateJob(Job("other", "sub-other")).status());

  // Past the retention the id is free again, and its tombstone is gone.
  env_.SetStep(kDeletedSubmissionRetention + absl::Seconds(1));
  EXPECT_FALSE(*store->HasSubmission("sub-retried"));
  auto fresh = store->CreateJob(Job("deleted", "sub-retried", "spec"));
  ASSERT_OK(fresh.status());
  EXPECT_NE(fresh->id, deleted);
  EXPECT_EQ(RawQuery(path_, "SELECT count(*) FROM deleted_submissions"), "0");
}

TEST_F(StoreTest, TheTombstoneSurvivesAReopen) {
  std::string deleted;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    deleted = DeletedJob(*store, "sub-durable");
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto retried = store->CreateJob(Job("deleted", "sub-durable", "spec"));
  EXPECT_EQ(retried.status().code(), absl::StatusCode::kAlreadyExists) << retried.status();
  EXPECT_THAT(retried.status().message(), HasSubstr(deleted));
}

TEST_F(StoreTest, StoreOfThePreviousSchemaGainsTheTombstones) {
  std::string kept;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    kept = store->CreateJob(Job("kept", "sub-kept"))->id;
  }
  // As schema 3 left it.
  RawExec(path_, "DROP TABLE deleted_submissions; UPDATE schema_version SET version = 3");
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RawQuery(path_, "SELECT version FROM schema_version"),
            absl::StrCat(Store::kSchemaVersion));
  EXPECT_EQ(store->CreateJob(Job("kept", "sub-kept"))->id, kept);
  const std::string deleted = DeletedJob(*store, "sub-migrated");
  auto retried = store->CreateJob(Job("deleted", "sub-migrated", "spec"));
  EXPECT_EQ(retried.status().code(), absl::StatusCode::kAlreadyExists) << retried.status();
}

}  // namespace
}  // namespace moetrain::server
