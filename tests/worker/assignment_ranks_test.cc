// An assignment as a worker runs it: ranks onto devices (ExpandAssignment), and the one end of
// several ranks (CombineRankEnds).
#include "worker/assignment_ranks.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/rank_runner.h"

namespace moetrain {
namespace {

v1::Assignment MakeAssignment(v1::ResourceConfig::Device device, int workers,
                              int devices_per_worker, int member) {
  v1::Assignment assignment;
  assignment.set_job_id("job-1");
  assignment.set_attempt(3);
  assignment.set_rank(member * devices_per_worker);
  assignment.set_world_size(workers * devices_per_worker);
  assignment.set_checkpoint_dir("/ckpt/job-1");
  assignment.set_resume_checkpoint("/ckpt/job-1/step-00000010");
  v1::ResourceConfig* resources = assignment.mutable_spec()->mutable_resources();
  resources->set_device(device);
  resources->set_workers(workers);
  resources->set_devices_per_worker(devices_per_worker);
  return assignment;
}

TEST(ExpandAssignmentTest, CpuWorkerRunsTheOneRankOnTheCpu) {
  const v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CPU, 3, 1, 2);
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CPU, 1);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].assignment.rank(), 2);
  EXPECT_EQ((*ranks)[0].device, Device::Cpu());
  EXPECT_EQ((*ranks)[0].assignment.SerializeAsString(), assignment.SerializeAsString());
}

TEST(ExpandAssignmentTest, UnsetDevicesPerWorkerIsOne) {
  v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CPU, 2, 1, 1);
  assignment.mutable_spec()->mutable_resources()->clear_devices_per_worker();
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CPU, 1);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].assignment.rank(), 1);
}

TEST(ExpandAssignmentTest, GpuWorkerRunsEachRankOnItsOwnGpu) {
  // Member 1 of a gang of 2 workers × 4 GPUs: ranks 4..7 on the worker's GPUs 0..3.
  const v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CUDA, 2, 4, 1);
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 4);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const LocalRank& rank = (*ranks)[i];
    EXPECT_EQ(rank.assignment.rank(), 4 + i);
    EXPECT_EQ(rank.device, Device::Cuda(i));
    // Everything but the rank is the delivered assignment's.
    v1::Assignment expected = assignment;
    expected.set_rank(4 + i);
    EXPECT_EQ(rank.assignment.SerializeAsString(), expected.SerializeAsString());
  }
}

TEST(ExpandAssignmentTest, GpuWorkerWithMoreGpusThanNeededUsesTheFirst) {
  const v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CUDA, 1, 2, 0);
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 8);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].device, Device::Cuda(0));
  EXPECT_EQ((*ranks)[1].device, Device::Cuda(1));
  EXPECT_EQ((*ranks)[1].assignment.rank(), 1);
}

TEST(ExpandAssignmentTest, TooFewDevicesIsRefusedAsTransient) {
  const v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CUDA, 2, 4, 0);
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 2);
  ASSERT_FALSE(ranks.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(ranks.status())) << ranks.status();
  EXPECT_NE(ranks.status().message().find("devices_per_worker = 4"), std::string::npos)
      << ranks.status();
  EXPECT_NE(ranks.status().message().find("has 2"), std::string::npos) << ranks.status();
  // Another worker may have the GPUs: the attempt is retried, not the job failed.
  EXPECT_EQ(FailureKindOf(ranks.status()), v1::FAILURE_KIND_TRANSIENT);
}

TEST(ExpandAssignmentTest, RanksOutsideTheWorldAreRefused) {
  v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CUDA, 2, 2, 1);
  assignment.set_rank(3);  // ranks 3..4 of a world of 4
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(ranks.status())) << ranks.status();
  assignment.set_rank(-1);
  ranks = ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 2);
  EXPECT_TRUE(absl::IsInvalidArgument(ranks.status())) << ranks.status();
}

TEST(ExpandAssignmentTest, DevicesPerWorkerBelowOneIsRefused) {
  v1::Assignment assignment = MakeAssignment(v1::ResourceConfig::CUDA, 1, 1, 0);
  assignment.mutable_spec()->mutable_resources()->set_devices_per_worker(0);
  EXPECT_TRUE(
      absl::IsInvalidArgument(ExpandAssignment(assignment, v1::ResourceConfig::CUDA, 2).status()));
}

v1::ReportAttemptEndRequest End(int32_t rank, v1::AttemptOutcome outcome, int64_t step,
                                const std::string& message = "",
                                v1::FailureKind kind = v1::FAILURE_KIND_UNSPECIFIED) {
  v1::ReportAttemptEndRequest end;
  end.set_worker_id("w1");
  end.set_job_id("job-1");
  end.set_attempt(3);
  end.set_rank(rank);
  end.set_outcome(outcome);
  end.set_step(step);
  end.set_message(message);
  end.set_failure_kind(kind);
  return end;
}

