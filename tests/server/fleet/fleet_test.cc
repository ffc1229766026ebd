// The fleet's worker calls on a real store and coordinator: registration, assignment delivery and
// redelivery, fencing of reports, step and log reports, and checkpoints. How attempts end, cancel
// and lost workers are in fleet_attempt_test.cc; the rendezvous in fleet_kv_test.cc; restarts of
// the coordinator in fleet_reconcile_test.cc.
#include "server/core/fleet.h"

#include <string>
#include <vector>

#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::RegisterWorkerRequest Registration(const std::string& name) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_version("1.2.3");
  request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
  request.mutable_resources()->set_device_count(1);
  request.mutable_resources()->set_threads(4);
  return request;
}

TEST_F(FleetTest, RegisterRejectsBadResourcesAndNamesTheField) {
  StartFleet();
  v1::RegisterWorkerRequest no_devices = Registration("host-a");
  no_devices.mutable_resources()->set_device_count(0);
  absl::StatusOr<v1::RegisterWorkerResponse> refused = fleet_->Register(no_devices);
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("resources.device_count = 0"));

  v1::RegisterWorkerRequest no_threads = Registration("host-a");
  no_threads.mutable_resources()->set_threads(-2);
  refused = fleet_->Register(no_threads);
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("resources.threads = -2"));

  refused = fleet_->Register(Registration(std::string(257, 'n')));
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("name has 257 bytes"));

  EXPECT_THAT(AllWorkers(), IsEmpty()) << "a refused registration leaves no worker";
}

TEST_F(FleetTest, RegisteredWorkersGetDistinctIdsAndAreListedIdle) {
  StartFleet();
  absl::StatusOr<v1::RegisterWorkerResponse> first =
      fleet_->Register(Registration(std::string(256, 'n')));
  absl::StatusOr<v1::RegisterWorkerResponse> second = fleet_->Register(Registration("host-b"));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(first->worker_id().empty());
  EXPECT_NE(first->worker_id(), second->worker_id());
  EXPECT_EQ(FromProtoDuration(first->heartbeat_interval()), DefaultOptions().heartbeat_interval);
  EXPECT_EQ(FromProtoDuration(first->heartbeat_timeout()), DefaultOptions().heartbeat_timeout);

  const v1::WorkerInfo info = InfoOf(second->worker_id());
  EXPECT_EQ(info.name(), "host-b");
  EXPECT_EQ(info.version(), "1.2.3");
  EXPECT_EQ(info.device(), v1::ResourceConfig::CPU);
  EXPECT_EQ(info.device_count(), 1);
  EXPECT_EQ(info.threads(), 4);
  EXPECT_EQ(info.state(), v1::WORKER_STATE_IDLE);
  EXPECT_TRUE(info.current_job_id().empty());
  EXPECT_EQ(WorkerStateOf(first->worker_id()), v1::WORKER_STATE_IDLE);
}

