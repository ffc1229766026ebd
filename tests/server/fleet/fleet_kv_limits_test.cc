// The bounds of the rendezvous on a real store and coordinator: keys and bytes per rank (for a
// worker, by the ranks it runs; for an attempt, by its world size), per attempt whatever its size,
// bytes of all attempts together, and the release of an attempt's keys however the attempt ends.
#include <string>

#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

// Sets `count` keys of `value_bytes` each, named `prefix`0, `prefix`1...; the bytes they hold
// (keys and values).
int64_t Fill(Fleet& fleet, const std::string& worker_id, const std::string& job_id, int64_t attempt,
             int count, size_t value_bytes, const std::string& prefix = "key-") {
  int64_t bytes = 0;
  for (int i = 0; i < count; ++i) {
    const std::string key = absl::StrCat(prefix, i);
    const absl::Status set =
        fleet.KvSet(worker_id, job_id, attempt, key, std::string(value_bytes, 'v'));
    EXPECT_TRUE(set.ok()) << key << ": " << set;
    bytes += static_cast<int64_t>(key.size() + value_bytes);
  }
  return bytes;
}

TEST_F(FleetTest, KvKeysAreCappedAt64PerRankOfAWorker) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  Fill(*fleet_, running.worker_id, job, 1, 64, 1);
  const absl::Status over = fleet_->KvSet(running.worker_id, job, 1, "key-64", "v");
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr(absl::StrCat("worker ", running.worker_id, " holds 64")));
  EXPECT_THAT(over.message(), HasSubstr("kv_max_keys_per_rank"));
  // A key already there may still be overwritten, and the peer has its own allowance.
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-7", "new"));
  Fill(*fleet_, running.peer_id, job, 1, 64, 1, "peer-");
}

TEST_F(FleetTest, KvKeysPerAttemptAreCappedAt1024WhateverItsWorld) {
  FleetOptions options = DefaultOptions();
  options.kv_max_keys_per_rank = 1000;  // two ranks: 2,000 by the ranks, 1,024 in all
  StartFleet(options);
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  Fill(*fleet_, running.worker_id, job, 1, 1000, 1);
  Fill(*fleet_, running.peer_id, job, 1, 24, 1, "peer-");
  const absl::Status over = fleet_->KvSet(running.peer_id, job, 1, "peer-24", "v");
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("holds 1024 keys"));
  EXPECT_THAT(over.message(), HasSubstr("kv_max_keys_per_attempt"));
}

// A worker holds at most 2 MiB of keys and values per rank it runs: two values of 1 MiB and their
// keys do not fit one rank's allowance, and what one worker cannot take stays for the others.
TEST_F(FleetTest, KvBytesAreCappedAt2MiBPerRankOfAWorker) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  const std::string mib(kMiB, 'v');
  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-0", mib));
  const absl::Status over = fleet_->KvSet(running.worker_id, job, 1, "key-1", mib);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("more than the 2097152 a worker of 1 rank(s) may hold"));
  EXPECT_THAT(over.message(), HasSubstr("kv_max_bytes_per_rank"));
  EXPECT_OK(fleet_->KvSet(running.peer_id, job, 1, "peer-0", mib));
  // Overwriting with a smaller value frees what it held.
  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-0", "small"));
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-1", mib));
}

// However many ranks, an attempt holds at most 64 MiB.
TEST_F(FleetTest, KvBytesPerAttemptAreCappedAt64MiB) {
  FleetOptions options = DefaultOptions();
  options.kv_max_bytes_per_rank = 48 * kMiB;  // two ranks: 96 MiB by the ranks, 64 MiB in all
  StartFleet(options);
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  const std::string mib(kMiB, 'v');
  Fill(*fleet_, running.worker_id, job, 1, 40, kMiB);
  int stored = 0;
  absl::Status status;
  for (; stored < 48; ++stored) {
    status = fleet_->KvSet(running.peer_id, job, 1, absl::StrCat("peer-", stored), mib);
    if (!status.ok()) break;
  }
  // 63 values and their keys fit in 64 MiB; the 64th value's key is too many bytes.
  EXPECT_EQ(stored, 23);
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("more than the 67108864 an attempt of 2 ranks may hold"));
  EXPECT_THAT(status.message(), HasSubstr("kv_max_bytes_per_attempt"));
  const int64_t held = fleet_->KvBytes();
  EXPECT_LE(held, 64 * kMiB);
  EXPECT_GT(held, 63 * kMiB);
  // Overwriting with a smaller value is counted as what it frees, and a refusal changes nothing.
  EXPECT_OK(fleet_->KvSet(running.worker_id, job, 1, "key-0", "small"));
  EXPECT_EQ(fleet_->KvBytes(), held - kMiB + 5);
  EXPECT_OK(fleet_->KvSet(running.peer_id, job, 1, "peer-23", std::string(kMiB - 16, 'v')));
}

TEST_F(FleetTest, KvBytesOfAllAttemptsAreCapped) {
  FleetOptions options = DefaultOptions();
  options.kv_max_bytes_total = 5 * kMiB / 2;
  StartFleet(options);
  const RendezvousJob first = StartRendezvousJob();
  const RendezvousJob second = StartRendezvousJob();
  ASSERT_NE(first.job.id, second.job.id);
  Fill(*fleet_, first.worker_id, first.job.id, 1, 1, kMiB);
  Fill(*fleet_, first.peer_id, first.job.id, 1, 1, kMiB, "peer-");
  const absl::Status over =
      fleet_->KvSet(second.worker_id, second.job.id, 1, "key", std::string(kMiB, 'v'));
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_THAT(over.message(), HasSubstr("kv_max_bytes_total"));
  // The first attempt ends: its bytes are free for the others.
  ASSERT_OK(fleet_->Cancel(first.job.id, "done").status());
  EXPECT_OK(fleet_->KvSet(second.worker_id, second.job.id, 1, "key", std::string(kMiB, 'v')));
}

