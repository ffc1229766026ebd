// How an attempt ends in the fleet, on a real store and coordinator: success of every rank,
// failure with restarts left or not, a stop, a failing rank of a gang, a lost worker, a cancel,
// and a gang that waits for enough workers.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "server/core/fleet.h"
#include "server/core/job_state.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// The job's state changes, in order.
std::vector<StateChange> StateChanges(const std::vector<EventRecord>& events) {
  std::vector<StateChange> changes;
  for (const EventRecord& event : events) {
    if (event.kind != kStateChangeEventKind) continue;
    absl::StatusOr<StateChange> change = DecodeStateChange(event.payload);
    EXPECT_TRUE(change.ok()) << change.status();
    if (change.ok()) changes.push_back(*std::move(change));
  }
  return changes;
}

// The reason of the job's first change from `from` to `to`; empty when there was none.
std::string ReasonOf(const std::vector<EventRecord>& events, JobState from, JobState to) {
  for (const StateChange& change : StateChanges(events)) {
    if (change.from == from && change.to == to) return change.reason;
  }
  return "";
}

std::vector<std::string> CancelledJobs(
    const google::protobuf::RepeatedPtrField<v1::AttemptRef>& refs, int64_t attempt) {
  std::vector<std::string> jobs;
  for (const v1::AttemptRef& ref : refs) {
    EXPECT_EQ(ref.attempt(), attempt);
    jobs.push_back(ref.job_id());
  }
  return jobs;
}

TEST_F(FleetTest, SuccessOfEveryRankSucceedsTheJobAndFreesItsWorkers) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(FinishRank(*fleet_, gang.workers[0], gang.assignments[0]));
  EXPECT_EQ(GetJob(gang.job.id).state, JobState::kRunning) << "rank 1 has not finished yet";
  EXPECT_EQ(WorkerStateOf(gang.workers[0]), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerStateOf(gang.workers[1]), v1::WORKER_STATE_BUSY);

  ASSERT_OK(FinishRank(*fleet_, gang.workers[1], gang.assignments[1]));
  const JobRecord job = GetJob(gang.job.id);
  EXPECT_EQ(job.state, JobState::kSucceeded);
  EXPECT_THAT(job.state_reason, HasSubstr("finished at step 20"));
  EXPECT_EQ(job.restarts, 0);
  EXPECT_EQ(WorkerStateOf(gang.workers[0]), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerStateOf(gang.workers[1]), v1::WORKER_STATE_IDLE);
  const std::vector<AttemptRecord> attempts = Attempts(gang.job.id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].outcome, "succeeded");
}

// A rank that reported SUCCEEDED has ended and its worker is free while the gang's other ranks
// still run: later reports of that rank are refused, not recorded.
TEST_F(FleetTest, ReportsOfARankThatAlreadySucceededAreFailedPrecondition) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(FinishRank(*fleet_, gang.workers[0], gang.assignments[0]));
  ASSERT_EQ(WorkerStateOf(gang.workers[0]), v1::WORKER_STATE_IDLE);

  const absl::Status step =
      fleet_->ReportStep(StepReport(gang.workers[0], gang.assignments[0], 21));
  EXPECT_TRUE(absl::IsFailedPrecondition(step)) << step;
  const absl::Status checkpoint =
      fleet_->ReportCheckpoint(CheckpointReport(gang.workers[0], gang.assignments[0], 20));
  EXPECT_TRUE(absl::IsFailedPrecondition(checkpoint)) << checkpoint;
}

TEST_F(FleetTest, FailedAttemptRestartsFromTheLatestCheckpoint) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/3);
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(running.worker_id, running.assignment, 4)));
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 5)));
  ASSERT_OK(fleet_->ReportAttemptEnd(EndReport(running.worker_id, running.assignment,
                                               v1::ATTEMPT_OUTCOME_FAILED, 5, "out of memory")));
  EXPECT_THAT(ReasonOf(Events(running.job.id), JobState::kRunning, JobState::kRestarting),
              HasSubstr("failed: out of memory"));
  EXPECT_EQ(GetJob(running.job.id).restarts, 1);

  // The worker is free again and takes the next attempt, which resumes from the checkpoint.
  const v1::Assignment next = AwaitAssignment(running.worker_id);
  EXPECT_EQ(next.job_id(), running.job.id);
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(next.rank(), 0);
  EXPECT_EQ(next.resume_checkpoint(), CheckpointPath(running.assignment, 4));
  EXPECT_EQ(next.checkpoint_dir(), running.assignment.checkpoint_dir());
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.attempt, 2);
  EXPECT_EQ(job.restarts, 1);
  const std::vector<AttemptRecord> attempts = Attempts(running.job.id);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(attempts[0].outcome, "failed");
  EXPECT_EQ(attempts[1].outcome, "");
}