TEST_F(FleetTest, ACudaJobWaitsForAWorkerWithEnoughGpusAndTheirMemoryIsListed) {
  StartFleet();
  v1::RegisterWorkerRequest negative = Registration("host-neg");
  negative.mutable_resources()->set_device_memory_bytes(-1);
  absl::StatusOr<v1::RegisterWorkerResponse> refused = fleet_->Register(negative);
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("resources.device_memory_bytes = -1"));

  v1::JobSpec spec = TestSpec(1, 0, "on-gpus");
  spec.mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  spec.mutable_resources()->set_devices_per_worker(2);
  // As `moetrain submit` fills it from the plan; below a GiB, the reason says it in MiB.
  spec.mutable_resources()->set_device_memory_bytes(int64_t{600} << 20);
  absl::StatusOr<JobRecord> job = coordinator_->Submit("cuda-1", spec, 0);
  ASSERT_TRUE(job.ok()) << job.status();

  // A CPU worker and a one-GPU worker do not match.
  const std::string cpu = Register("cpu");
  v1::RegisterWorkerRequest one_gpu = Registration("one-gpu");
  one_gpu.mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  one_gpu.mutable_resources()->set_device_count(1);
  one_gpu.mutable_resources()->set_device_memory_bytes(int64_t{80} << 30);
  ASSERT_TRUE(fleet_->Register(one_gpu).ok());
  EXPECT_TRUE(WaitUntil([&] {
    return GetJob(job->id).waiting_reason ==
           "needs 1 CUDA worker with at least 2 devices of 600.0 MiB each, 0 registered";
  })) << GetJob(job->id).waiting_reason;
  EXPECT_EQ(GetJob(job->id).state, JobState::kPending);

  v1::RegisterWorkerRequest two_gpus = Registration("two-gpus");
  two_gpus.mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  two_gpus.mutable_resources()->set_device_count(2);
  two_gpus.mutable_resources()->set_device_memory_bytes(int64_t{141} << 30);
  absl::StatusOr<v1::RegisterWorkerResponse> gpu_worker = fleet_->Register(two_gpus);
  ASSERT_TRUE(gpu_worker.ok()) << gpu_worker.status();
  const v1::WorkerInfo info = InfoOf(gpu_worker->worker_id());
  EXPECT_EQ(info.device(), v1::ResourceConfig::CUDA);
  EXPECT_EQ(info.device_count(), 2);
  EXPECT_EQ(info.device_memory_bytes(), int64_t{141} << 30);
  EXPECT_EQ(InfoOf(cpu).device_memory_bytes(), 0);

  const v1::Assignment assignment = AwaitAssignment(gpu_worker->worker_id());
  EXPECT_EQ(assignment.job_id(), job->id);
  EXPECT_EQ(assignment.spec().resources().device(), v1::ResourceConfig::CUDA);
}

TEST_F(FleetTest, CallsOfAnUnknownWorkerAreNotFound) {
  StartFleet();
  const absl::Status heartbeat = Heartbeat("w-nobody").status();
  EXPECT_TRUE(absl::IsNotFound(heartbeat)) << heartbeat;
  EXPECT_THAT(heartbeat.message(), HasSubstr("w-nobody"));
  const absl::Status poll = Poll("w-nobody").status();
  EXPECT_TRUE(absl::IsNotFound(poll)) << poll;
  EXPECT_THAT(poll.message(), HasSubstr("w-nobody"));
  v1::Assignment assignment;
  assignment.set_job_id("job-nosuch");
  assignment.set_attempt(1);
  const absl::Status end =
      fleet_->ReportAttemptEnd(EndReport("w-nobody", assignment, v1::ATTEMPT_OUTCOME_FAILED, 0));
  EXPECT_TRUE(absl::IsNotFound(end)) << end;
}