TEST(CombineRankEndsTest, OneRankIsItsOwnEnd) {
  const v1::ReportAttemptEndRequest end =
      End(2, v1::ATTEMPT_OUTCOME_FAILED, 7, "boom", v1::FAILURE_KIND_PERMANENT);
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(2, {end});
  EXPECT_EQ(combined.SerializeAsString(), end.SerializeAsString());
}

TEST(CombineRankEndsTest, AllSucceededIsSucceeded) {
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(
      4, {End(5, v1::ATTEMPT_OUTCOME_SUCCEEDED, 100), End(4, v1::ATTEMPT_OUTCOME_SUCCEEDED, 100)});
  EXPECT_EQ(combined.outcome(), v1::ATTEMPT_OUTCOME_SUCCEEDED);
  EXPECT_EQ(combined.rank(), 4);  // addressed as the assignment's first rank
  EXPECT_EQ(combined.worker_id(), "w1");
  EXPECT_EQ(combined.job_id(), "job-1");
  EXPECT_EQ(combined.attempt(), 3);
  EXPECT_EQ(combined.step(), 100);
  EXPECT_TRUE(combined.message().empty());
}

TEST(CombineRankEndsTest, AFailureWinsWithItsRanksMessage) {
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(
      0, {End(0, v1::ATTEMPT_OUTCOME_SUCCEEDED, 9),
          End(2, v1::ATTEMPT_OUTCOME_FAILED, 6, "out of memory", v1::FAILURE_KIND_TRANSIENT),
          End(1, v1::ATTEMPT_OUTCOME_CANCELLED, 8)});
  EXPECT_EQ(combined.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(combined.rank(), 0);
  EXPECT_EQ(combined.message(), "rank 2: out of memory");
  EXPECT_EQ(combined.failure_kind(), v1::FAILURE_KIND_TRANSIENT);
  EXPECT_EQ(combined.step(), 6);  // what every rank completed
}

TEST(CombineRankEndsTest, FirstFailureToEndWinsAmongTransientOnes) {
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(
      0, {End(3, v1::ATTEMPT_OUTCOME_FAILED, 4, "nccl error", v1::FAILURE_KIND_TRANSIENT),
          End(1, v1::ATTEMPT_OUTCOME_FAILED, 4, "peer lost", v1::FAILURE_KIND_TRANSIENT)});
  EXPECT_EQ(combined.message(), "rank 3: nccl error");
}

TEST(CombineRankEndsTest, APermanentFailureWinsOverAnEarlierTransientOne) {
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(
      0,
      {End(0, v1::ATTEMPT_OUTCOME_FAILED, 0, "peer lost", v1::FAILURE_KIND_TRANSIENT),
       End(1, v1::ATTEMPT_OUTCOME_FAILED, 0, "token id 9999 >= vocab", v1::FAILURE_KIND_PERMANENT),
       End(2, v1::ATTEMPT_OUTCOME_FAILED, 0, "other", v1::FAILURE_KIND_PERMANENT)});
  EXPECT_EQ(combined.failure_kind(), v1::FAILURE_KIND_PERMANENT);
  EXPECT_EQ(combined.message(), "rank 1: token id 9999 >= vocab");
}

TEST(CombineRankEndsTest, CancelledBeatsStoppedBeatsSucceeded) {
  EXPECT_EQ(CombineRankEnds(0, {End(0, v1::ATTEMPT_OUTCOME_SUCCEEDED, 5),
                                End(1, v1::ATTEMPT_OUTCOME_STOPPED, 5)})
                .outcome(),
            v1::ATTEMPT_OUTCOME_STOPPED);
  EXPECT_EQ(CombineRankEnds(0, {End(0, v1::ATTEMPT_OUTCOME_STOPPED, 5),
                                End(1, v1::ATTEMPT_OUTCOME_CANCELLED, 5)})
                .outcome(),
            v1::ATTEMPT_OUTCOME_CANCELLED);
}

TEST(CombineRankEndsTest, DrainingWhenAnyRankSaysSo) {
  v1::ReportAttemptEndRequest draining = End(1, v1::ATTEMPT_OUTCOME_STOPPED, 12);
  draining.set_worker_draining(true);
  const v1::ReportAttemptEndRequest combined =
      CombineRankEnds(0, {End(0, v1::ATTEMPT_OUTCOME_STOPPED, 12), draining});
  EXPECT_TRUE(combined.worker_draining());
  EXPECT_EQ(combined.outcome(), v1::ATTEMPT_OUTCOME_STOPPED);
}

TEST(CombineRankEndsTest, NoEndsIsATransientFailure) {
  const v1::ReportAttemptEndRequest combined = CombineRankEnds(6, {});
  EXPECT_EQ(combined.outcome(), v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(combined.failure_kind(), v1::FAILURE_KIND_TRANSIENT);
  EXPECT_EQ(combined.rank(), 6);
}

}  // namespace
}  // namespace moetrain