TEST_F(FleetTest, FailureWithNoRestartsLeftFailsTheJob) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/0);
  ASSERT_OK(fleet_->ReportAttemptEnd(EndReport(running.worker_id, running.assignment,
                                               v1::ATTEMPT_OUTCOME_FAILED, 3, "loss is NaN")));
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.state_reason, HasSubstr("loss is NaN"));
  EXPECT_THAT(job.state_reason, HasSubstr("restart.max_restarts = 0"));
  EXPECT_EQ(job.restarts, 0);
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_IDLE);
}

TEST_F(FleetTest, FailuresRestartUntilTheRestartsRunOut) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/1);
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_FAILED, 1, "first")));
  const v1::Assignment second = AwaitAssignment(running.worker_id);
  ASSERT_EQ(second.attempt(), 2);
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, second, v1::ATTEMPT_OUTCOME_FAILED, 1, "second")));
  const JobRecord job = GetJob(running.job.id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_THAT(job.state_reason, HasSubstr("restart.max_restarts = 1"));
  EXPECT_EQ(job.restarts, 1);
}

TEST_F(FleetTest, StoppedAttemptRestartsWithoutCountingARestart) {
  StartFleet();
  // No restarts allowed: a stop (the worker's SIGTERM) is not a failure, so the job goes on.
  const RunningJob running = StartOneWorkerJob(/*max_restarts=*/0);
  v1::ReportAttemptEndRequest stopped =
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_STOPPED, 7);
  stopped.set_worker_draining(true);
  ASSERT_OK(fleet_->ReportAttemptEnd(stopped));
  EXPECT_THAT(ReasonOf(Events(running.job.id), JobState::kRunning, JobState::kRestarting),
              HasSubstr("stopped at step 7"));
  // The stopping worker is shutting down: the job goes to another one, never back to it.
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_DRAINING);
  const std::string other = Register("other");
  const v1::Assignment next = AwaitAssignment(other);
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(GetJob(running.job.id).restarts, 0);
  EXPECT_EQ(Attempts(running.job.id)[0].outcome, "stopped");
}

// One worker of a gang gets SIGTERM; the ranks stop together, so every one reports STOPPED, the
// healthy worker's report first. Only the worker that said it is shutting down drains.
TEST_F(FleetTest, OnlyTheShuttingDownWorkerOfAStoppedGangDrains) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob(/*max_restarts=*/0);
  const std::string& healthy = gang.workers[0];
  const std::string& leaving = gang.workers[1];
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(healthy, gang.assignments[0], v1::ATTEMPT_OUTCOME_STOPPED, 5)));
  v1::ReportAttemptEndRequest last =
      EndReport(leaving, gang.assignments[1], v1::ATTEMPT_OUTCOME_STOPPED, 5);
  last.set_worker_draining(true);
  ASSERT_OK(fleet_->ReportAttemptEnd(last));
  EXPECT_EQ(WorkerStateOf(healthy), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerStateOf(leaving), v1::WORKER_STATE_DRAINING);

  // The next attempt runs on the healthy worker and a new one, never on the leaving one.
  const std::string fresh = Register("fresh");
  const v1::Assignment first = AwaitAssignment(healthy);
  const v1::Assignment second = AwaitAssignment(fresh);
  EXPECT_EQ(first.attempt(), 2);
  EXPECT_EQ(second.attempt(), 2);
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(leaving);
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment());
  EXPECT_EQ(WorkerStateOf(leaving), v1::WORKER_STATE_DRAINING);
  EXPECT_EQ(GetJob(gang.job.id).restarts, 0);
}

