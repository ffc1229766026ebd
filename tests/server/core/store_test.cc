#include "server/core/store.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/core/store_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

TEST_F(StoreTest, CreateAndGet) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  NewJob job = Job("tiny-moe", "sub-1", std::string("abc"));
  job.priority = 7;
  auto created = store->CreateJob(job);
  ASSERT_OK(created.status());
  EXPECT_TRUE(std::regex_match(created->id, std::regex("job-[a-z2-7]{12}"))) << created->id;
  EXPECT_EQ(created->name, "tiny-moe");
  EXPECT_EQ(created->submission_id, "sub-1");
  EXPECT_EQ(created->spec, "abc");
  EXPECT_EQ(created->spec_sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(created->priority, 7);
  EXPECT_EQ(created->state, S::kPending);
  EXPECT_EQ(created->attempt, 0);
  EXPECT_EQ(created->restarts, 0);
  EXPECT_FALSE(created->latest_checkpoint_step.has_value());
  EXPECT_EQ(created->created_at, created->updated_at);

  auto got = store->GetJob(created->id);
  ASSERT_OK(got.status());
  EXPECT_EQ(got->id, created->id);
  EXPECT_EQ(got->created_at, created->created_at);

  // Spec bytes are opaque: NULs and high bytes survive.
  const std::string binary("\0\xff\x01spec\0", 8);
  auto bin = store->CreateJob(Job("bin", "", binary));
  ASSERT_OK(bin.status());
  EXPECT_EQ(store->GetJob(bin->id)->spec, binary);
  EXPECT_EQ(store->CreateJob(Job("empty", "", ""))->spec, "");

  EXPECT_EQ(store->GetJob("job-aaaaaaaaaaaa").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->GetJob("../etc").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, JobIdValidation) {
  for (const char* good : {"job-abcdefghij23", "a", "0-1"}) EXPECT_TRUE(ValidateJobId(good).ok());
  for (const std::string& bad :
       {std::string(""), std::string("a/b"), std::string(".."), std::string("a..b"),
        std::string("Job"), std::string("-rf"), std::string("a b"), std::string("é"),
        std::string(65, 'a'), std::string("a\0b", 3)}) {
    EXPECT_EQ(ValidateJobId(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    std::string id = DefaultStoreEnv()->NewJobId();
    EXPECT_TRUE(ValidateJobId(id).ok()) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 100u);
}

TEST_F(StoreTest, IdCollisionDrawsAgain) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  env_.QueueIds({"job-same", "job-same", "job-other"});
  EXPECT_EQ(store->CreateJob(Job("a"))->id, "job-same");
  EXPECT_EQ(store->CreateJob(Job("b"))->id, "job-other");

  env_.QueueIds({"job-same"}, /*repeat_last=*/true);
  auto stuck = store->CreateJob(Job("c"));
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kInternal) << stuck.status();
  env_.QueueIds({"Bad/Id"});
  EXPECT_EQ(store->CreateJob(Job("d")).status().code(), absl::StatusCode::kInternal);
  env_.QueueIds({});
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 2u);
}

TEST_F(StoreTest, SubmitIsIdempotentOnSubmissionId) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto first = store->CreateJob(Job("a", "sub-7", "spec-1"));
  ASSERT_OK(first.status());
  auto again = store->CreateJob(Job("a", "sub-7", "spec-1"));
  ASSERT_OK(again.status());
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(again->created_at, first->created_at);

  auto other = store->CreateJob(Job("a", "sub-7", "spec-2"));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other.status().message(), HasSubstr(first->id));

  // Empty submission ids never collide.
  EXPECT_NE(store->CreateJob(Job("x"))->id, store->CreateJob(Job("x"))->id);
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 3u);
}

