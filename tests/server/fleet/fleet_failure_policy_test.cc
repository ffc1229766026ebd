// How the fleet treats failed attempts, waiting jobs and step reports: a failure no restart can fix
// fails the job at once; one that a retry may fix restarts after a backoff that doubles, is kept in
// the store and outlives a coordinator restart; a waiting job's row says why it waits; a step
// report outside the job's steps, or not after the attempt's last one, is refused.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::ReportAttemptEndRequest Failed(const std::string& worker_id, const v1::Assignment& assignment,
                                   v1::FailureKind kind, const std::string& message) {
  v1::ReportAttemptEndRequest request =
      EndReport(worker_id, assignment, v1::ATTEMPT_OUTCOME_FAILED, 0, message);
  request.set_failure_kind(kind);
  return request;
}

class FleetFailurePolicyTest : public FleetTest {
 protected:
  // Backoffs long enough to see that nothing starts before they end, short enough for a test.
  FleetOptions BackoffOptions(absl::Duration initial, absl::Duration max) const {
    FleetOptions options = DefaultOptions();
    options.restart_backoff_initial = initial;
    options.restart_backoff_max = max;
    return options;
  }

  // Fails the running attempt (transiently) and checks the backoff the job got: its next attempt
  // is due `backoff` after the failure. Returns when that attempt is due.
  absl::Time FailAndCheckBackoff(const std::string& worker_id, const v1::Assignment& assignment,
                                 v1::FailureKind kind, absl::Duration backoff,
                                 int expected_restarts) {
    const absl::Time before = absl::Now();
    EXPECT_TRUE(fleet_->ReportAttemptEnd(Failed(worker_id, assignment, kind, "lost a peer")).ok());
    const absl::Time after = absl::Now();
    const JobRecord job = GetJob(assignment.job_id());
    EXPECT_EQ(job.state, JobState::kRestarting);
    EXPECT_EQ(job.restarts, expected_restarts);
    EXPECT_THAT(job.state_reason, HasSubstr(absl::StrCat("restart ", expected_restarts, " of 3 in ",
                                                         absl::FormatDuration(backoff))));
    if (!job.next_attempt_at.has_value()) {
      ADD_FAILURE() << "no next_attempt_at after a failed attempt";
      return after;
    }
    EXPECT_GE(*job.next_attempt_at, before + backoff);
    EXPECT_LE(*job.next_attempt_at, after + backoff);
    return *job.next_attempt_at;
  }
};

TEST_F(FleetFailurePolicyTest, PermanentFailureFailsTheJobAtOnceWithoutRestarting) {
  StartFleet();
  RunningJob running = StartOneWorkerJob(/*max_restarts=*/3);
  const std::string error =
      "data.path tokens.u16: token 300 at byte offset 40 is >= model.vocab_size = 256";
  ASSERT_OK(fleet_->ReportAttemptEnd(
      Failed(running.worker_id, running.assignment, v1::FAILURE_KIND_PERMANENT, error)));

  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.restarts, 0);
  EXPECT_THAT(job.state_reason, HasSubstr(error));
  EXPECT_THAT(job.state_reason, HasSubstr("not restarted"));
  EXPECT_FALSE(job.next_attempt_at.has_value());
  EXPECT_EQ(Attempts(running.job.id).size(), 1u);
  // The worker is free, and nothing is handed to it again.
  EXPECT_TRUE(WaitUntil([&] { return WorkerStateOf(running.worker_id) == v1::WORKER_STATE_IDLE; }));
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(running.worker_id, absl::Milliseconds(300));
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment()) << poll->DebugString();
}

