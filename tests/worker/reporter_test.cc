// The worker's Reporter against a real coordinator in the test process (a CoordinatorServer on a
// loopback port, reached through moetrain::Connect): delivery in order, Flush, fencing, an unknown
// worker id, the callbacks, retries across a coordinator restart, and the queue limit. The test
// plays the rest of the worker (the fixture of worker_test_util.h): it registers, takes the
// assignment and heartbeats the rank.
#include "worker/reporter.h"

#include <sqlite3.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/worker.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace moetrain {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

using worker_test::kPatience;
using worker_test::WaitUntil;

constexpr int64_t kStaleAttempt = 7;

// Holds the state file's write lock from a SQLite connection of its own until destroyed: every
// coordinator call that writes waits for it (up to the store's busy timeout), so reports enqueued
// meanwhile are all queued before the reporter hears back about the first one.
class StoreWriteLock {
 public:
  explicit StoreWriteLock(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK) << path;
    sqlite3_busy_timeout(db_, 5000);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "");
    sqlite3_free(error);
  }
  ~StoreWriteLock() {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
  }
  StoreWriteLock(const StoreWriteLock&) = delete;
  StoreWriteLock& operator=(const StoreWriteLock&) = delete;

 private:
  sqlite3* db_ = nullptr;
};

// What the reporter told its owner, recorded from its thread.
class Told {
 public:
  using AttemptKey = std::pair<std::string, int64_t>;

  ReporterOptions Options(size_t max_queued = 10000) {
    ReporterOptions options;
    options.call_timeout = absl::Seconds(10);
    options.initial_backoff = absl::Milliseconds(20);
    options.max_backoff = absl::Milliseconds(200);
    options.max_queued = max_queued;
    options.on_fenced = [this](const std::string& job_id, int64_t attempt) {
      absl::MutexLock lock(&mu_);
      fenced_.emplace_back(job_id, attempt);
    };
    options.on_worker_unknown = [this](const std::string& worker_id) {
      absl::MutexLock lock(&mu_);
      unknown_workers_.push_back(worker_id);
    };
    options.on_attempt_resolved = [this](const std::string& job_id, int64_t attempt) {
      absl::MutexLock lock(&mu_);
      resolved_.emplace_back(job_id, attempt);
    };
    return options;
  }

  std::vector<AttemptKey> fenced() {
    absl::MutexLock lock(&mu_);
    return fenced_;
  }
  std::vector<std::string> unknown_workers() {
    absl::MutexLock lock(&mu_);
    return unknown_workers_;
  }
  std::vector<AttemptKey> resolved() {
    absl::MutexLock lock(&mu_);
    return resolved_;
  }

 private:
  absl::Mutex mu_;
  std::vector<AttemptKey> fenced_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> unknown_workers_ ABSL_GUARDED_BY(mu_);
  std::vector<AttemptKey> resolved_ ABSL_GUARDED_BY(mu_);
};

class ReporterTest : public worker_test::CoordinatorFixture {
 protected:
  ReporterTest() : CoordinatorFixture("reporter-test") {}