TEST_F(StoreTest, ListJobsPagesInCreationOrder) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  // The clock runs backwards: creation order must not depend on it.
  env_.SetStep(absl::Seconds(-1));
  std::vector<std::string> ids;
  for (int i = 0; i < 25; ++i) {
    auto job = store->CreateJob(Job(absl::StrCat("job", i)));
    ASSERT_OK(job.status());
    ids.push_back(job->id);
    if (i % 3 == 0)
      ASSERT_OK(store->TransitionJob(job->id, S::kPending, S::kScheduled, "").status());
  }
  std::vector<std::string> seen;
  std::vector<size_t> sizes;
  ListJobsOptions options;
  options.page_size = 10;
  do {
    auto page = store->ListJobs(options);
    ASSERT_OK(page.status());
    sizes.push_back(page->jobs.size());
    for (const JobRecord& job : page->jobs) seen.push_back(job.id);
    options.page_token = page->next_page_token;
  } while (!options.page_token.empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(sizes, (std::vector<size_t>{10, 10, 5}));

  // Exactly a page's worth: no dangling empty page.
  options = {};
  options.page_size = 25;
  EXPECT_EQ(store->ListJobs(options)->next_page_token, "");

  options = {};
  options.states = {S::kScheduled};
  options.page_size = 4;
  std::vector<std::string> scheduled;
  do {
    auto page = store->ListJobs(options);
    ASSERT_OK(page.status());
    for (const JobRecord& job : page->jobs) {
      EXPECT_EQ(job.state, S::kScheduled);
      scheduled.push_back(job.id);
    }
    options.page_token = page->next_page_token;
  } while (!options.page_token.empty());
  std::vector<std::string> expected;
  for (size_t i = 0; i < ids.size(); i += 3) expected.push_back(ids[i]);
  EXPECT_EQ(scheduled, expected);

  options = {};
  options.page_token = "garbage";
  EXPECT_EQ(store->ListJobs(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = {};
  options.page_size = -1;
  EXPECT_EQ(store->ListJobs(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.page_size = 1001;
  EXPECT_EQ(store->ListJobs(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.page_size = 0;  // the default
  EXPECT_EQ(store->ListJobs(options)->jobs.size(), 25u);
}

TEST_F(StoreTest, EveryTransitionLegalOrNot) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      SCOPED_TRACE(absl::StrCat(JobStateName(from), " -> ", JobStateName(to)));
      std::string id = JobIn(*store, from);
      auto before = store->ReadEvents(id, 0, 100);
      ASSERT_OK(before.status());
      auto moved = store->TransitionJob(id, from, to, "because");
      auto after = store->ReadEvents(id, 0, 100);
      ASSERT_OK(after.status());
      auto job = store->GetJob(id);
      ASSERT_OK(job.status());
      if (IsLegalTransition(from, to)) {
        ASSERT_OK(moved.status());
        EXPECT_EQ(moved->state, to);
        EXPECT_EQ(job->state, to);
        EXPECT_EQ(job->state_reason, "because");
        ASSERT_EQ(after->size(), before->size() + 1);
        const EventRecord& event = after->back();
        EXPECT_EQ(event.sequence, static_cast<int64_t>(after->size()));
        EXPECT_EQ(event.kind, kStateChangeEventKind);
        auto change = DecodeStateChange(event.payload);
        ASSERT_OK(change.status());
        EXPECT_EQ(change->from, from);
        EXPECT_EQ(change->to, to);
        EXPECT_EQ(change->reason, "because");
      } else {
        EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_EQ(job->state, from);
        EXPECT_EQ(after->size(), before->size());
      }
    }
  }
}

TEST_F(StoreTest, StaleFromChangesNothing) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::string id = JobIn(*store, S::kRunning);
  auto stale = store->TransitionJob(id, S::kPending, S::kScheduled, "late");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.status().message(), HasSubstr("RUNNING"));
  EXPECT_EQ(store->GetJob(id)->state, S::kRunning);
  // Submitted, PENDING → SCHEDULED, SCHEDULED → RUNNING: nothing from the stale call.
  EXPECT_EQ(store->ReadEvents(id, 0, 100)->size(), 3u);
  EXPECT_EQ(store->TransitionJob("job-nope", S::kPending, S::kScheduled, "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, RestartsAreCounted) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::string id = JobIn(*store, S::kRunning);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(store->TransitionJob(id, S::kRunning, S::kRestarting, "rank died").status());
    ASSERT_OK(store->TransitionJob(id, S::kRestarting, S::kScheduled, "").status());
    ASSERT_OK(store->TransitionJob(id, S::kScheduled, S::kRunning, "").status());
  }
  auto job = store->TransitionJob(id, S::kRunning, S::kSucceeded, "done");
  ASSERT_OK(job.status());
  EXPECT_EQ(job->restarts, 3);
  EXPECT_GT(job->updated_at, job->created_at);
}

// N threads race PENDING → SCHEDULED on one job: exactly one wins, through one shared Store
// (its mutex) or through one Store per thread (SQLite's locking between connections).
void RaceTransitions(std::vector<Store*> stores, const std::string& id) {
  std::atomic<int> wins = 0, stale = 0;
  std::latch start(static_cast<std::ptrdiff_t>(stores.size()));
  std::vector<std::thread> threads;
  for (Store* store : stores) {
    threads.emplace_back([&, store] {
      start.arrive_and_wait();
      auto moved = store->TransitionJob(id, S::kPending, S::kScheduled, "race");
      if (moved.ok()) {
        ++wins;
      } else if (moved.status().code() == absl::StatusCode::kFailedPrecondition) {
        ++stale;
      } else {
        ADD_FAILURE() << moved.status();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wins.load(), 1);
  EXPECT_EQ(stale.load(), static_cast<int>(stores.size()) - 1);
}

TEST_F(StoreTest, ExactlyOneRacingTransitionWins) {
  constexpr int kThreads = 8;
  auto shared = OpenStore();
  ASSERT_NE(shared, nullptr);
  std::vector<std::unique_ptr<Store>> own;
  for (int i = 0; i < kThreads; ++i) own.push_back(OpenStore());
  for (int round = 0; round < 5; ++round) {
    std::string id = JobIn(*shared, S::kPending);
    RaceTransitions(std::vector<Store*>(kThreads, shared.get()), id);
    EXPECT_EQ(shared->ReadEvents(id, 0, 100)->size(), 2u);  // submitted + the winner

    id = JobIn(*shared, S::kPending);
    std::vector<Store*> stores;
    for (auto& store : own) stores.push_back(store.get());
    RaceTransitions(stores, id);
    EXPECT_EQ(shared->ReadEvents(id, 0, 100)->size(), 2u);  // submitted + the winner
  }
}

// Appends from several threads and connections interleave; sequences stay 1..N without gaps.
TEST_F(StoreTest, EventSequencesAreGaplessUnderConcurrentAppends) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  auto shared = OpenStore();
  ASSERT_NE(shared, nullptr);
  std::string id = JobIn(*shared, S::kPending);
  std::vector<std::unique_ptr<Store>> own;
  for (int i = 0; i < kThreads; ++i) own.push_back(OpenStore());

  absl::Mutex mu;
  std::map<int64_t, std::string> by_sequence;  // sequence → payload the appender wrote
  std::vector<std::thread> threads;
  for (int t = 0; t < 2 * kThreads; ++t) {
    Store* store = t < kThreads ? shared.get() : own[t - kThreads].get();
    threads.emplace_back([&, store, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::string payload = absl::StrCat(t, ":", i);
        auto sequence = store->AppendEvent(id, "log", payload);
        ASSERT_TRUE(sequence.ok()) << sequence.status();
        absl::MutexLock lock(&mu);
        EXPECT_TRUE(by_sequence.emplace(*sequence, payload).second) << *sequence;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  // The job's own "submitted" event is sequence 1.
  const int64_t total = 2 * kThreads * kPerThread + 1;
  auto events = shared->ReadEvents(id, 0, 10000);
  ASSERT_OK(events.status());
  ASSERT_EQ(static_cast<int64_t>(events->size()), total);
  EXPECT_EQ((*events)[0].kind, kSubmittedEventKind);
  for (int64_t i = 1; i < total; ++i) {
    const EventRecord& event = (*events)[i];
    EXPECT_EQ(event.sequence, i + 1);
    EXPECT_EQ(event.kind, "log");
    EXPECT_EQ(event.payload, by_sequence[event.sequence]);
  }
}

TEST_F(StoreTest, ReadEventsFromAnOffset) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::string id = JobIn(*store, S::kPending);
  // Sequence 1 is the job's "submitted" event; step i lands at i + 1.
  for (int i = 1; i <= 10; ++i) {
    EXPECT_EQ(*store->AppendEvent(id, "step", absl::StrCat("step ", i)), i + 1);
  }
  auto window = store->ReadEvents(id, 5, 3);
  ASSERT_OK(window.status());
  ASSERT_EQ(window->size(), 3u);
  EXPECT_EQ((*window)[0].sequence, 5);
  EXPECT_EQ((*window)[0].payload, "step 4");
  EXPECT_EQ((*window)[2].sequence, 7);
  EXPECT_EQ(store->ReadEvents(id, 10, 100)->size(), 2u);
  EXPECT_TRUE(store->ReadEvents(id, 12, 100)->empty());
  EXPECT_EQ(store->ReadEvents(id, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReadEvents(id, -1, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReadEvents("job-nope", 0, 5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->AppendEvent("job-nope", "x", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->AppendEvent(id, "", "").status().code(), absl::StatusCode::kInvalidArgument);
  // Events of another job count from 1 (its "submitted") on their own.
  std::string other = JobIn(*store, S::kPending);
  EXPECT_EQ(*store->AppendEvent(other, "step", ""), 2);
}

TEST_F(StoreTest, Attempts) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::string id = JobIn(*store, S::kScheduled);
  EXPECT_TRUE(store->ListAttempts(id)->empty());
  auto first = store->StartAttempt(id, {"w0", "w1"});
  ASSERT_OK(first.status());
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(store->StartAttempt(id, {"w2"}).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(store->EndAttempt(id, 1, "failed: rank 1 exited with 137"));
  EXPECT_EQ(store->EndAttempt(id, 1, "again").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->EndAttempt(id, 5, "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->EndAttempt(id, 1, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*store->StartAttempt(id, {"w1", "w0"}), 2);
  EXPECT_EQ(store->GetJob(id)->attempt, 2);

  auto attempts = store->ListAttempts(id);
  ASSERT_OK(attempts.status());
  ASSERT_EQ(attempts->size(), 2u);
  EXPECT_EQ((*attempts)[0].workers, (std::vector<std::string>{"w0", "w1"}));
  EXPECT_EQ((*attempts)[0].outcome, "failed: rank 1 exited with 137");
  EXPECT_TRUE((*attempts)[0].ended_at.has_value());
  EXPECT_EQ((*attempts)[1].workers, (std::vector<std::string>{"w1", "w0"}));
  EXPECT_FALSE((*attempts)[1].ended_at.has_value());
  EXPECT_EQ((*attempts)[1].outcome, "");

  EXPECT_EQ(store->StartAttempt(id, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartAttempt(id, {"a,b"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->StartAttempt("job-nope", {"w0"}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, Checkpoints) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  std::string id = JobIn(*store, S::kRunning);
  EXPECT_EQ(store->LatestCheckpoint(id).status().code(), absl::StatusCode::kNotFound);
  for (int64_t step : {100, 300, 200}) {
    ASSERT_OK(store->RecordCheckpoint(
        id, {step, absl::StrCat("/ckpt/", id, "/step-", step), step * 4096, absl::Time()}));
  }
  auto latest = store->LatestCheckpoint(id);
  ASSERT_OK(latest.status());
  EXPECT_EQ(latest->step, 300);
  EXPECT_EQ(latest->tokens_seen, 300 * 4096);
  EXPECT_EQ(store->GetJob(id)->latest_checkpoint_step, 300);

  // A re-reported step replaces its row and never lowers the latest step.
  ASSERT_OK(store->RecordCheckpoint(id, {200, "/ckpt/again", 7, absl::Time()}));
  auto all = store->ListCheckpoints(id);
  ASSERT_OK(all.status());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].step, 100);
  EXPECT_EQ((*all)[1].step, 200);
  EXPECT_EQ((*all)[1].path, "/ckpt/again");
  EXPECT_EQ((*all)[2].step, 300);
  EXPECT_EQ(store->GetJob(id)->latest_checkpoint_step, 300);

  EXPECT_EQ(store->RecordCheckpoint(id, {-1, "/x", 0, absl::Time()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordCheckpoint(id, {1, "", 0, absl::Time()}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordCheckpoint("job-nope", {1, "/x", 0, absl::Time()}).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, Workers) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->UpsertWorker(
      {"w1", "node-a", std::string("\x01\x02", 2), WorkerState::kIdle, absl::Time()}));
  ASSERT_OK(store->UpsertWorker({"w0", "node-b", "", WorkerState::kIdle, absl::Time()}));
  auto before = store->ListWorkers();
  ASSERT_OK(before.status());
  ASSERT_EQ(before->size(), 2u);
  EXPECT_EQ((*before)[0].id, "w0");
  EXPECT_EQ((*before)[1].resources, std::string("\x01\x02", 2));

  // A heartbeat is an upsert: it refreshes the time and the fields.
  ASSERT_OK(store->UpsertWorker({"w1", "node-a2", "", WorkerState::kBusy, absl::Time()}));
  ASSERT_OK(store->SetWorkerState("w0", WorkerState::kLost));
  auto after = store->ListWorkers();
  ASSERT_OK(after.status());
  ASSERT_EQ(after->size(), 2u);
  EXPECT_EQ((*after)[0].state, WorkerState::kLost);
  EXPECT_EQ((*after)[1].name, "node-a2");
  EXPECT_EQ((*after)[1].state, WorkerState::kBusy);
  EXPECT_GT((*after)[1].last_heartbeat, (*before)[1].last_heartbeat);

  EXPECT_EQ(store->SetWorkerState("w9", WorkerState::kIdle).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->UpsertWorker({"", "", "", WorkerState::kIdle, absl::Time()}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, CountJobsByState) {
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  JobIn(*store, S::kPending);
  JobIn(*store, S::kPending);
  JobIn(*store, S::kRunning);
  JobIn(*store, S::kCancelled);
  auto counts = store->CountJobsByState();
  ASSERT_OK(counts.status());
  EXPECT_EQ(counts->size(), kAllJobStates.size());
  EXPECT_EQ(counts->at(S::kPending), 2);
  EXPECT_EQ(counts->at(S::kRunning), 1);
  EXPECT_EQ(counts->at(S::kCancelled), 1);
  EXPECT_EQ(counts->at(S::kSucceeded), 0);
}

TEST_F(StoreTest, ReopenKeepsEverything) {
  std::string id;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    id = JobIn(*store, S::kRunning);
    ASSERT_OK(store->AppendEvent(id, "log", "hello").status());
    ASSERT_OK(store->StartAttempt(id, {"w0"}).status());
    ASSERT_OK(store->RecordCheckpoint(id, {50, "/c/50", 500, absl::Time()}));
    ASSERT_OK(store->UpsertWorker({"w0", "n", "r", WorkerState::kBusy, absl::Time()}));
    ASSERT_OK(store->CreateJob(Job("second", "sub-2")).status());
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto job = store->GetJob(id);
  ASSERT_OK(job.status());
  EXPECT_EQ(job->state, S::kRunning);
  EXPECT_EQ(job->attempt, 1);
  EXPECT_EQ(job->latest_checkpoint_step, 50);
  auto events = store->ReadEvents(id, 0, 100);
  ASSERT_EQ(events->size(), 4u);  // submitted, two transitions, "hello"
  EXPECT_EQ(events->back().payload, "hello");
  EXPECT_EQ(store->ListAttempts(id)->size(), 1u);
  EXPECT_EQ(store->LatestCheckpoint(id)->path, "/c/50");
  EXPECT_EQ(store->ListWorkers()->at(0).state, WorkerState::kBusy);
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 2u);
  // The idempotency key survives too, and sequences continue.
  EXPECT_EQ(store->CreateJob(Job("second", "sub-2"))->name, "second");
  EXPECT_EQ(store->ListJobs({})->jobs.size(), 2u);
  EXPECT_EQ(*store->AppendEvent(id, "log", ""), 5);
}

TEST_F(StoreTest, SchemaVersionIsRecorded) {
  // A zero-byte file is a fresh database: migrated from version 0.
  WriteFile(path_, "");
  ASSERT_NE(OpenStore(), nullptr);
  EXPECT_EQ(RawQuery(path_, "SELECT version FROM schema_version"),
            absl::StrCat(Store::kSchemaVersion));
  EXPECT_EQ(RawQuery(path_, "SELECT count(*) FROM schema_version"), "1");
  EXPECT_EQ(RawQuery(path_, "PRAGMA journal_mode"), "wal");
  // Opening again migrates nothing.
  ASSERT_NE(OpenStore(), nullptr);
  EXPECT_EQ(RawQuery(path_, "SELECT count(*) FROM schema_version"), "1");

  RawExec(path_, "UPDATE schema_version SET version = 99");
  auto newer = Store::Open(path_, {});
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(newer.status().message(), HasSubstr("99"));
}

TEST_F(StoreTest, ForeignDatabaseIsRefused) {
  RawExec(path_, "CREATE TABLE photos (id INTEGER)");
  auto store = Store::Open(path_, {});
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_EQ(RawQuery(path_, "SELECT count(*) FROM sqlite_master"), "1");
}

TEST_F(StoreTest, GarbageFileIsDataLossAndLeftAlone) {
  std::string garbage;
  for (int i = 0; i < 10000; ++i) garbage.push_back(static_cast<char>((i * 7919) % 251));
  WriteFile(path_, garbage);
  for (bool verify : {true, false}) {
    StoreOptions options;
    options.verify_on_open = verify;
    auto store = Store::Open(path_, options);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
    EXPECT_THAT(store.status().message(), HasSubstr(path_));
    EXPECT_EQ(ReadFile(path_), garbage);
  }
}

TEST_F(StoreTest, TruncatedFileIsDataLossAndLeftAlone) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 200; ++i) {
      auto job = store->CreateJob(Job(absl::StrCat("j", i), "", std::string(2000, 'x')));
      ASSERT_OK(job.status());
    }
  }
  // The last connection closed: the WAL is checkpointed into the main file and removed.
  ASSERT_FALSE(fs::exists(path_ + "-wal"));
  const std::string whole = ReadFile(path_);
  ASSERT_GT(whole.size(), 100'000u);
  const std::string truncated = whole.substr(0, whole.size() / 2);
  WriteFile(path_, truncated);
  auto store = Store::Open(path_, {});
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_EQ(ReadFile(path_), truncated);
}

// Damage inside the file (pages overwritten, size intact) is invisible until a query touches it;
// verify_on_open catches it at startup.
TEST_F(StoreTest, DamagedPagesAreCaughtOnOpen) {
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 200; ++i) {
      ASSERT_OK(store->CreateJob(Job(absl::StrCat("j", i), "", std::string(2000, 'x'))).status());
    }
  }
  std::string damaged = ReadFile(path_);
  ASSERT_GT(damaged.size(), 41u * 4096);
  for (int page : {20, 40}) damaged.replace(page * 4096, 4096, std::string(4096, '\xab'));
  WriteFile(path_, damaged);
  auto store = Store::Open(path_, {});
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  EXPECT_EQ(ReadFile(path_), damaged);
}

TEST_F(StoreTest, LockedFileIsUnavailable) {
  StoreOptions options;
  options.busy_timeout = absl::Milliseconds(50);
  auto store = OpenStore(options);
  ASSERT_NE(store, nullptr);
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  auto blocked = store->CreateJob(Job("blocked"));
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kUnavailable) << blocked.status();
  EXPECT_THAT(blocked.status().message(), HasSubstr(path_));
  // Readers are not blocked by a writer in WAL mode.
  EXPECT_TRUE(store->ListJobs({}).ok());
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  EXPECT_TRUE(store->CreateJob(Job("free")).ok());
}

// A child process commits a transition and dies at once, by _exit or SIGKILL (its own, or the
// parent's after the child said it committed). The parent reopens and must see the transition.
enum class Death { kExit, kKillSelf, kKilledByParent };

class StoreDurabilityTest : public StoreTest, public ::testing::WithParamInterface<Death> {};

TEST_P(StoreDurabilityTest, CommittedTransitionSurvivesAbruptExit) {
  std::string id;
  {
    auto store = OpenStore();
    ASSERT_NE(store, nullptr);
    id = JobIn(*store, S::kPending);
  }  // no connection crosses the fork
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    auto store = Store::Open(path_, {});
    if (!store.ok()) _exit(10);
    if (!(*store)->TransitionJob(id, S::kPending, S::kScheduled, "child").ok()) _exit(11);
    if (!(*store)->AppendEvent(id, "log", "after").ok()) _exit(12);
    switch (GetParam()) {
      case Death::kExit:
        _exit(0);
      case Death::kKillSelf:
        kill(getpid(), SIGKILL);
        break;
      case Death::kKilledByParent:
        if (write(pipe_fds[1], "c", 1) != 1) _exit(13);
        for (;;) pause();
    }
    _exit(14);
  }
  close(pipe_fds[1]);
  if (GetParam() == Death::kKilledByParent) {
    char byte = 0;
    ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
    kill(child, SIGKILL);
  }
  close(pipe_fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  if (GetParam() == Death::kExit) {
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  } else {
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
  }
  auto store = OpenStore();
  ASSERT_NE(store, nullptr);
  auto job = store->GetJob(id);
  ASSERT_OK(job.status());
  EXPECT_EQ(job->state, S::kScheduled);
  EXPECT_EQ(job->state_reason, "child");
  auto events = store->ReadEvents(id, 0, 10);
  ASSERT_OK(events.status());
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].kind, kSubmittedEventKind);
  EXPECT_EQ((*events)[1].kind, kStateChangeEventKind);
  EXPECT_EQ((*events)[2].payload, "after");
}

INSTANTIATE_TEST_SUITE_P(Deaths, StoreDurabilityTest,
                         ::testing::Values(Death::kExit, Death::kKillSelf, Death::kKilledByParent),
                         [](const ::testing::TestParamInfo<Death>& info) {
                           switch (info.param) {
                             case Death::kExit:
                               return "Exit";
                             case Death::kKillSelf:
                               return "KillSelf";
                             case Death::kKilledByParent:
                               return "KilledByParent";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace moetrain::server
