// The bounds of the rendezvous on a real store and coordinator: keys and bytes per attempt, bytes
// of all attempts together, and the release of an attempt's keys however the attempt ends.
#include <string>

#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

// Sets `count` keys of `value_bytes` each; the bytes they hold (keys and values).
int64_t Fill(Fleet& fleet, const std::string& worker_id, const std::string& job_id, int64_t attempt,
             int count, size_t value_bytes) {
  int64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const std::string key = absl::StrCat("key-", i);
    const absl::Status set =
        fleet.KvSet(worker_id, job_id, attempt, key, std::string(value_bytes, 'v'));
    EXPECT_TRUE(set.ok()) << key << ": " << set;
    bytes += static_cast<int64_t>(key.size() + value_bytes);
  }
  return bytes;
}

TEST_F(FleetTest, KvKeysPerAttemptAreCappedAt1024) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& job = running.job.id;
  Fill(*fleet_, running.worker_id, job, 1, 1024, 1);
  const absl::Status over = fleet_->KvSet(running.worker_id, job, 1, "key-1024", "v");
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("holds 1024 keys"));
  EXPECT_THAT(over.message(), HasSubstr("kv_max_keys_per_attempt"));
  // A key already there may still be overwritten.
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-7", "new"));
}

TEST_F(FleetTest, KvBytesPerAttemptAreCappedAt64MiB) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& job = running.job.id;
  const std::string mib(kMiB, 'v');
  int stored = 0;
  absl::Status status;
  for (; stored < 100; ++stored) {
    status = fleet_->KvSet(running.worker_id, job, 1, absl::StrCat("key-", stored), mib);
    if (!status.ok()) break;
  }
  // 63 values and their keys fit in 64 MiB; the 64th value's key is one byte too many.
  EXPECT_EQ(stored, 63);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("more than the 67108864 an attempt may hold"));
  const int64_t held = fleet_->KvBytes();
  EXPECT_LE(held, 64 * kMiB);
  EXPECT_GT(held, 63 * kMiB);
  // Overwriting with a smaller value is counted as what it frees, and a refusal changes nothing.
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-0", "small"));
  EXPECT_EQ(fleet_->KvBytes(), held - kMiB + 5);
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-63", std::string(kMiB - 16, 'v')));
}

TEST_F(FleetTest, KvBytesOfAllAttemptsAreCapped) {
  FleetOptions options = DefaultOptions();
  options.kv_max_bytes_total = 5 * kMiB / 2;
  StartFleet(options);
  const RunningJob first = StartOneWorkerJob();
  const RunningJob second = StartOneWorkerJob();
  ASSERT_NE(first.job.id, second.job.id);
  Fill(*fleet_, first.worker_id, first.job.id, 1, 2, kMiB);
  const absl::Status over =
      fleet_->KvSet(second.worker_id, second.job.id, 1, "key", std::string(kMiB, 'v'));
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("kv_max_bytes_total"));
  // The first attempt ends: its bytes are free for the others.
  ASSERT_OK(fleet_->Cancel(first.job.id, "done").status());
  EXPECT_OK(fleet_->KvSet(second.worker_id, second.job.id, 1, "key", std::string(kMiB, 'v')));
}

// However an attempt ends, its rendezvous is freed with it.
TEST_F(FleetTest, KvIsFreedWhenTheAttemptEndsHoweverItEnds) {
  StartFleet();
  const std::string worker_id = Register();
  const std::pair<v1::AttemptOutcome, const char*> ends[] = {
      {v1::ATTEMPT_OUTCOME_SUCCEEDED, "succeeded"},
      {v1::ATTEMPT_OUTCOME_FAILED, "failed"},
      {v1::ATTEMPT_OUTCOME_UNSPECIFIED, "cancelled"},
      // Last: the worker that stopped its rank is draining, and takes no more work.
      {v1::ATTEMPT_OUTCOME_STOPPED, "stopped by its worker"}};
  for (const auto& [outcome, how] : ends) {
    SCOPED_TRACE(how);
    const JobRecord job = Submit(1, /*max_restarts=*/0);
    const v1::Assignment assignment = AwaitAssignment(worker_id);
    ASSERT_EQ(assignment.job_id(), job.id);
    ASSERT_OK(Heartbeat(worker_id, {assignment}).status());
    Fill(*fleet_, worker_id, job.id, assignment.attempt(), 8, 64 << 10);
    EXPECT_GT(fleet_->KvBytes(), 8 * (64 << 10));
    if (outcome == v1::ATTEMPT_OUTCOME_UNSPECIFIED) {
      ASSERT_OK(fleet_->Cancel(job.id, "test").status());
    } else if (outcome == v1::ATTEMPT_OUTCOME_SUCCEEDED) {
      ASSERT_OK(FinishRank(*fleet_, worker_id, assignment));
    } else {
      v1::ReportAttemptEndRequest end = EndReport(worker_id, assignment, outcome, 20, how);
      // A worker that stops its rank on its own is shutting down: the job must not come back to
      // it (as it could, before the heartbeat below, were it not draining).
      end.set_worker_draining(outcome == v1::ATTEMPT_OUTCOME_STOPPED);
      ASSERT_OK(fleet_->ReportAttemptEnd(end));
    }
    EXPECT_EQ(fleet_->KvBytes(), 0);
    // A heartbeat listing no rank frees a worker told to stop.
    ASSERT_TRUE(WaitUntil([&] {
      return Heartbeat(worker_id).ok() && WorkerStateOf(worker_id) != v1::WORKER_STATE_BUSY;
    }));
  }
}

TEST_F(FleetTest, KvIsFreedWhenTheAttemptsWorkerIsLost) {
  FleetOptions options = DefaultOptions();
  options.heartbeat_interval = absl::Milliseconds(50);
  options.heartbeat_timeout = absl::Milliseconds(500);
  options.reconcile_grace = absl::Milliseconds(500);
  StartFleet(options);
  const RunningJob running = StartOneWorkerJob();
  Fill(*fleet_, running.worker_id, running.job.id, 1, 4, kMiB);
  EXPECT_GT(fleet_->KvBytes(), 4 * kMiB);
  // No heartbeats: the worker is declared lost and its attempt fails.
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(running.worker_id) == v1::WORKER_STATE_LOST; }));
  EXPECT_EQ(fleet_->KvBytes(), 0);
}

}  // namespace
}  // namespace moetrain::server