TEST_F(FleetTest, SubmittedJobIsAssignedThenRunsOnceItsRankHeartbeats) {
  StartFleet();
  const std::string worker = Register();
  const JobRecord job = Submit(/*workers=*/1);
  EXPECT_EQ(job.state, JobState::kPending);

  const v1::Assignment assignment = AwaitAssignment(worker);
  EXPECT_EQ(assignment.job_id(), job.id);
  EXPECT_EQ(assignment.attempt(), 1);
  EXPECT_EQ(assignment.rank(), 0);
  EXPECT_EQ(assignment.world_size(), 1);
  EXPECT_EQ(assignment.spec().name(), "fleet-test");
  EXPECT_EQ(assignment.spec().train().steps(), 20);
  EXPECT_TRUE(assignment.spec().model().has_hidden_size()) << "the spec comes with its defaults";
  EXPECT_EQ(assignment.checkpoint_dir(), absl::StrCat(dir_, "/checkpoints/", job.id));
  EXPECT_TRUE(assignment.resume_checkpoint().empty());

  JobRecord scheduled = GetJob(job.id);
  EXPECT_EQ(scheduled.state, JobState::kScheduled);
  EXPECT_EQ(scheduled.attempt, 1);
  const std::vector<AttemptRecord> attempts = Attempts(job.id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_THAT(attempts[0].workers, ElementsAre(worker));
  EXPECT_EQ(attempts[0].outcome, "");
  const v1::WorkerInfo busy = InfoOf(worker);
  EXPECT_EQ(busy.state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(busy.current_job_id(), job.id);
  EXPECT_EQ(busy.current_attempt(), 1);

  absl::StatusOr<v1::HeartbeatResponse> heartbeat = Heartbeat(worker, {assignment});
  ASSERT_TRUE(heartbeat.ok()) << heartbeat.status();
  EXPECT_EQ(heartbeat->cancel_size(), 0);
  const JobRecord running = GetJob(job.id);
  EXPECT_EQ(running.state, JobState::kRunning);
  EXPECT_THAT(running.state_reason, HasSubstr("ranks of attempt 1 are running"));
  EXPECT_EQ(WorkerStateOf(worker), v1::WORKER_STATE_BUSY);
}

// checkpoint.dir in the spec is the root of the job's checkpoints as the workers see it ("" means
// the coordinator's --checkpoint-dir).
TEST_F(FleetTest, SpecCheckpointDirIsTheRootOfTheJobsCheckpoints) {
  StartFleet();
  const std::string worker = Register();
  v1::JobSpec spec = TestSpec(1, 3);
  spec.mutable_checkpoint()->set_dir(absl::StrCat(dir_, "/shared"));
  absl::StatusOr<JobRecord> job = coordinator_->Submit("own-dir", spec, 0);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(AwaitAssignment(worker).checkpoint_dir(), absl::StrCat(dir_, "/shared/", job->id));
}

// DefaultOptions' heartbeat_interval of 500 ms: an assignment whose rank has not shown up is sent
// again after 1 s, long after "right away".
TEST_F(FleetTest, AssignmentIsRedeliveredOnlyWhileItsRankHasNotStarted) {
  StartFleet();
  const std::string worker = Register();
  Submit();
  const v1::Assignment assignment = AwaitAssignment(worker);

  absl::StatusOr<v1::GetAssignmentResponse> right_away = Poll(worker);
  ASSERT_TRUE(right_away.ok()) << right_away.status();
  EXPECT_FALSE(right_away->has_assignment()) << "the first delivery is not presumed lost yet";
  EXPECT_EQ(right_away->cancel_size(), 0);

  // The rank never showed up: the first response may have been lost, so it comes again.
  absl::StatusOr<v1::GetAssignmentResponse> again = Poll(worker, absl::Seconds(10));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->has_assignment());
  EXPECT_EQ(again->assignment().SerializeAsString(), assignment.SerializeAsString());

  // Once a heartbeat lists the rank, it is running: no more redelivery, however long the wait.
  ASSERT_OK(Heartbeat(worker, {assignment}).status());
  absl::StatusOr<v1::GetAssignmentResponse> after = Poll(worker, absl::Milliseconds(1500));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->has_assignment());
  EXPECT_EQ(after->cancel_size(), 0);
}

