// The coordinator core on a real SQLite file in a fresh temporary directory.

#include "server/core/coordinator.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job.pb.h"
#include "server/core/limits.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

v1::JobSpec TinySpec(const std::string& name = "tiny") {
  v1::JobSpec spec;
  spec.set_name(name);
  return spec;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Store>> store =
        Store::Open((fs::path(dir_) / "coordinator.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    coordinator_ = std::make_unique<Coordinator>(store_.get());
  }
  void TearDown() override {
    coordinator_.reset();
    store_.reset();
  }

  JobRecord MustSubmit(const std::string& submission_id, const std::string& name = "tiny") {
    absl::StatusOr<JobRecord> job = coordinator_->Submit(submission_id, TinySpec(name), 0);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : JobRecord{};
  }

  std::vector<EventRecord> Events(const std::string& job_id) {
    absl::StatusOr<std::vector<EventRecord>> events = store_->ReadEvents(job_id, 1, 10000);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<EventRecord>{};
  }

  int64_t JobCount() {
    absl::StatusOr<JobPage> page = store_->ListJobs({});
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? static_cast<int64_t>(page->jobs.size()) : -1;
  }

  const testutil::TempDir temp_dir_{"coordinator_test"};
  const std::string dir_ = temp_dir_.path().string();
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, SubmitStoresResolvedPendingJobWithSubmittedEvent) {
  absl::StatusOr<JobRecord> job = coordinator_->Submit("sub-1", TinySpec(), 7);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_EQ(job->submission_id, "sub-1");
  EXPECT_EQ(job->name, "tiny");
  EXPECT_EQ(job->priority, 7);

  v1::JobSpec stored;
  ASSERT_TRUE(stored.ParseFromString(job->spec));
  // Defaults were applied before storing.
  EXPECT_TRUE(stored.model().has_hidden_size());

  std::vector<EventRecord> events = Events(job->id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].sequence, 1);
  EXPECT_EQ(events[0].kind, kSubmittedEventKind);

  absl::StatusOr<JobRecord> got = coordinator_->Get(job->id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->id, job->id);
}

TEST_F(CoordinatorTest, SameSubmissionIdAndSpecReturnsTheSameJob) {
  JobRecord first = MustSubmit("sub-1");
  JobRecord second = MustSubmit("sub-1");
  EXPECT_EQ(first.id, second.id);
  EXPECT_EQ(JobCount(), 1);
  // The repeat appends no second "submitted" event.
  EXPECT_EQ(Events(first.id).size(), 1u);
}

TEST_F(CoordinatorTest, SameSubmissionIdWithAnotherSpecIsAlreadyExists) {
  MustSubmit("sub-1", "tiny");
  absl::StatusOr<JobRecord> other = coordinator_->Submit("sub-1", TinySpec("other"), 0);
  EXPECT_TRUE(absl::IsAlreadyExists(other.status())) << other.status();
  EXPECT_EQ(JobCount(), 1);
}

TEST_F(CoordinatorTest, InvalidSpecNamesTheFieldAndStoresNothing) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->mutable_moe()->set_top_k(99);
  absl::StatusOr<JobRecord> job = coordinator_->Submit("sub-1", spec, 0);
  ASSERT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("model.moe.top_k"));
  EXPECT_EQ(JobCount(), 0);
}

TEST_F(CoordinatorTest, RejectsNamesThatCouldEscapeADirectory) {
  for (const std::string name : {"../etc", "a/b", "..", ".hidden", "a\\b", "x..y"}) {
    absl::StatusOr<JobRecord> job = coordinator_->Submit("sub-" + name, TinySpec(name), 0);
    EXPECT_TRUE(absl::IsInvalidArgument(job.status())) << name << ": " << job.status();
    EXPECT_THAT(job.status().message(), HasSubstr("name")) << name;
  }
  EXPECT_EQ(JobCount(), 0);
}

TEST_F(CoordinatorTest, RejectsMissingAndOverlongSubmissionIds) {
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->Submit("", TinySpec(), 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator_->Submit(std::string(kMaxSubmissionIdLength + 1, 'a'), TinySpec(), 0).status()));
  EXPECT_TRUE(
      coordinator_->Submit(std::string(kMaxSubmissionIdLength, 'a'), TinySpec(), 0).status().ok());
}