// The attack of four one-rank attempts that filled the coordinator's 256 MiB: one-rank attempts
// hold nothing, and a gang's workers hold their ranks' allowance, so the gangs that follow meet.
TEST_F(FleetTest, NoAttemptCanTakeTheRendezvousFromTheOthers) {
  FleetOptions options = DefaultOptions();
  options.kv_max_bytes_total = 8 * kMiB;
  StartFleet(options);
  const RunningJob alone = StartOneWorkerJob();
  EXPECT_FALSE(fleet_->KvSet(alone.worker_id, alone.job.id, 1, "key", std::string(kMiB, 'v')).ok());
  const RendezvousJob greedy = StartRendezvousJob();
  int stored = 0;
  for (; stored < 8; ++stored) {
    const absl::Status set = fleet_->KvSet(greedy.worker_id, greedy.job.id, 1,
                                           absl::StrCat("key-", stored), std::string(kMiB, 'v'));
    if (!set.ok()) break;
  }
  EXPECT_EQ(stored, 1);  // one rank's 2 MiB: one value of 1 MiB and its key, not two
  const RendezvousJob next = StartRendezvousJob();
  EXPECT_OK(fleet_->KvSet(next.worker_id, next.job.id, 1, "key", std::string(kMiB, 'v')));
  EXPECT_OK(fleet_->KvSet(next.peer_id, next.job.id, 1, "peer", std::string(kMiB, 'v')));
}

// However an attempt ends, its rendezvous is freed with it.
TEST_F(FleetTest, KvIsFreedWhenTheAttemptEndsHoweverItEnds) {
  StartFleet();
  const std::string first = Register("first"), second = Register("second");
  const std::pair<v1::AttemptOutcome, const char*> ends[] = {
      {v1::ATTEMPT_OUTCOME_SUCCEEDED, "succeeded"},
      {v1::ATTEMPT_OUTCOME_FAILED, "failed"},
      {v1::ATTEMPT_OUTCOME_UNSPECIFIED, "cancelled"},
      // Last: the worker that stopped its rank is draining, and takes no more work.
      {v1::ATTEMPT_OUTCOME_STOPPED, "stopped by its worker"}};
  for (const auto& [outcome, how] : ends) {
    SCOPED_TRACE(how);
    const JobRecord job = Submit(2, /*max_restarts=*/0);
    const v1::Assignment a = AwaitAssignment(first), b = AwaitAssignment(second);
    ASSERT_EQ(a.job_id(), job.id);
    ASSERT_EQ(b.job_id(), job.id);
    ASSERT_OK(Heartbeat(first, {a}).status());
    ASSERT_OK(Heartbeat(second, {b}).status());
    Fill(*fleet_, first, job.id, a.attempt(), 8, 64 << 10);
    EXPECT_GT(fleet_->KvBytes(), 8 * (64 << 10));
    if (outcome == v1::ATTEMPT_OUTCOME_UNSPECIFIED) {
      ASSERT_OK(fleet_->Cancel(job.id, "test").status());
    } else if (outcome == v1::ATTEMPT_OUTCOME_SUCCEEDED) {
      // Success needs both ranks, each with the final checkpoint recorded.
      ASSERT_OK(FinishRank(*fleet_, first, a));
      EXPECT_GT(fleet_->KvBytes(), 0);
      ASSERT_OK(FinishRank(*fleet_, second, b));
    } else {
      v1::ReportAttemptEndRequest end = EndReport(first, a, outcome, 20, how);
      // A worker that stops its rank on its own is shutting down: the job must not come back to
      // it (as it could, before the heartbeat below, were it not draining).
      end.set_worker_draining(outcome == v1::ATTEMPT_OUTCOME_STOPPED);
      ASSERT_OK(fleet_->ReportAttemptEnd(end));
    }
    EXPECT_EQ(fleet_->KvBytes(), 0);
    // A heartbeat listing no rank frees a worker told to stop.
    for (const std::string& worker : {first, second}) {
      ASSERT_TRUE(WaitUntil([&] {
        return Heartbeat(worker).ok() && WorkerStateOf(worker) != v1::WORKER_STATE_BUSY;
      }));
    }
  }
}

TEST_F(FleetTest, KvIsFreedWhenTheAttemptsWorkerIsLost) {
  FleetOptions options = DefaultOptions();
  options.heartbeat_interval = absl::Milliseconds(50);
  options.heartbeat_timeout = absl::Milliseconds(500);
  options.reconcile_grace = absl::Milliseconds(500);
  StartFleet(options);
  const RendezvousJob running = StartRendezvousJob();
  Fill(*fleet_, running.worker_id, running.job.id, 1, 1, kMiB);
  EXPECT_GT(fleet_->KvBytes(), kMiB);
  // No heartbeats: the worker is declared lost and its attempt fails.
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(running.worker_id) == v1::WORKER_STATE_LOST; }));
  EXPECT_EQ(fleet_->KvBytes(), 0);
}

}  // namespace
}  // namespace moetrain::server