TEST_F(FleetTest, ReportsOfAnotherAttemptOrAnotherWorkersRankAreFailedPrecondition) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  const std::string& worker = gang.workers[0];
  const v1::Assignment& own = gang.assignments[0];
  v1::Assignment other_attempt = own;
  other_attempt.set_attempt(2);

  absl::Status status = fleet_->ReportStep(StepReport(worker, other_attempt, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("attempt 2 of job " + gang.job.id));
  status = fleet_->ReportLog(LogReport(worker, other_attempt, {"stale"}));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  status = fleet_->ReportCheckpoint(CheckpointReport(worker, other_attempt, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  status = fleet_->ReportAttemptEnd(
      EndReport(worker, other_attempt, v1::ATTEMPT_OUTCOME_FAILED, 1, "stale"));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;

  // Rank 1 belongs to the other worker of the gang.
  const v1::Assignment& foreign = gang.assignments[1];
  status = fleet_->ReportStep(StepReport(worker, foreign, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 1 of attempt 1"));
  EXPECT_THAT(status.message(), HasSubstr("not given to worker " + worker));
  status = fleet_->ReportCheckpoint(CheckpointReport(worker, foreign, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  status =
      fleet_->ReportAttemptEnd(EndReport(worker, foreign, v1::ATTEMPT_OUTCOME_FAILED, 1, "no"));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("holds no rank 1"));

  // A rank beyond the world size is nobody's.
  v1::Assignment out_of_range = own;
  out_of_range.set_rank(2);
  status = fleet_->ReportStep(StepReport(worker, out_of_range, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;

  // Nothing of it was recorded, and the attempt goes on.
  EXPECT_THAT(RecordedSteps(gang.job.id), IsEmpty());
  EXPECT_THAT(LogLines(gang.job.id), IsEmpty());
  EXPECT_TRUE(absl::IsNotFound(store_->LatestCheckpoint(gang.job.id).status()));
  const JobRecord job = GetJob(gang.job.id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.attempt, 1);
  EXPECT_EQ(job.restarts, 0);
}

TEST_F(FleetTest, ReportsAfterTheAttemptEndedAreFailedPrecondition) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& worker = running.worker_id;
  const v1::Assignment& assignment = running.assignment;
  ASSERT_OK(fleet_->ReportStep(StepReport(worker, assignment, 1)));
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(worker, assignment, v1::ATTEMPT_OUTCOME_FAILED, 1, "crashed")));

  absl::Status status = fleet_->ReportStep(StepReport(worker, assignment, 2));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("attempt 1 of job " + running.job.id));
  status = fleet_->ReportLog(LogReport(worker, assignment, {"late"}));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  status = fleet_->ReportCheckpoint(CheckpointReport(worker, assignment, 2));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  // The end is sent once per rank; a second one finds nothing to end.
  status = fleet_->ReportAttemptEnd(
      EndReport(worker, assignment, v1::ATTEMPT_OUTCOME_FAILED, 2, "again"));
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;

  EXPECT_THAT(RecordedSteps(running.job.id), ElementsAre(1));
  EXPECT_THAT(LogLines(running.job.id), IsEmpty());
  EXPECT_EQ(GetJob(running.job.id).restarts, 1) << "the repeated end counted no second restart";
}

TEST_F(FleetTest, RepeatedStepReportsAreRecordedOnceAndOnlyRankZeroSpeaks) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  const std::string& rank0 = gang.workers[0];
  const std::string& rank1 = gang.workers[1];
  ASSERT_OK(fleet_->ReportStep(StepReport(rank0, gang.assignments[0], 1)));
  ASSERT_OK(fleet_->ReportStep(StepReport(rank0, gang.assignments[0], 2)));
  // Retries of delivered reports (the response was lost) are refused as repeats, and change
  // nothing.
  EXPECT_TRUE(absl::IsAlreadyExists(fleet_->ReportStep(StepReport(rank0, gang.assignments[0], 2))));
  EXPECT_TRUE(absl::IsAlreadyExists(fleet_->ReportStep(StepReport(rank0, gang.assignments[0], 1))));
  // Rank 1's reports only show that it is alive.
  ASSERT_OK(fleet_->ReportStep(StepReport(rank1, gang.assignments[1], 3)));
  EXPECT_THAT(RecordedSteps(gang.job.id), ElementsAre(1, 2));

  ASSERT_OK(fleet_->ReportStep(StepReport(rank0, gang.assignments[0], 3)));
  EXPECT_THAT(RecordedSteps(gang.job.id), ElementsAre(1, 2, 3));
  const JobRecord job = GetJob(gang.job.id);
  v1::StepMetrics last;
  ASSERT_TRUE(last.ParseFromString(job.last_step_metrics));
  EXPECT_EQ(last.step(), 3);
  EXPECT_EQ(last.tokens_seen(), 3000);
  EXPECT_EQ(job.last_step_attempt, 1);
}

TEST_F(FleetTest, LogLinesOfAGangNameTheirRank) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(fleet_->ReportLog(
      LogReport(gang.workers[1], gang.assignments[1], {"loading data", "step 1 done"})));
  EXPECT_THAT(LogLines(gang.job.id), ElementsAre("[rank 1] loading data", "[rank 1] step 1 done"));

  const absl::Status flood = fleet_->ReportLog(
      LogReport(gang.workers[0], gang.assignments[0], std::vector<std::string>(1001, "x")));
  EXPECT_TRUE(absl::IsInvalidArgument(flood)) << flood;
  EXPECT_THAT(flood.message(), HasSubstr("1001 lines"));
  EXPECT_EQ(LogLines(gang.job.id).size(), 2u);
}

TEST_F(FleetTest, CheckpointAtAnotherPathOrStepIsInvalidArgument) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  const std::string& worker = running.worker_id;
  const v1::Assignment& assignment = running.assignment;
  const std::string expected = CheckpointPath(assignment, 5);

  std::vector<std::string> wrong_paths = {
      absl::StrCat(dir_, "/elsewhere/step-00000005"),                  // another directory
      CheckpointPath(assignment, 6),                                   // another step's name
      absl::StrCat(assignment.checkpoint_dir(), "/step-5"),            // not zero-padded
      absl::StrCat(assignment.checkpoint_dir(), "/../step-00000005"),  // out of the job's dir
  };
  for (const std::string& path : wrong_paths) {
    v1::ReportCheckpointRequest request = CheckpointReport(worker, assignment, 5);
    request.set_path(path);
    const absl::Status status = fleet_->ReportCheckpoint(request);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << path << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(expected)) << "the message says where it belongs";
  }
  const absl::Status step_zero = fleet_->ReportCheckpoint(CheckpointReport(worker, assignment, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(step_zero)) << step_zero;
  EXPECT_TRUE(absl::IsNotFound(store_->LatestCheckpoint(running.job.id).status()));
  EXPECT_FALSE(GetJob(running.job.id).latest_checkpoint_step.has_value());
  EXPECT_THAT(SavedCheckpoints(running.job.id), IsEmpty());

  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(worker, assignment, 5)));
  absl::StatusOr<CheckpointRecord> latest = store_->LatestCheckpoint(running.job.id);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 5);
  EXPECT_EQ(latest->path, expected);
  EXPECT_EQ(latest->tokens_seen, 5000);
  EXPECT_EQ(latest->attempt, 1);
  EXPECT_EQ(GetJob(running.job.id).latest_checkpoint_step, 5);
}

