// Issue 31, item 3: a worker's SUCCEEDED was taken without a final checkpoint, so a token
// holder's worker ended another user's job SUCCEEDED at step 10 of 100 with nothing saved. Now
// SUCCEEDED ends a job only at train.steps with the checkpoint of that step on record; otherwise
// the attempt fails (a transient failure: the job restarts from its newest recorded checkpoint)
// and the report is answered FAILED_PRECONDITION. Checkpoint reports past train.steps are
// refused, as step reports are.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;

TEST_F(FleetTest, SucceededBeforeTheLastStepFailsTheAttempt) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/3);
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 10)));
  const absl::Status early = fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_SUCCEEDED, 10));
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  EXPECT_THAT(early.message(), HasSubstr("SUCCEEDED at step 10"));
  EXPECT_THAT(early.message(), HasSubstr("final checkpoint (step 20, train.steps)"));
  EXPECT_THAT(early.message(), HasSubstr("none is recorded"));

  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kRestarting);
  EXPECT_EQ(job.restarts, 1);
  EXPECT_EQ(Attempts(running.job.id)[0].outcome, "failed");
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_IDLE) << "its rank has ended";
}

TEST_F(FleetTest, SucceededAtTheLastStepWithoutItsCheckpointFailsTheJobWithNoRestartsLeft) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/0);
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(running.worker_id, running.assignment, 10)));
  const absl::Status unsaved = fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_SUCCEEDED, 20));
  EXPECT_TRUE(absl::IsFailedPrecondition(unsaved)) << unsaved;
  EXPECT_THAT(unsaved.message(), HasSubstr("the newest recorded is step 10"));
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.state_reason, HasSubstr("is not recorded"));
}

// In a gang, a checkpoint is recorded once every worker reported it: one that says SUCCEEDED
// without having reported it cannot finish the job, whatever the others did.
TEST_F(FleetTest, EveryWorkerOfAGangMustHaveReportedTheFinalCheckpoint) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(FinishRank(*fleet_, gang.workers[0], gang.assignments[0]));
  EXPECT_EQ(GetJob(gang.job.id).state, JobState::kRunning);
  const absl::Status unsaved = fleet_->ReportAttemptEnd(
      EndReport(gang.workers[1], gang.assignments[1], v1::ATTEMPT_OUTCOME_SUCCEEDED, 20));
  EXPECT_TRUE(absl::IsFailedPrecondition(unsaved)) << unsaved;
  EXPECT_THAT(unsaved.message(), HasSubstr("rank 1"));
  EXPECT_EQ(GetJob(gang.job.id).state, JobState::kRestarting);
  EXPECT_FALSE(GetJob(gang.job.id).latest_checkpoint_step.has_value());
}

TEST_F(FleetTest, CheckpointsPastTheLastStepAreRefused) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const absl::Status beyond =
      fleet_->ReportCheckpoint(CheckpointReport(running.worker_id, running.assignment, 21));
  EXPECT_TRUE(absl::IsInvalidArgument(beyond)) << beyond;
  EXPECT_THAT(beyond.message(), HasSubstr("train.steps = 20"));
  EXPECT_FALSE(GetJob(running.job.id).latest_checkpoint_step.has_value());
  EXPECT_TRUE(SavedCheckpoints(running.job.id).empty());
  // Then the real end still succeeds.
  ASSERT_OK(FinishRank(*fleet_, running.worker_id, running.assignment));
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kSucceeded);
}

// An attempt that resumes from the final checkpoint (its predecessor wrote it, then failed before
// its end report) has nothing left to write: the checkpoint on record is enough.
TEST_F(FleetTest, AnAttemptResumedFromTheFinalCheckpointSucceedsWithoutWritingAnother) {
  FleetOptions options = DefaultOptions();
  options.restart_backoff_initial = absl::Milliseconds(1);
  StartFleet(options);
  const RunningJob running = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(running.worker_id, running.assignment, 20)));
  ASSERT_OK(fleet_->ReportAttemptEnd(EndReport(running.worker_id, running.assignment,
                                               v1::ATTEMPT_OUTCOME_FAILED, 20, "lost a file")));
  const v1::Assignment second = AwaitAssignment(running.worker_id);
  ASSERT_EQ(second.attempt(), 2);
  ASSERT_OK(Heartbeat(running.worker_id, {second}).status());
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, second, v1::ATTEMPT_OUTCOME_SUCCEEDED, 20)));
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kSucceeded);
}

}  // namespace
}  // namespace moetrain::server