TEST_F(FleetFailurePolicyTest, TransientFailuresRestartAfterABackoffThatDoublesUpToItsCap) {
  StartFleet(BackoffOptions(absl::Seconds(1), absl::Milliseconds(1500)));
  RunningJob running = StartOneWorkerJob(/*max_restarts=*/3);
  v1::Assignment assignment = running.assignment;
  // 1 s, then 2 s capped at 1.5 s, then 1.5 s. A report without a kind (an older worker) counts
  // as transient.
  const std::vector<std::pair<v1::FailureKind, absl::Duration>> failures = {
      {v1::FAILURE_KIND_TRANSIENT, absl::Seconds(1)},
      {v1::FAILURE_KIND_UNSPECIFIED, absl::Milliseconds(1500)},
      {v1::FAILURE_KIND_TRANSIENT, absl::Milliseconds(1500)}};
  for (size_t i = 0; i < failures.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("failure ", i + 1));
    const absl::Time due = FailAndCheckBackoff(running.worker_id, assignment, failures[i].first,
                                               failures[i].second, static_cast<int>(i) + 1);
    // Waiting out the backoff is a reason to wait, shown in the job.
    EXPECT_TRUE(WaitUntil([&] {
      return absl::StrContains(GetJob(running.job.id).waiting_reason, "backoff");
    })) << GetJob(running.job.id).waiting_reason;
    assignment = AwaitAssignment(running.worker_id);
    EXPECT_GE(absl::Now(), due) << "the next attempt started before its backoff ended";
    EXPECT_EQ(assignment.attempt(), static_cast<int64_t>(i) + 2);
    ASSERT_OK(Heartbeat(running.worker_id, {assignment}).status());
    ASSERT_TRUE(WaitForState(running.job.id, JobState::kRunning));
    const JobRecord job = GetJob(running.job.id);
    EXPECT_FALSE(job.next_attempt_at.has_value());
    EXPECT_EQ(job.waiting_reason, "");
  }
  // No restarts left: the fourth failure ends the job.
  ASSERT_OK(fleet_->ReportAttemptEnd(
      Failed(running.worker_id, assignment, v1::FAILURE_KIND_TRANSIENT, "lost a peer")));
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.state_reason, HasSubstr("no restarts left"));
}

TEST_F(FleetFailurePolicyTest, StoppedAttemptRestartsAtOnceWithoutBackoff) {
  StartFleet(BackoffOptions(absl::Minutes(5), absl::Minutes(5)));
  RunningJob running = StartOneWorkerJob();
  v1::ReportAttemptEndRequest stopped =
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_STOPPED, 3);
  stopped.set_worker_draining(true);  // its worker got SIGTERM
  ASSERT_OK(fleet_->ReportAttemptEnd(stopped));
  EXPECT_FALSE(GetJob(running.job.id).next_attempt_at.has_value());
  // Well within the 5 minutes a counted restart would wait; on another worker, as the stopping
  // one is draining.
  const v1::Assignment next = AwaitAssignment(Register("other"));
  EXPECT_EQ(next.attempt(), 2);
}

TEST_F(FleetFailurePolicyTest, BackoffOutlivesACoordinatorRestart) {
  const FleetOptions options = BackoffOptions(absl::Seconds(3), absl::Seconds(3));
  StartFleet(options);
  RunningJob running = StartOneWorkerJob();
  const absl::Time due = FailAndCheckBackoff(running.worker_id, running.assignment,
                                             v1::FAILURE_KIND_TRANSIENT, absl::Seconds(3), 1);
  StopFleet();
  StartFleet(options);
  EXPECT_EQ(GetJob(running.job.id).next_attempt_at, due);
  // The worker reports back (ending the reconciliation) and polls: nothing before the backoff.
  ASSERT_OK(Heartbeat(running.worker_id).status());
  const v1::Assignment next = AwaitAssignment(running.worker_id);
  EXPECT_GE(absl::Now(), due) << "the restarted coordinator forgot the backoff";
  EXPECT_EQ(next.attempt(), 2);
}