TEST_F(FleetTest, GangCheckpointIsGoodOnlyOnceEveryRankReportedIt) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(gang.workers[0], gang.assignments[0], 10)));
  // A retry of the same rank's report does not stand in for the other rank.
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(gang.workers[0], gang.assignments[0], 10)));
  EXPECT_TRUE(absl::IsNotFound(store_->LatestCheckpoint(gang.job.id).status()));
  EXPECT_FALSE(GetJob(gang.job.id).latest_checkpoint_step.has_value());
  EXPECT_THAT(SavedCheckpoints(gang.job.id), IsEmpty());

  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(gang.workers[1], gang.assignments[1], 10)));
  absl::StatusOr<CheckpointRecord> latest = store_->LatestCheckpoint(gang.job.id);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 10);
  EXPECT_EQ(latest->path, CheckpointPath(gang.assignments[0], 10));
  EXPECT_EQ(GetJob(gang.job.id).latest_checkpoint_step, 10);
  const std::vector<v1::CheckpointSaved> saved = SavedCheckpoints(gang.job.id);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(saved[0].step(), 10);
  EXPECT_EQ(saved[0].path(), CheckpointPath(gang.assignments[0], 10));
  EXPECT_EQ(saved[0].tokens_seen(), 10000);
}

}  // namespace
}  // namespace moetrain::server