  // The job's step, log and checkpoint events in order, as "step 3", "log text", "checkpoint 2".
  std::vector<std::string> Reported() {
    v1::WatchJobRequest request;
    request.set_job_id(job_id_);
    request.set_no_wait(true);
    grpc::ClientContext context;
    connection_.Prepare(&context, absl::Seconds(10));
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = jobs_->WatchJob(&context, request);
    std::vector<std::string> reported;
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.has_step_metrics()) {
        reported.push_back(absl::StrCat("step ", event.step_metrics().step()));
      } else if (event.has_log_line()) {
        reported.push_back(absl::StrCat("log ", event.log_line().text()));
      } else if (event.has_checkpoint_saved()) {
        reported.push_back(absl::StrCat("checkpoint ", event.checkpoint_saved().step()));
      }
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reported;
  }

  // Reports of the test's rank; another attempt or worker id where a test needs one.
  v1::ReportStepRequest Step(int64_t step, int64_t attempt = 1, std::string worker_id = "") {
    v1::ReportStepRequest request;
    request.set_worker_id(worker_id.empty() ? worker_id_ : worker_id);
    request.set_job_id(job_id_);
    request.set_attempt(attempt);
    request.set_rank(0);
    request.mutable_metrics()->set_step(step);
    request.mutable_metrics()->set_loss(1.0 / static_cast<double>(step));
    request.mutable_metrics()->set_tokens_seen(step * 1000);
    return request;
  }
  v1::ReportLogRequest Log(const std::string& line, int64_t attempt = 1,
                           std::string worker_id = "") {
    v1::ReportLogRequest request;
    request.set_worker_id(worker_id.empty() ? worker_id_ : worker_id);
    request.set_job_id(job_id_);
    request.set_attempt(attempt);
    request.set_rank(0);
    request.add_lines(line);
    return request;
  }
  v1::ReportCheckpointRequest Checkpoint(int64_t step) {
    v1::ReportCheckpointRequest request;
    request.set_worker_id(worker_id_);
    request.set_job_id(job_id_);
    request.set_attempt(1);
    request.set_rank(0);
    request.set_step(step);
    request.set_path(absl::StrFormat("%s/step-%08d", assignment_.checkpoint_dir(), step));
    request.set_tokens_seen(step * 1000);
    return request;
  }
  v1::ReportAttemptEndRequest End(v1::AttemptOutcome outcome, int64_t step, int64_t attempt = 1,
                                  std::string worker_id = "") {
    v1::ReportAttemptEndRequest request;
    request.set_worker_id(worker_id.empty() ? worker_id_ : worker_id);
    request.set_job_id(job_id_);
    request.set_attempt(attempt);
    request.set_rank(0);
    request.set_outcome(outcome);
    request.set_step(step);
    return request;
  }
};

TEST_F(ReporterTest, DeliversReportsInTheOrderTheyWereMade) {
  steps_ = 3;
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  reporter.Enqueue(Step(1));
  reporter.Enqueue(Log("one"));
  reporter.Enqueue(Step(2));
  reporter.Enqueue(Checkpoint(2));
  reporter.Enqueue(Log("two"));
  reporter.Enqueue(Step(3));
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  EXPECT_THAT(Reported(),
              ElementsAre("step 1", "log one", "step 2", "checkpoint 2", "log two", "step 3"));
  EXPECT_THAT(told.resolved(), IsEmpty());

  reporter.Enqueue(Checkpoint(3));  // the final one, without which SUCCEEDED is refused
  reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_SUCCEEDED, 3));
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  // The callbacks run on the reporter's thread once the report has left the queue.
  ASSERT_TRUE(WaitUntil([&] { return !told.resolved().empty(); }));
  EXPECT_THAT(told.resolved(), ElementsAre(Pair(job_id_, 1)));
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(told.fenced(), IsEmpty());
  EXPECT_THAT(told.unknown_workers(), IsEmpty());
}

TEST_F(ReporterTest, FencedReportDropsTheQueuedReportsOfItsAttemptOnly) {
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  {
    const StoreWriteLock hold(state_db());
    reporter.Enqueue(Step(1));  // held up at the coordinator by the lock
    reporter.Enqueue(Step(2, kStaleAttempt));
    reporter.Enqueue(Log("stale", kStaleAttempt));
    reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_FAILED, 2, kStaleAttempt));
    reporter.Enqueue(Step(2));
    reporter.Enqueue(Log("current"));
  }
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  // on_fenced comes first, then on_attempt_resolved for the dropped end report.
  ASSERT_TRUE(WaitUntil([&] { return !told.resolved().empty(); }));
  EXPECT_THAT(told.fenced(), ElementsAre(Pair(job_id_, kStaleAttempt)))
      << "one refusal; the rest of the attempt's reports were dropped unsent";
  EXPECT_THAT(told.resolved(), ElementsAre(Pair(job_id_, kStaleAttempt)));
  EXPECT_THAT(told.unknown_workers(), IsEmpty());
  EXPECT_THAT(Reported(), ElementsAre("step 1", "step 2", "log current"));
  const v1::Job job = GetJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 0);
}

TEST_F(ReporterTest, UnknownWorkerDropsEveryReportMadeUnderItsId) {
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  {
    const StoreWriteLock hold(state_db());
    reporter.Enqueue(Step(1));
    reporter.Enqueue(Step(2, 1, "w-forgotten"));
    reporter.Enqueue(Log("ghost", 1, "w-forgotten"));
    reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_FAILED, 2, 1, "w-forgotten"));
    reporter.Enqueue(Step(2));
  }
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  ASSERT_TRUE(WaitUntil([&] { return !told.resolved().empty(); }));
  EXPECT_THAT(told.unknown_workers(), ElementsAre("w-forgotten"));
  EXPECT_THAT(told.resolved(), ElementsAre(Pair(job_id_, 1)));
  EXPECT_THAT(told.fenced(), IsEmpty());
  EXPECT_THAT(Reported(), ElementsAre("step 1", "step 2"));
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_RUNNING) << "the dropped end report never arrived";
}