TEST_F(CoordinatorTest, ReadsTheEventLogWithoutWaiting) {
  const JobRecord job = MustSubmit("sub-log");
  ASSERT_TRUE(coordinator_->AppendEvent(job.id, kLogEventKind, "first").ok());
  ASSERT_TRUE(coordinator_->AppendEvent(job.id, kLogEventKind, "second").ok());
  absl::StatusOr<std::optional<EventRecord>> last = coordinator_->LastEvent(job.id);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->sequence, 3);
  EXPECT_EQ((*last)->payload, "second");
  absl::StatusOr<std::vector<EventRecord>> events = coordinator_->ReadEvents(job.id, 2, 10);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].payload, "first");
  EXPECT_EQ((*events)[1].sequence, 3);
  EXPECT_TRUE(coordinator_->ReadEvents(job.id, 4, 10)->empty());
  EXPECT_TRUE(absl::IsNotFound(coordinator_->LastEvent("job-unknown").status()));
  EXPECT_TRUE(absl::IsNotFound(coordinator_->ReadEvents("job-unknown", 1, 10).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->ReadEvents(job.id, 1, 0).status()));
}

TEST_F(CoordinatorTest, SubmitSerializedRejectsGarbage) {
  absl::StatusOr<JobRecord> job = coordinator_->SubmitSerialized("sub-1", "\xff\xff\xff", 0);
  EXPECT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  std::string bytes;
  ASSERT_TRUE(TinySpec().SerializeToString(&bytes));
  EXPECT_TRUE(coordinator_->SubmitSerialized("sub-1", bytes, 0).ok());
}

// Issue 31, item 2: checkpoint.init_from had no bound (a 4 MiB value broke every listing), and
// nothing bounded the stored spec as a whole (fields unknown to this build are kept in it).
TEST_F(CoordinatorTest, OverlongInitFromAndOversizedSpecsAreRefusedNamingTheSize) {
  v1::JobSpec spec = TinySpec();
  spec.mutable_checkpoint()->set_init_from(std::string(kMaxPathBytes + 1, 'i'));
  absl::StatusOr<JobRecord> job = coordinator_->Submit("init-from", spec, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("checkpoint.init_from"));
  EXPECT_THAT(job.status().message(), HasSubstr(std::to_string(kMaxPathBytes + 1)));

  // Field 1000, length-delimited: unknown to JobSpec, so parsing keeps it and so would the store.
  std::string bytes;
  ASSERT_TRUE(TinySpec().SerializeToString(&bytes));
  const std::string unknown(kMaxSpecBytes, 'u');
  bytes += std::string("\xc2\x3e", 2);  // tag (1000 << 3) | 2 as a varint
  for (size_t length = unknown.size();; length >>= 7) {
    if (length < 0x80) {
      bytes += static_cast<char>(length);
      break;
    }
    bytes += static_cast<char>((length & 0x7f) | 0x80);
  }
  bytes += unknown;
  job = coordinator_->SubmitSerialized("oversized", bytes, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(job.status())) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr(absl::StrCat("more than ", kMaxSpecBytes)));
  EXPECT_EQ(JobCount(), 0) << "nothing was stored";
}

TEST_F(CoordinatorTest, CancelEveryNonFinalStateAndRefuseFinalOnes) {
  JobRecord pending = MustSubmit("p");
  absl::StatusOr<JobRecord> cancelled = coordinator_->Cancel(pending.id, "no longer needed");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->state_reason, "no longer needed");
  std::vector<EventRecord> events = Events(pending.id);
  ASSERT_EQ(events.size(), 2u);
  absl::StatusOr<StateChange> change = DecodeStateChange(events[1].payload);
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_EQ(change->from, JobState::kPending);
  EXPECT_EQ(change->to, JobState::kCancelled);

  absl::Status again = coordinator_->Cancel(pending.id, "").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;

  JobRecord running = MustSubmit("r");
  ASSERT_TRUE(
      coordinator_->Transition(running.id, JobState::kPending, JobState::kScheduled, "").ok());
  ASSERT_TRUE(
      coordinator_->Transition(running.id, JobState::kScheduled, JobState::kRunning, "").ok());
  cancelled = coordinator_->Cancel(running.id, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->state_reason, "cancelled");

  JobRecord succeeded = MustSubmit("s");
  ASSERT_TRUE(
      coordinator_->Transition(succeeded.id, JobState::kPending, JobState::kScheduled, "").ok());
  ASSERT_TRUE(
      coordinator_->Transition(succeeded.id, JobState::kScheduled, JobState::kRunning, "").ok());
  ASSERT_TRUE(
      coordinator_->Transition(succeeded.id, JobState::kRunning, JobState::kSucceeded, "").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(coordinator_->Cancel(succeeded.id, "").status()));

  EXPECT_TRUE(absl::IsNotFound(coordinator_->Cancel("job-missing", "").status()));
}

