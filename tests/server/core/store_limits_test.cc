// Issue 13, item 13, in the store: listings page by bytes as well as by count, oversized strings
// of old rows are cut in listings, failure reasons and checkpoint paths are bounded, a replayed
// submission id with another priority is refused, and final jobs can be deleted.
#include <string>
#include <vector>

#include "server/core/limits.h"
#include "tests/server/core/store_test_util.h"

namespace moetrain::server {
namespace {

using StoreLimitsTest = StoreTest;

TEST_F(StoreLimitsTest, ListJobsPagesByBytesAndAlwaysHoldsOneJob) {
  auto store = OpenStore();
  std::vector<std::string> ids;
  // Each job's row is a bit over 10 KiB: a 4 KiB page budget still lists them one by one.
  for (int i = 0; i < 5; ++i) {
    auto job = store->CreateJob(Job(absl::StrCat("big-", i), "", std::string(10 << 10, 's')));
    ASSERT_OK(job.status());
    ids.push_back(job->id);
  }
  ListJobsOptions options;
  options.max_bytes = 4 << 10;
  std::vector<std::string> listed;
  int pages = 0;
  do {
    auto page = store->ListJobs(options);
    ASSERT_OK(page.status());
    ASSERT_EQ(page->jobs.size(), 1u);
    for (const JobRecord& job : page->jobs) listed.push_back(job.id);
    options.page_token = page->next_page_token;
    ++pages;
  } while (!options.page_token.empty());
  EXPECT_EQ(listed, ids);
  EXPECT_EQ(pages, 5);

  // Three jobs fit in 32 KiB; the count limit still applies beside the bytes.
  options = {};
  options.max_bytes = 32 << 10;
  auto page = store->ListJobs(options);
  ASSERT_OK(page.status());
  EXPECT_EQ(page->jobs.size(), 3u);
  EXPECT_FALSE(page->next_page_token.empty());
  options.page_size = 2;
  page = store->ListJobs(options);
  ASSERT_OK(page.status());
  EXPECT_EQ(page->jobs.size(), 2u);
}

TEST_F(StoreLimitsTest, OldOversizedStringsAreCutInListingsOnly) {
  auto store = OpenStore();
  auto job = store->CreateJob(Job("old"));
  ASSERT_OK(job.status());
  // As a build before the limits could have written them.
  RawExec(path_, absl::StrCat("UPDATE jobs SET state_reason = printf('%.*c', 100000, 'r'), "
                              "name = printf('%.*c', 5000, 'n')"));
  auto page = store->ListJobs({});
  ASSERT_OK(page.status());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].state_reason.size(), kMaxReasonBytes);
  EXPECT_NE(page->jobs[0].state_reason.find("[truncated at 4096 bytes]"), std::string::npos);
  EXPECT_LE(page->jobs[0].name.size(), 256u);
  auto whole = store->GetJob(job->id);
  ASSERT_OK(whole.status());
  EXPECT_EQ(whole->state_reason.size(), 100000u);
}

TEST_F(StoreLimitsTest, LongFailureReasonsAreCutAndMarked) {
  auto store = OpenStore();
  const std::string id = JobIn(*store, S::kRunning);
  // A multi-byte character straddles the cut: it is dropped whole.
  std::string reason = std::string(kMaxReasonBytes - 30, 'f') + std::string(200, '\xce');
  for (size_t i = kMaxReasonBytes - 30; i + 1 < reason.size(); i += 2) reason[i + 1] = '\xbb';
  auto failed = store->TransitionJob(id, S::kRunning, S::kFailed, reason);
  ASSERT_OK(failed.status());
  EXPECT_LE(failed->state_reason.size(), kMaxReasonBytes);
  EXPECT_EQ(failed->state_reason.substr(0, 100), reason.substr(0, 100));
  const size_t marker = failed->state_reason.find(" [truncated at 4096 bytes]");
  ASSERT_NE(marker, std::string::npos);
  EXPECT_EQ((marker - (kMaxReasonBytes - 30)) % 2, 0u) << "a character was split";
  auto last = store->LastEvent(id);
  ASSERT_OK(last.status());
  ASSERT_TRUE(last->has_value());
  EXPECT_LE((*last)->payload.size(), kMaxReasonBytes + 64);
}

TEST_F(StoreLimitsTest, CheckpointPathsAreBounded) {
  auto store = OpenStore();
  const std::string id = JobIn(*store, S::kRunning);
  CheckpointRecord checkpoint;
  checkpoint.step = 5;
  checkpoint.path = "/" + std::string(kMaxPathBytes, 'p');
  absl::Status status = store->RecordCheckpoint(id, checkpoint);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("4097"), absl::string_view::npos) << status;
  EXPECT_LT(status.message().size(), 200u) << "the path is not echoed";
}

TEST_F(StoreLimitsTest, ReplayedSubmissionWithAnotherPriorityIsAlreadyExists) {
  auto store = OpenStore();
  NewJob job = Job("prio", "sub-1");
  job.priority = 2;
  auto first = store->CreateJob(job);
  ASSERT_OK(first.status());
  auto again = store->CreateJob(job);
  ASSERT_OK(again.status());
  EXPECT_EQ(again->id, first->id);
  job.priority = 5;
  auto other = store->CreateJob(job);
  EXPECT_TRUE(absl::IsAlreadyExists(other.status())) << other.status();
}

TEST_F(StoreLimitsTest, DeleteJobRemovesAFinalJobAndEverythingAboutIt) {
  auto store = OpenStore();
  const std::string running = JobIn(*store, S::kRunning);
  const std::string done = JobIn(*store, S::kSucceeded);
  ASSERT_OK(store->StartAttempt(done, {"worker-a"}).status());
  ASSERT_OK(store->EndAttempt(done, 1, "succeeded"));
  CheckpointRecord checkpoint;
  checkpoint.step = 5;
  checkpoint.path = "/ckpt/" + done + "/step-00000005";
  checkpoint.attempt = 1;
  ASSERT_OK(store->RecordCheckpoint(done, checkpoint));

  absl::Status status = store->DeleteJob(running);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("RUNNING"), absl::string_view::npos) << status;
  EXPECT_TRUE(absl::IsNotFound(store->DeleteJob("job-unknown")));

  ASSERT_OK(store->DeleteJob(done));
  EXPECT_TRUE(absl::IsNotFound(store->GetJob(done).status()));
  EXPECT_TRUE(absl::IsNotFound(store->DeleteJob(done)));
  for (const char* table : {"events", "checkpoints", "attempts", "jobs"}) {
    const std::string column = std::string(table) == "jobs" ? "id" : "job_id";
    EXPECT_EQ(RawQuery(path_, absl::StrCat("SELECT count(*) FROM ", table, " WHERE ", column,
                                           " = '", done, "'")),
              "0")
        << table;
  }
  auto page = store->ListJobs({});
  ASSERT_OK(page.status());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].id, running);
}

}  // namespace
}  // namespace moetrain::server