TEST_F(ReporterTest, RefusedReportsAreDroppedAndAnEndReportStillResolvesItsAttempt) {
  steps_ = 2;
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  v1::ReportCheckpointRequest misplaced = Checkpoint(2);
  misplaced.set_path((dir_.path() / "elsewhere/step-00000002").string());
  reporter.Enqueue(misplaced);  // INVALID_ARGUMENT: dropped, the reports behind it go on
  reporter.Enqueue(Step(2));
  reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_UNSPECIFIED, 2));  // INVALID_ARGUMENT too
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  ASSERT_TRUE(WaitUntil([&] { return !told.resolved().empty(); }));
  EXPECT_THAT(told.resolved(), ElementsAre(Pair(job_id_, 1)));
  EXPECT_THAT(Reported(), ElementsAre("step 2"));
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_RUNNING);

  reporter.Enqueue(Checkpoint(2));
  reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_SUCCEEDED, 2));
  ASSERT_TRUE(WaitUntil([&] { return told.resolved().size() == 2; }));
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(told.fenced(), IsEmpty());
  EXPECT_THAT(told.unknown_workers(), IsEmpty());
}

// A step report the coordinator already has (ALREADY_EXISTS: a retry whose first answer was lost)
// counts as delivered: the rank is not fenced, and the reports behind it go on.
TEST_F(ReporterTest, RepeatedStepReportIsDroppedAndTheRankGoesOn) {
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  reporter.Enqueue(Step(2));
  reporter.Enqueue(Step(2));
  reporter.Enqueue(Step(1));
  reporter.Enqueue(Log("after"));
  reporter.Enqueue(Step(3));
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  EXPECT_THAT(Reported(), ElementsAre("step 2", "log after", "step 3"));
  EXPECT_THAT(told.fenced(), IsEmpty());
  EXPECT_THAT(told.unknown_workers(), IsEmpty());
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ReporterTest, KeepsReportsWhileTheCoordinatorIsAwayAndDeliversThemAfterItsRestart) {
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options());
  reporter.Enqueue(Step(1));
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));

  StopCoordinator();
  reporter.Enqueue(Step(2));
  reporter.Enqueue(Log("while away"));
  reporter.Enqueue(Checkpoint(2));
  reporter.Enqueue(Step(3));
  EXPECT_FALSE(reporter.Flush(absl::Now() + absl::Milliseconds(300)))
      << "nobody was there to take the reports";

  // The same port and state file, within the grace period: the attempt is still current.
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(port_));
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  EXPECT_THAT(Reported(),
              ElementsAre("step 1", "step 2", "log while away", "checkpoint 2", "step 3"));
  const v1::Job job = GetJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_THAT(told.fenced(), IsEmpty());
  EXPECT_THAT(told.unknown_workers(), IsEmpty());
}

TEST_F(ReporterTest, FullQueueDropsTheOldestStepAndLogReportsOnly) {
  steps_ = 4;
  ASSERT_NO_FATAL_FAILURE(StartRunningJob());
  Told told;
  Reporter reporter(&connection_, told.Options(/*max_queued=*/4));
  {
    const StoreWriteLock hold(state_db());
    reporter.Enqueue(Checkpoint(1));  // the front, held up at the coordinator
    reporter.Enqueue(Step(2));
    reporter.Enqueue(Log("dropped"));
    reporter.Enqueue(Step(3));
    reporter.Enqueue(Checkpoint(4));                          // drops step 2
    reporter.Enqueue(Step(4));                                // drops the log line
    reporter.Enqueue(End(v1::ATTEMPT_OUTCOME_SUCCEEDED, 4));  // drops step 3
  }
  ASSERT_TRUE(reporter.Flush(absl::Now() + kPatience));
  ASSERT_TRUE(WaitUntil([&] { return !told.resolved().empty(); }));
  EXPECT_THAT(Reported(), ElementsAre("checkpoint 1", "checkpoint 4", "step 4"));
  EXPECT_EQ(GetJob().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(told.resolved(), ElementsAre(Pair(job_id_, 1)));
}

}  // namespace
}  // namespace moetrain