TEST_F(CoordinatorTest, ListPagesThroughEveryJobOnceAndFiltersByState) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(MustSubmit("sub-" + std::to_string(i)).id);
  ASSERT_TRUE(coordinator_->Cancel(ids[1], "").ok());
  ASSERT_TRUE(coordinator_->Cancel(ids[3], "").ok());

  std::vector<std::string> seen;
  ListOptions options;
  options.page_size = 2;
  int pages = 0;
  do {
    absl::StatusOr<JobPage> page = coordinator_->List(options);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs.size(), 2u);
    for (const JobRecord& job : page->jobs) seen.push_back(job.id);
    options.page_token = page->next_page_token;
    ++pages;
  } while (!options.page_token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, ids);

  ListOptions cancelled;
  cancelled.states = {JobState::kCancelled};
  absl::StatusOr<JobPage> page = coordinator_->List(cancelled);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs.size(), 2u);
  EXPECT_EQ(page->jobs[0].id, ids[1]);
  EXPECT_EQ(page->jobs[1].id, ids[3]);

  ListOptions both;
  both.states = {JobState::kCancelled, JobState::kPending};
  page = coordinator_->List(both);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), 5u);

  ListOptions nothing;
  nothing.match_nothing = true;
  page = coordinator_->List(nothing);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->jobs.empty());

  ListOptions bad;
  bad.page_token = "not-a-token";
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->List(bad).status()));
}

TEST_F(CoordinatorTest, WatchFromASequenceDeliversRecordedThenLiveEventsWithoutGaps) {
  JobRecord job = MustSubmit("w");
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(coordinator_->AppendEvent(job.id, "log", "before " + std::to_string(i)).ok());
  }
  // Events 1..5 exist; watch from 3.
  std::vector<int64_t> sequences;
  absl::Notification caught_up;
  absl::Status result;
  std::thread watcher([&] {
    WatchOptions options;
    options.from_sequence = 3;
    // A long interval: the live events below must arrive by the condition variable alone.
    options.cancel_check_interval = absl::Hours(1);
    result = coordinator_->Watch(job.id, options, [&](const EventRecord& event) {
      sequences.push_back(event.sequence);
      if (event.sequence == 5) caught_up.Notify();
      return true;
    });
  });
  ASSERT_TRUE(caught_up.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(coordinator_->AppendEvent(job.id, "log", "after " + std::to_string(i)).ok());
  }
  ASSERT_TRUE(coordinator_->Cancel(job.id, "done watching").ok());
  watcher.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(sequences, (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(CoordinatorTest, WatchOfAFinalJobEndsAfterTheRecordedEvents) {
  JobRecord job = MustSubmit("f");
  ASSERT_TRUE(coordinator_->Cancel(job.id, "").ok());
  std::vector<int64_t> sequences;
  auto collect = [&](const EventRecord& event) {
    sequences.push_back(event.sequence);
    return true;
  };
  EXPECT_TRUE(coordinator_->Watch(job.id, {}, collect).ok());
  EXPECT_EQ(sequences, (std::vector<int64_t>{1, 2}));

  sequences.clear();
  WatchOptions past_the_end;
  past_the_end.from_sequence = 10;
  EXPECT_TRUE(coordinator_->Watch(job.id, past_the_end, collect).ok());
  EXPECT_TRUE(sequences.empty());
}

TEST_F(CoordinatorTest, WatchEndsWhenTheCallerCancelsOrTheCallbackStops) {
  JobRecord job = MustSubmit("c");
  std::atomic<bool> cancelled{false};
  absl::Status result;
  std::thread watcher([&] {
    WatchOptions options;
    options.is_cancelled = [&] { return cancelled.load(); };
    options.cancel_check_interval = absl::Milliseconds(10);
    result = coordinator_->Watch(job.id, options, [](const EventRecord&) { return true; });
  });
  cancelled = true;
  watcher.join();
  EXPECT_TRUE(result.ok()) << result;

  int calls = 0;
  EXPECT_TRUE(coordinator_
                  ->Watch(job.id, {},
                          [&](const EventRecord&) {
                            ++calls;
                            return false;
                          })
                  .ok());
  EXPECT_EQ(calls, 1);
}

TEST_F(CoordinatorTest, WatchRejectsUnknownJobsAndBadSequences) {
  auto ignore = [](const EventRecord&) { return true; };
  EXPECT_TRUE(absl::IsNotFound(coordinator_->Watch("job-missing", {}, ignore)));
  JobRecord job = MustSubmit("b");
  WatchOptions zero;
  zero.from_sequence = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->Watch(job.id, zero, ignore)));
}

TEST_F(CoordinatorTest, ShutdownEndsBlockedWatches) {
  JobRecord job = MustSubmit("s");
  absl::Status result = absl::UnknownError("not run");
  absl::Notification started;
  std::thread watcher([&] {
    WatchOptions options;
    options.cancel_check_interval = absl::Hours(1);
    result = coordinator_->Watch(job.id, options, [&](const EventRecord&) {
      started.Notify();
      return true;
    });
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  coordinator_->Shutdown();
  watcher.join();
  // Not OK: that would read as "the job is final".
  EXPECT_TRUE(absl::IsUnavailable(result)) << result;
}

}  // namespace
}  // namespace moetrain::server