// An idle worker that gets SIGTERM says so in its last heartbeat: it is given no rank.
TEST_F(FleetTest, DrainingHeartbeatKeepsAnIdleWorkerFromWork) {
  StartFleet();
  const std::string leaving = Register("leaving");
  v1::HeartbeatRequest request;
  request.set_worker_id(leaving);
  request.set_draining(true);
  ASSERT_OK(fleet_->Heartbeat(request).status());
  EXPECT_EQ(WorkerStateOf(leaving), v1::WORKER_STATE_DRAINING);

  const JobRecord job = Submit();
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(leaving, absl::Milliseconds(500));
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment());
  const std::string other = Register("other");
  EXPECT_EQ(AwaitAssignment(other).job_id(), job.id);
  EXPECT_EQ(WorkerStateOf(leaving), v1::WORKER_STATE_DRAINING);
}

TEST_F(FleetTest, OneRankFailingStopsTheOtherRanksOfTheGang) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob(/*max_restarts=*/1);
  const std::string& failing = gang.workers[0];
  const std::string& survivor = gang.workers[1];
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(failing, gang.assignments[0], v1::ATTEMPT_OUTCOME_FAILED, 9, "NCCL timeout")));
  EXPECT_EQ(GetJob(gang.job.id).restarts, 1);

  // The other rank is told to stop on its poll, once, and on every heartbeat that lists it.
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(survivor);
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment());
  EXPECT_THAT(CancelledJobs(poll->cancel(), 1), ElementsAre(gang.job.id));
  absl::StatusOr<v1::HeartbeatResponse> heartbeat = Heartbeat(survivor, {gang.assignments[1]});
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_THAT(CancelledJobs(heartbeat->cancel(), 1), ElementsAre(gang.job.id));

  // Its worker stays busy until the rank has wound down, so the next attempt waits for it.
  EXPECT_EQ(WorkerStateOf(failing), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(WorkerStateOf(survivor), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(InfoOf(survivor).current_attempt(), 1);
  EXPECT_EQ(GetJob(gang.job.id).state, JobState::kRestarting);

  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(survivor, gang.assignments[1], v1::ATTEMPT_OUTCOME_CANCELLED, 9)));
  const v1::Assignment first = AwaitAssignment(failing);
  const v1::Assignment second = AwaitAssignment(survivor);
  EXPECT_EQ(first.attempt(), 2);
  EXPECT_EQ(second.attempt(), 2);
  EXPECT_EQ(first.world_size(), 2);
  EXPECT_THAT((std::vector<int32_t>{first.rank(), second.rank()}), UnorderedElementsAre(0, 1));
  EXPECT_EQ(GetJob(gang.job.id).restarts, 1) << "the cancelled rank counted no restart";
}

TEST_F(FleetTest, SilentWorkerIsDeclaredLostAndItsJobRestarts) {
  FleetOptions options = DefaultOptions();
  options.heartbeat_interval = absl::Milliseconds(100);
  options.heartbeat_timeout = absl::Seconds(1);
  StartFleet(options);
  const std::string silent = Register("silent");
  auto keepalive = std::make_unique<Heartbeater>(fleet_.get(), silent);
  const JobRecord job = Submit();
  const v1::Assignment assignment = AwaitAssignment(silent);
  keepalive->SetRunning({assignment});
  ASSERT_TRUE(WaitForState(job.id, JobState::kRunning));
  keepalive.reset();  // the worker falls silent

  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(silent) == v1::WORKER_STATE_LOST; }));
  EXPECT_TRUE(InfoOf(silent).current_job_id().empty());
  const JobRecord restarting = GetJob(job.id);
  EXPECT_EQ(restarting.state, JobState::kRestarting);
  EXPECT_EQ(restarting.restarts, 1);
  EXPECT_THAT(restarting.state_reason, HasSubstr("sent no heartbeat"));
  EXPECT_EQ(Attempts(job.id)[0].outcome, "failed");

  // Its ranks were given away: it must register again.
  const absl::Status heartbeat = Heartbeat(silent, {assignment}).status();
  EXPECT_TRUE(absl::IsNotFound(heartbeat)) << heartbeat;
  EXPECT_THAT(heartbeat.message(), HasSubstr("lost"));
  EXPECT_TRUE(absl::IsNotFound(Poll(silent).status()));
  EXPECT_TRUE(absl::IsNotFound(fleet_->ReportStep(StepReport(silent, assignment, 1))));

  const std::string rescuer = Register("rescuer");
  Heartbeater rescuer_alive(fleet_.get(), rescuer);
  const v1::Assignment next = AwaitAssignment(rescuer);
  rescuer_alive.SetRunning({next});
  EXPECT_EQ(next.job_id(), job.id);
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(WorkerStateOf(silent), v1::WORKER_STATE_LOST) << "listed until forgotten";
}

