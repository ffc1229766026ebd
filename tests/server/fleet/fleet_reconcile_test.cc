// The fleet after a coordinator restart, on a real store: the fleet is stopped and destroyed and
// a new one created over the same store file, as a coordinator process that exits and starts
// again. Workers that report their ranks keep their attempts; attempts nobody reports are
// restarted when the grace period ends, without counting; nothing is scheduled meanwhile, and the
// grace period ends early once everyone is back.
#include <string>
#include <vector>

#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FleetReconcileTest : public FleetTest {
 protected:
  void RestartFleet(const FleetOptions& options) {
    StopFleet();
    StartFleet(options);
  }

  // The reason of the job's last state change.
  std::string LastReason(const std::string& job_id, JobState to) {
    std::string reason;
    for (const EventRecord& event : Events(job_id)) {
      if (event.kind != kStateChangeEventKind) continue;
      absl::StatusOr<StateChange> change = DecodeStateChange(event.payload);
      if (change.ok() && change->to == to) reason = change->reason;
    }
    return reason;
  }
};

TEST_F(FleetReconcileTest, RankReportedAfterARestartKeepsItsAttemptAndGraceEndsEarly) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& worker = running.worker_id;
  const std::string idle = Register("idle");
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_OK(fleet_->ReportStep(StepReport(worker, running.assignment, step)));
  }

  // A grace period far longer than the test: only an early end lets anything be scheduled.
  FleetOptions options = DefaultOptions();
  options.reconcile_grace = absl::Minutes(10);
  RestartFleet(options);

  absl::StatusOr<v1::HeartbeatResponse> heartbeat = Heartbeat(worker, {running.assignment});
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_EQ(heartbeat->cancel_size(), 0) << "its rank is still its own";
  ASSERT_OK(Heartbeat(idle).status());
  JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.attempt, 1);
  EXPECT_EQ(job.restarts, 0);
  EXPECT_EQ(InfoOf(worker).state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(InfoOf(worker).current_attempt(), 1);

  // The worker retries a step report the old coordinator had recorded (a repeat, refused as
  // such), then goes on.
  const absl::Status repeat = fleet_->ReportStep(StepReport(worker, running.assignment, 3));
  EXPECT_TRUE(absl::IsAlreadyExists(repeat)) << repeat;
  ASSERT_OK(fleet_->ReportStep(StepReport(worker, running.assignment, 4)));
  EXPECT_THAT(RecordedSteps(running.job.id), ElementsAre(1, 2, 3, 4));
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(worker, running.assignment, 4)));
  EXPECT_EQ(GetJob(running.job.id).latest_checkpoint_step, 4);
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(worker);
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment()) << "a running rank is not delivered again";

  // Every reloaded worker and rank is back: scheduling resumes well before the grace would end.
  const JobRecord late = Submit(1, 3, "late");
  const v1::Assignment assignment = AwaitAssignment(idle);
  EXPECT_EQ(assignment.job_id(), late.id);
  EXPECT_EQ(assignment.attempt(), 1);

  job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.attempt, 1);
  EXPECT_EQ(Attempts(running.job.id).size(), 1u);
  ASSERT_OK(FinishRank(*fleet_, worker, running.assignment));
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kSucceeded);
}

TEST_F(FleetReconcileTest, NothingIsScheduledDuringTheGraceAndAnUnreportedAttemptRestartsFree) {
  StartFleet();
  // No restarts allowed: a counted restart would fail the job instead.
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/0);
  const std::string& silent = running.worker_id;
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(silent, running.assignment, 2)));
  const std::string idle = Register("idle");

  FleetOptions options = DefaultOptions();
  options.reconcile_grace = absl::Seconds(3);
  RestartFleet(options);

  // Only the idle worker comes back; the silent one keeps the grace period going.
  ASSERT_OK(Heartbeat(idle).status());
  const JobRecord late = Submit(1, 0, "late");
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(idle, absl::Milliseconds(300));
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment()) << "scheduled during the grace period";
  EXPECT_EQ(GetJob(late.id).state, JobState::kPending);
  // The unreported attempt is restarted when the grace ends: it still runs, so the empty poll
  // above was inside the grace period (if this fails, the machine took seconds for one poll).
  ASSERT_EQ(GetJob(running.job.id).state, JobState::kRunning);

  // The grace ends: the attempt restarts from its checkpoint, ahead of the later job.
  const v1::Assignment next = AwaitAssignment(idle);
  EXPECT_EQ(next.job_id(), running.job.id);
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(next.resume_checkpoint(), CheckpointPath(running.assignment, 2));
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.restarts, 0);
  EXPECT_THAT(LastReason(running.job.id, JobState::kRestarting),
              HasSubstr("did not report within"));
  const std::vector<AttemptRecord> attempts = Attempts(running.job.id);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].outcome, "stopped");
  EXPECT_EQ(GetJob(late.id).state, JobState::kPending) << "its only worker is busy";

  // The silent worker comes back late (a reloaded worker has the grace to reconnect): its old
  // rank is told to stop, and once it no longer runs the worker is free.
  absl::StatusOr<v1::HeartbeatResponse> heartbeat = Heartbeat(silent, {running.assignment});
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  ASSERT_EQ(heartbeat->cancel_size(), 1);
  EXPECT_EQ(heartbeat->cancel(0).job_id(), running.job.id);
  EXPECT_EQ(heartbeat->cancel(0).attempt(), 1);
  EXPECT_EQ(WorkerStateOf(silent), v1::WORKER_STATE_BUSY);
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(silent, running.assignment, v1::ATTEMPT_OUTCOME_CANCELLED, 2)));
  const v1::Assignment later = AwaitAssignment(silent);
  EXPECT_EQ(later.job_id(), late.id);
}

// A restart with known workers but no attempt in flight: once every known worker is back,
// reconciliation ends and scheduling goes on, long before the grace period is over.
TEST_F(FleetReconcileTest, RestartWithNothingInFlightSchedulesOnceEveryWorkerIsBack) {
  StartFleet();
  const std::string worker = Register();
  FleetOptions options = DefaultOptions();
  options.reconcile_grace = absl::Minutes(10);
  RestartFleet(options);
  // The only known worker is back and no attempt was in flight: nothing is left to wait for.
  ASSERT_OK(Heartbeat(worker).status());
  const JobRecord job = Submit();
  EXPECT_EQ(AwaitAssignment(worker).job_id(), job.id);
}

}  // namespace
}  // namespace moetrain::server
