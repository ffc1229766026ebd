// The fleet's per-attempt rendezvous (KvSet, KvGet, KvWait) on a real store and coordinator: it
// serves the current attempt of two ranks or more only, wakes waiters, times out (a wait needs a
// timeout, cut to max_kv_wait), lets a worker wait once per rank, and ends with its attempt.
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxValueBytes = 1 << 20;

TEST_F(FleetTest, KvSetGetAndWaitOnTheCurrentAttempt) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;

  absl::StatusOr<std::optional<std::string>> unset =
      fleet_->KvGet(running.worker_id, job, 1, "nccl-id");
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FALSE(unset->has_value());

  // Values are bytes: NULs and all.
  const std::string value("\x01\x00\xff id", 6);
  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "nccl-id", value));
  absl::StatusOr<std::optional<std::string>> got =
      fleet_->KvGet(running.worker_id, job, 1, "nccl-id");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value_or("<unset>"), value);
  absl::StatusOr<std::string> waited = fleet_->KvWait(running.worker_id, job, 1, "nccl-id",
                                                      absl::Seconds(5), /*is_cancelled=*/nullptr);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, value);

  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "nccl-id", "overwritten"));
  got = fleet_->KvGet(running.worker_id, job, 1, "nccl-id");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value_or("<unset>"), "overwritten");
}

TEST_F(FleetTest, KvWaiterWakesWhenTheKeyIsSetFromAnotherThread) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  absl::Notification started;
  absl::StatusOr<std::string> result = absl::UnknownError("the waiter did not return");
  std::thread waiter([&] {
    started.Notify();
    result =
        fleet_->KvWait(running.worker_id, running.job.id, 1, "master-addr", kPatience, nullptr);
  });
  started.WaitForNotification();
  // Most likely blocked in the wait by now; the outcome is the same if it is not.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_OK(fleet_->KvSet(running.worker_id, running.job.id, 1, "master-addr", "10.0.0.7:29500"));
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, "10.0.0.7:29500");
}

TEST_F(FleetTest, KvWaitForAKeyNobodySetsIsDeadlineExceeded) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  absl::StatusOr<std::string> waited = fleet_->KvWait(running.worker_id, running.job.id, 1,
                                                      "never-set", absl::Milliseconds(50), nullptr);
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited.status())) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("'never-set'"));
}

TEST_F(FleetTest, KvOfAnyOtherAttemptIsFailedPrecondition) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "key", "one"));
  for (int64_t attempt : {0, 2, -1}) {
    const absl::Status set = fleet_->KvSet(running.worker_id, job, attempt, "key", "stale");
    EXPECT_TRUE(absl::IsFailedPrecondition(set)) << attempt << ": " << set;
    EXPECT_THAT(set.message(), HasSubstr(absl::StrCat("attempt ", attempt, " of job ", job)));
    const absl::Status get = fleet_->KvGet(running.worker_id, job, attempt, "key").status();
    EXPECT_TRUE(absl::IsFailedPrecondition(get)) << attempt << ": " << get;
    const absl::Status wait =
        fleet_->KvWait(running.worker_id, job, attempt, "key", absl::Seconds(5), nullptr).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(wait)) << attempt << ": " << wait;
  }
  const absl::Status unknown = fleet_->KvGet(running.worker_id, "job-nosuch", 1, "key").status();
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;

  // The keys live and end with their attempt: the next one starts empty, the old one is fenced.
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_FAILED, 1, "x")));
  EXPECT_TRUE(absl::IsFailedPrecondition(fleet_->KvGet(running.worker_id, job, 1, "key").status()));
  // Rank 1, told to stop, is gone from its worker's next heartbeat: the gang is free again.
  ASSERT_OK(Heartbeat(running.peer_id).status());
  const v1::Assignment next = AwaitAssignment(running.worker_id);
  ASSERT_EQ(next.attempt(), 2);
  absl::StatusOr<std::optional<std::string>> fresh =
      fleet_->KvGet(running.worker_id, job, 2, "key");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->has_value());
}

TEST_F(FleetTest, KvWaiterWhoseAttemptEndsGetsFailedPrecondition) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  absl::Notification started;
  absl::StatusOr<std::string> result = absl::UnknownError("the waiter did not return");
  std::thread waiter([&] {
    started.Notify();
    result = fleet_->KvWait(running.worker_id, running.job.id, 1, "never-set", kPatience, nullptr);
  });
  started.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_FAILED, 1, "x")));
  waiter.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
}