TEST_F(FleetFailurePolicyTest, WaitingJobRecordsWhyUntilItIsScheduled) {
  StartFleet();
  const std::string first = Register("first");
  const JobRecord gang = Submit(/*workers=*/4);
  EXPECT_TRUE(WaitUntil([&] {
    return GetJob(gang.id).waiting_reason == "needs 4 CPU workers, 1 registered";
  })) << GetJob(gang.id).waiting_reason;
  // The history says it once, as before (written just before the row).
  EXPECT_THAT(LogLines(gang.id), ElementsAre("waiting: needs 4 CPU workers, 1 registered"));

  // The reason follows the fleet: a one-worker job takes `first`; a second one waits for it.
  const JobRecord small = Submit(/*workers=*/1, 3, "small");
  const v1::Assignment assignment = AwaitAssignment(first);
  EXPECT_EQ(assignment.job_id(), small.id);
  const JobRecord behind = Submit(/*workers=*/1, 3, "behind");
  EXPECT_TRUE(WaitUntil([&] {
    return GetJob(behind.id).waiting_reason == "waiting for 1 CPU worker to be free, 1 registered";
  })) << GetJob(behind.id).waiting_reason;
  EXPECT_EQ(GetJob(small.id).waiting_reason, "");

  // A restarted coordinator shows the same reasons (they are in the store).
  StopFleet();
  EXPECT_EQ(GetJob(gang.id).waiting_reason, "needs 4 CPU workers, 1 registered");
  StartFleet();
  ASSERT_OK(Heartbeat(first, {assignment}).status());

  // Enough workers (one may go to "behind" first): the gang is scheduled, and its reason is gone.
  for (const char* name : {"second", "third", "fourth", "fifth", "sixth"}) Register(name);
  ASSERT_TRUE(WaitUntil([&] { return GetJob(gang.id).state == JobState::kScheduled; }));
  EXPECT_EQ(GetJob(gang.id).waiting_reason, "");
  // The restart did not say it again (the fleet's growth in between may have said more).
  EXPECT_THAT(LogLines(gang.id), Contains("waiting: needs 4 CPU workers, 1 registered").Times(1));
}

TEST_F(FleetFailurePolicyTest, StepReportOutsideTheJobsStepsIsRefused) {
  StartFleet();
  RunningJob running = StartOneWorkerJob();  // train.steps = 20
  for (int64_t step : {int64_t{0}, int64_t{-1}, int64_t{21}, int64_t{1000000000000000000}}) {
    SCOPED_TRACE(step);
    const absl::Status refused =
        fleet_->ReportStep(StepReport(running.worker_id, running.assignment, step));
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("metrics.step = ", step)));
    EXPECT_THAT(refused.message(), HasSubstr("train.steps = 20"));
  }
  // The real reports that follow still count.
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 1)));
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 20)));
  EXPECT_THAT(RecordedSteps(running.job.id), ElementsAre(1, 20));
}

TEST_F(FleetFailurePolicyTest, StepReportNotAfterTheAttemptsLastIsRefused) {
  StartFleet();
  RunningJob running = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 5)));
  for (int64_t step : {5, 4}) {
    SCOPED_TRACE(step);
    const absl::Status refused =
        fleet_->ReportStep(StepReport(running.worker_id, running.assignment, step));
    EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("metrics.step = ", step)));
  }
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 6)));
  EXPECT_THAT(RecordedSteps(running.job.id), ElementsAre(5, 6));
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kRunning);

  // Within an attempt: the next one resumes from its checkpoint and counts again from there.
  v1::ReportAttemptEndRequest stopped =
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_STOPPED, 6);
  stopped.set_worker_draining(true);
  ASSERT_OK(fleet_->ReportAttemptEnd(stopped));
  const std::string other = Register("other");  // the stopping worker is draining
  const v1::Assignment next = AwaitAssignment(other);
  ASSERT_OK(fleet_->ReportStep(StepReport(other, next, 3)));
  EXPECT_THAT(RecordedSteps(running.job.id), ElementsAre(5, 6, 3));
}

TEST_F(FleetFailurePolicyTest, OtherRanksStepsAreCheckedForRangeOnly) {
  StartFleet();
  RunningGang gang = StartTwoWorkerJob();
  const absl::Status refused =
      fleet_->ReportStep(StepReport(gang.workers[1], gang.assignments[1], 21));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  // Rank 1 only shows it is alive: a repeat is harmless, and no step of its is recorded.
  ASSERT_OK(fleet_->ReportStep(StepReport(gang.workers[1], gang.assignments[1], 4)));
  ASSERT_OK(fleet_->ReportStep(StepReport(gang.workers[1], gang.assignments[1], 4)));
  EXPECT_THAT(RecordedSteps(gang.job.id), IsEmpty());
}

}  // namespace
}  // namespace moetrain::server