TEST_F(FleetTest, CancelEndsTheJobAtOnceAndFreesTheWorkerWhenItsRankEnds) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  absl::StatusOr<JobRecord> cancelled = fleet_->Cancel(running.job.id, "not needed any more");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->state_reason, "not needed any more");
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kCancelled);
  EXPECT_EQ(Attempts(running.job.id)[0].outcome, "cancelled");

  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(running.worker_id);
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment());
  EXPECT_THAT(CancelledJobs(poll->cancel(), 1), ElementsAre(running.job.id));
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_BUSY);
  absl::StatusOr<v1::HeartbeatResponse> heartbeat =
      Heartbeat(running.worker_id, {running.assignment});
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_THAT(CancelledJobs(heartbeat->cancel(), 1), ElementsAre(running.job.id));
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_BUSY) << "its rank still runs";
  EXPECT_TRUE(absl::IsFailedPrecondition(
      fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 1))));

  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(running.worker_id, running.assignment, v1::ATTEMPT_OUTCOME_CANCELLED, 1)));
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(GetJob(running.job.id).state, JobState::kCancelled);

  absl::StatusOr<JobRecord> again = fleet_->Cancel(running.job.id, "");
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(again.status().message(), HasSubstr("final state"));
}

TEST_F(FleetTest, CancelledRankNoLongerListedInHeartbeatsFreesItsWorker) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  ASSERT_OK(fleet_->Cancel(running.job.id, "").status());
  absl::StatusOr<v1::HeartbeatResponse> heartbeat = Heartbeat(running.worker_id);
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_EQ(heartbeat->cancel_size(), 0);
  EXPECT_EQ(WorkerStateOf(running.worker_id), v1::WORKER_STATE_IDLE);
}

TEST_F(FleetTest, CancelOfAnUndeliveredAssignmentFreesTheWorkerAtOnce) {
  StartFleet();
  const std::string worker = Register();
  const JobRecord job = Submit();
  // Scheduled, but the worker never polled: there is no rank to stop.
  ASSERT_TRUE(WaitForState(job.id, JobState::kScheduled));
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(worker) == v1::WORKER_STATE_BUSY; }));
  ASSERT_OK(fleet_->Cancel(job.id, "").status());
  EXPECT_EQ(WorkerStateOf(worker), v1::WORKER_STATE_IDLE);
  absl::StatusOr<v1::GetAssignmentResponse> poll = Poll(worker);
  ASSERT_TRUE(poll.ok()) << poll.status();
  EXPECT_FALSE(poll->has_assignment());
  EXPECT_EQ(poll->cancel_size(), 0);
}

TEST_F(FleetTest, GangWaitsPendingUntilEnoughWorkersRegister) {
  StartFleet();
  const std::string first = Register("first");
  const JobRecord job = Submit(/*workers=*/2);
  ASSERT_TRUE(WaitUntil([&] {
    for (const std::string& line : LogLines(job.id)) {
      if (absl::StrContains(line, "needs 2 CPU workers, 1 registered")) return true;
    }
    return false;
  })) << "no log event says why the job waits";
  EXPECT_EQ(GetJob(job.id).state, JobState::kPending);
  EXPECT_EQ(WorkerStateOf(first), v1::WORKER_STATE_IDLE) << "a gang takes no partial allocation";

  const std::string second = Register("second");
  const v1::Assignment a = AwaitAssignment(first);
  const v1::Assignment b = AwaitAssignment(second);
  EXPECT_EQ(a.job_id(), job.id);
  EXPECT_EQ(b.job_id(), job.id);
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(b.attempt(), 1);
  EXPECT_EQ(a.world_size(), 2);
  EXPECT_EQ(b.world_size(), 2);
  // Ranks follow the worker ids.
  EXPECT_EQ(a.rank(), first < second ? 0 : 1);
  EXPECT_EQ(b.rank(), first < second ? 1 : 0);
  const std::vector<AttemptRecord> attempts = Attempts(job.id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_THAT(attempts[0].workers, Contains(first));
  EXPECT_THAT(attempts[0].workers, Contains(second));
}

}  // namespace
}  // namespace moetrain::server