TEST_F(FleetTest, KvRejectsEmptyOrOversizedKeysAndValues) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  const std::string long_key(kMaxKeyBytes + 1, 'k');

  absl::Status status = fleet_->KvSet(running.worker_id, job, 1, "", "v");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("key has 0 bytes"));
  status = fleet_->KvSet(running.worker_id, job, 1, long_key, "v");
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("key has 257 bytes"));
  EXPECT_TRUE(absl::IsInvalidArgument(fleet_->KvGet(running.worker_id, job, 1, long_key).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      fleet_->KvWait(running.worker_id, job, 1, long_key, absl::Seconds(5), nullptr).status()));
  status = fleet_->KvSet(running.worker_id, job, 1, "big", std::string(kMaxValueBytes + 1, 'v'));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("value has 1048577 bytes"));

  // The limits themselves are allowed.
  const std::string longest_key(kMaxKeyBytes, 'k');
  ASSERT_OK(
      fleet_->KvSet(running.worker_id, job, 1, longest_key, std::string(kMaxValueBytes, 'v')));
  absl::StatusOr<std::optional<std::string>> got =
      fleet_->KvGet(running.worker_id, job, 1, longest_key);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->size(), kMaxValueBytes);
}

// A one-rank attempt's rank runs alone (the worker makes no store for it): its rendezvous would
// only take what the gangs need, so every call is refused, saying why.
TEST_F(FleetTest, AnAttemptOfOneRankHasNoRendezvous) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& job = running.job.id;
  const absl::Status set = fleet_->KvSet(running.worker_id, job, 1, "key", "value");
  EXPECT_TRUE(absl::IsFailedPrecondition(set)) << set;
  EXPECT_THAT(set.message(), HasSubstr("world_size is 1"));
  EXPECT_TRUE(absl::IsFailedPrecondition(fleet_->KvGet(running.worker_id, job, 1, "key").status()));
  const absl::Status wait =
      fleet_->KvWait(running.worker_id, job, 1, "key", absl::Seconds(5), nullptr).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(wait)) << wait;
  EXPECT_EQ(fleet_->KvBytes(), 0);
}

// Every wait ends: a KvWait without a timeout is refused, naming the field (`is_cancelled` ends a
// wait that was let in, so that this test cannot hang).
TEST_F(FleetTest, AKvWaitWithoutATimeoutIsInvalidArgument) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  for (absl::Duration timeout : {absl::ZeroDuration(), -absl::Seconds(1)}) {
    const absl::Status status =
        fleet_->KvWait(running.worker_id, running.job.id, 1, "key", timeout, [] { return true; })
            .status();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr("timeout = "));
  }
}

TEST_F(FleetTest, AKvWaitIsCutToMaxKvWait) {
  FleetOptions options = DefaultOptions();
  options.max_kv_wait = absl::Milliseconds(100);
  StartFleet(options);
  const RendezvousJob running = StartRendezvousJob();
  // An hour asked for; the cap ends it (a wait not cut would hold this test past its deadline).
  const absl::StatusOr<std::string> waited =
      fleet_->KvWait(running.worker_id, running.job.id, 1, "never-set", absl::Hours(1), nullptr);
  EXPECT_TRUE(absl::IsDeadlineExceeded(waited.status())) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("was not set within 100ms"));
}

// A worker waits in one KvWait per rank it runs: one more is ResourceExhausted (its rendezvous
// client retries), so that no worker can hold the server's threads; its peer waits as before.
TEST_F(FleetTest, AWorkerHasOneKvWaitPerRankInFlight) {
  StartFleet();
  const RendezvousJob running = StartRendezvousJob();
  const std::string& job = running.job.id;
  absl::Notification started;
  absl::StatusOr<std::string> first = absl::UnknownError("the waiter did not return");
  std::thread waiter([&] {
    started.Notify();
    // Refused while the test's own probe below is the one in flight: retried, as the worker's
    // rendezvous client does.
    do {
      first = fleet_->KvWait(running.worker_id, job, 1, "rank-1-addr", kPatience, nullptr);
    } while (absl::IsResourceExhausted(first.status()));
  });
  started.WaitForNotification();
  // Once the first is in its wait, a second of the same worker is refused at once.
  absl::Status second;
  EXPECT_TRUE(WaitUntil([&] {
    second = fleet_->KvWait(running.worker_id, job, 1, "other", absl::Milliseconds(10), nullptr)
                 .status();
    return absl::IsResourceExhausted(second);
  })) << second;
  EXPECT_THAT(second.message(), HasSubstr("1 KvWait calls in flight already"));
  // The peer's own wait is its own: answered as soon as the key is there.
  ASSERT_OK(fleet_->KvSet(running.worker_id, job, 1, "rank-0-addr", "10.0.0.7:1"));
  absl::StatusOr<std::string> peer =
      fleet_->KvWait(running.peer_id, job, 1, "rank-0-addr", absl::Seconds(5), nullptr);
  EXPECT_TRUE(peer.ok()) << peer.status();
  ASSERT_OK(fleet_->KvSet(running.peer_id, job, 1, "rank-1-addr", "10.0.0.8:1"));
  waiter.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "10.0.0.8:1");
  // The wait has returned: the worker may wait again.
  EXPECT_OK(
      fleet_->KvWait(running.worker_id, job, 1, "rank-1-addr", absl::Seconds(5), nullptr).status());
}

}  // namespace
}  // namespace moetrain::server
