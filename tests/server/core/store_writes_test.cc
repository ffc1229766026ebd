// The store's write path: group commit under concurrency (each write atomic on its own, none
// lost, a failing one isolated), step metrics on the job row, restarts that do not count, open
// attempts for reconciliation, and forgetting workers.
#include <atomic>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/core/store_test_util.h"

namespace moetrain::server {
namespace {

TEST_F(StoreTest, ConcurrentCreatesShareCommitsAndLoseNothing) {
  constexpr int kThreads = 16;
  constexpr int kPerThread = 20;
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::latch start(kThreads);
  std::atomic<int> already_exists = 0;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) {
        // Every thread also submits one shared id with its own spec: exactly one spec wins, the
        // others fail alone, without taking the writes batched with them down.
        auto shared = store->CreateJob(Job("shared", "sub-shared", absl::StrCat("spec-", t)));
        if (!shared.ok()) {
          EXPECT_EQ(shared.status().code(), absl::StatusCode::kAlreadyExists) << shared.status();
          ++already_exists;
        }
        auto job = store->CreateJob(Job("j", absl::StrCat("sub-", t, "-", i)));
        ASSERT_TRUE(job.ok()) << job.status();
        ids[t].push_back(job->id);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::set<std::string> distinct;
  for (const auto& list : ids) distinct.insert(list.begin(), list.end());
  EXPECT_EQ(distinct.size(), size_t{kThreads * kPerThread});
  // The thread whose spec won gets its job back on its own repeats; everyone else is refused.
  EXPECT_EQ(already_exists.load(), (kThreads - 1) * kPerThread);
  ListJobsOptions all;
  all.page_size = 1000;
  EXPECT_EQ(store->ListJobs(all)->jobs.size(), size_t{kThreads * kPerThread + 1});
  for (const std::string& id : distinct) {
    auto events = store->ReadEvents(id, 0, 10);
    ASSERT_TRUE(events.ok()) << events.status();
    ASSERT_EQ(events->size(), 1u) << id;
    EXPECT_EQ((*events)[0].kind, kSubmittedEventKind);
  }
  // All of it on disk: a second connection sees the same.
  auto reopened = OpenStore();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(reopened->ListJobs(all)->jobs.size(), size_t{kThreads * kPerThread + 1});
}

TEST_F(StoreTest, StepMetricsLandOnTheJobRowWithTheirEvent) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string id = JobIn(*store, S::kRunning);
  EXPECT_EQ(store->GetJob(id)->last_step_metrics, "");
  auto first = store->RecordStepMetrics(id, 1, std::string("\x08\x01", 2));
  ASSERT_OK(first.status());
  auto second = store->RecordStepMetrics(id, 2, std::string("\x08\x02\x00", 3));
  ASSERT_OK(second.status());
  EXPECT_EQ(*second, *first + 1);
  EXPECT_EQ(store->GetJob(id)->last_step_metrics, std::string("\x08\x02\x00", 3));
  EXPECT_EQ(store->GetJob(id)->last_step_attempt, 2);
  auto events = store->ReadEvents(id, *first, 10);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, kStepMetricsEventKind);
  EXPECT_EQ((*events)[1].payload, std::string("\x08\x02\x00", 3));
  EXPECT_EQ(store->RecordStepMetrics("job-nope", 1, "x").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, AStoppedAttemptRestartsWithoutCounting) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string id = JobIn(*store, S::kRunning);
  TransitionOptions free_restart;
  free_restart.count_restart = false;
  auto job = store->TransitionJob(id, S::kRunning, S::kRestarting, "worker stopped", free_restart);
  ASSERT_OK(job.status());
  EXPECT_EQ(job->restarts, 0);
  ASSERT_OK(store->TransitionJob(id, S::kRestarting, S::kScheduled, "").status());
  ASSERT_OK(store->TransitionJob(id, S::kScheduled, S::kRestarting, "rank failed").status());
  EXPECT_EQ(store->GetJob(id)->restarts, 1);
}

TEST_F(StoreTest, OpenAttemptsListEveryUnendedAttemptInJobOrder) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string a = JobIn(*store, S::kRunning);
  const std::string b = JobIn(*store, S::kRunning);
  JobIn(*store, S::kPending);  // never started: no attempt to list
  ASSERT_OK(store->StartAttempt(a, {"w1"}).status());
  ASSERT_OK(store->EndAttempt(a, 1, "failed"));
  ASSERT_OK(store->StartAttempt(a, {"w2", "w3"}).status());
  ASSERT_OK(store->StartAttempt(b, {"w4"}).status());
  auto open = store->ListOpenAttempts();
  ASSERT_OK(open.status());
  ASSERT_EQ(open->size(), 2u);
  EXPECT_EQ((*open)[0].first, a);
  EXPECT_EQ((*open)[0].second.attempt, 2);
  EXPECT_EQ((*open)[0].second.workers, (std::vector<std::string>{"w2", "w3"}));
  EXPECT_EQ((*open)[1].first, b);
  EXPECT_EQ((*open)[1].second.workers, (std::vector<std::string>{"w4"}));
  ASSERT_OK(store->EndAttempt(b, 1, "succeeded"));
  EXPECT_EQ(store->ListOpenAttempts()->size(), 1u);
}

TEST_F(StoreTest, CheckpointsRememberTheirAttempt) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  const std::string id = JobIn(*store, S::kRunning);
  CheckpointRecord checkpoint;
  checkpoint.step = 10;
  checkpoint.path = "/c/10";
  checkpoint.tokens_seen = 1280;
  checkpoint.attempt = 2;
  ASSERT_OK(store->RecordCheckpoint(id, checkpoint));
  auto latest = store->LatestCheckpoint(id);
  ASSERT_OK(latest.status());
  EXPECT_EQ(latest->attempt, 2);
  EXPECT_EQ(latest->tokens_seen, 1280);
}

TEST_F(StoreTest, DeletedWorkersAreGone) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->UpsertWorker({"w1", "a", "r", WorkerState::kLost, absl::Time()}));
  ASSERT_OK(store->UpsertWorker({"w2", "b", "r", WorkerState::kIdle, absl::Time()}));
  ASSERT_OK(store->DeleteWorker("w1"));
  auto workers = store->ListWorkers();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ(workers->at(0).id, "w2");
  EXPECT_EQ(store->DeleteWorker("w1").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moetrain::server
