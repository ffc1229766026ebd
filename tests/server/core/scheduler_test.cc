#include "server/core/scheduler.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moetrain::server {
namespace {

using Assigned = std::vector<std::pair<std::string, std::vector<std::string>>>;
using Reasons = std::vector<std::pair<std::string, std::string>>;

constexpr DeviceKind kCpu = DeviceKind::kCpu;
constexpr DeviceKind kCuda = DeviceKind::kCuda;
constexpr WorkerState kIdle = WorkerState::kIdle;
constexpr WorkerState kBusy = WorkerState::kBusy;
constexpr WorkerState kDraining = WorkerState::kDraining;
constexpr WorkerState kLost = WorkerState::kLost;

PendingJob Job(std::string id, int64_t sequence, int32_t workers_needed = 1, DeviceKind kind = kCpu,
               int32_t devices_per_worker = 1, int32_t priority = 0) {
  return {std::move(id), priority, sequence, workers_needed, kind, devices_per_worker};
}

SchedulerWorker Worker(std::string id, WorkerState state = kIdle, DeviceKind kind = kCpu,
                       int32_t device_count = 1) {
  return {std::move(id), kind, device_count, state};
}

Assigned AssignedOf(const ScheduleDecision& decision) {
  Assigned out;
  for (const Assignment& a : decision.assignments) out.emplace_back(a.job_id, a.worker_ids);
  return out;
}

Reasons ReasonsOf(const ScheduleDecision& decision) {
  Reasons out;
  for (const UnschedulableJob& u : decision.unschedulable) out.emplace_back(u.job_id, u.reason);
  return out;
}

ScheduleDecision MustSchedule(const std::vector<PendingJob>& jobs,
                              const std::vector<SchedulerWorker>& workers) {
  absl::StatusOr<ScheduleDecision> decision = Schedule(jobs, workers);
  EXPECT_TRUE(decision.ok()) << decision.status();
  return decision.ok() ? *std::move(decision) : ScheduleDecision{};
}

TEST(SchedulerTest, EmptyInputs) {
  ScheduleDecision none = MustSchedule({}, {});
  EXPECT_TRUE(none.assignments.empty());
  EXPECT_TRUE(none.unschedulable.empty());

  ScheduleDecision no_jobs = MustSchedule({}, {Worker("w1")});
  EXPECT_TRUE(no_jobs.assignments.empty());
  EXPECT_TRUE(no_jobs.unschedulable.empty());

  ScheduleDecision no_workers = MustSchedule({Job("a", 1)}, {});
  EXPECT_TRUE(no_workers.assignments.empty());
  EXPECT_EQ(ReasonsOf(no_workers), (Reasons{{"a", "needs 1 CPU worker, 0 registered"}}));
}

TEST(SchedulerTest, SingleJobSingleWorker) {
  ScheduleDecision decision = MustSchedule({Job("a", 1)}, {Worker("w1")});
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"a", {"w1"}}}));
  EXPECT_TRUE(decision.unschedulable.empty());
}

TEST(SchedulerTest, TwoJobsOneWorkerStartsOnlyTheFirstInFifoOrder) {
  // Listed out of order: the submit sequence decides, not the input position.
  ScheduleDecision decision = MustSchedule({Job("later", 8), Job("earlier", 7)}, {Worker("w1")});
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"earlier", {"w1"}}}));
  EXPECT_TRUE(decision.unschedulable.empty());  // "later" waits, it is not unschedulable
}

TEST(SchedulerTest, PriorityBeatsFifo) {
  ScheduleDecision decision = MustSchedule({Job("old-low", 1, 1, kCpu, 1, /*priority=*/0),
                                            Job("new-high", 2, 1, kCpu, 1, /*priority=*/5)},
                                           {Worker("w1")});
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"new-high", {"w1"}}}));

  // Assignments come back in scheduling order too.
  ScheduleDecision both =
      MustSchedule({Job("old-low", 1, 1, kCpu, 1, 0), Job("new-high", 2, 1, kCpu, 1, 5)},
                   {Worker("w1"), Worker("w2")});
  EXPECT_EQ(AssignedOf(both), (Assigned{{"new-high", {"w1"}}, {"old-low", {"w2"}}}));
}

TEST(SchedulerTest, GangWaitsUntilAllItsWorkersAreFree) {
  const std::vector<PendingJob> jobs = {Job("gang", 1, /*workers_needed=*/2)};
  ScheduleDecision one_free = MustSchedule(jobs, {Worker("w1"), Worker("w2", kBusy)});
  EXPECT_TRUE(one_free.assignments.empty());  // no partial allocation
  EXPECT_TRUE(one_free.unschedulable.empty());

  ScheduleDecision two_free = MustSchedule(jobs, {Worker("w2"), Worker("w1")});
  EXPECT_EQ(AssignedOf(two_free), (Assigned{{"gang", {"w1", "w2"}}}));
}

TEST(SchedulerTest, BackfillRunsASmallJobOnWorkersTheHeadDoesNotReserve) {
  // The head needs three 8-device CUDA workers; two are free, the third is busy. The small CUDA
  // job fits on the 1-device worker, which the head cannot use, and CPU jobs are unaffected.
  const std::vector<SchedulerWorker> workers = {
      Worker("g1", kIdle, kCuda, 8), Worker("g2", kIdle, kCuda, 8), Worker("g3", kBusy, kCuda, 8),
      Worker("s1", kIdle, kCuda, 1), Worker("c1", kIdle, kCpu, 0)};
  ScheduleDecision decision =
      MustSchedule({Job("head", 1, 3, kCuda, 8, /*priority=*/9), Job("small", 2, 1, kCuda, 1),
                    Job("cpu", 3, 1, kCpu, 0)},
                   workers);
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"small", {"s1"}}, {"cpu", {"c1"}}}));
  EXPECT_TRUE(decision.unschedulable.empty());
}

TEST(SchedulerTest, BackfillIsBlockedWhenItWouldTakeAReservedWorker) {
  const std::vector<SchedulerWorker> workers = {
      Worker("g1", kIdle, kCuda, 8), Worker("g2", kIdle, kCuda, 8), Worker("g3", kBusy, kCuda, 8),
      Worker("s1", kIdle, kCuda, 1)};
  // Alone, the two-worker job would start on s1 and g1 ...
  EXPECT_EQ(AssignedOf(MustSchedule({Job("small", 2, 2, kCuda, 1)}, workers)),
            (Assigned{{"small", {"g1", "s1"}}}));
  // ... but behind the head g1 and g2 are reserved, and s1 alone is not enough.
  ScheduleDecision behind_head =
      MustSchedule({Job("head", 1, 3, kCuda, 8), Job("small", 2, 2, kCuda, 1)}, workers);
  EXPECT_TRUE(behind_head.assignments.empty());
  // A one-device job that needs a big worker cannot backfill either.
  ScheduleDecision big_worker =
      MustSchedule({Job("head", 1, 3, kCuda, 8), Job("one-big", 2, 1, kCuda, 8)}, workers);
  EXPECT_TRUE(big_worker.assignments.empty());
}

TEST(SchedulerTest, OnlyTheHeadReserves) {
  // "second" is blocked too, but does not hold s1, so "third" backfills onto it.
  const std::vector<SchedulerWorker> workers = {
      Worker("g1", kIdle, kCuda, 8), Worker("g2", kBusy, kCuda, 8), Worker("s1", kIdle, kCuda, 1),
      Worker("s2", kBusy, kCuda, 1)};
  ScheduleDecision decision = MustSchedule(
      {Job("head", 1, 2, kCuda, 8), Job("second", 2, 4, kCuda, 1), Job("third", 3, 1, kCuda, 1)},
      workers);
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"third", {"s1"}}}));
}

TEST(SchedulerTest, HeadStartsOnceItsWorkersAreFreeEvenWithSmallJobsQueued) {
  const std::vector<PendingJob> jobs = {Job("head", 1, 2), Job("small-1", 2), Job("small-2", 3)};
  EXPECT_TRUE(MustSchedule(jobs, {Worker("w1"), Worker("w2", kBusy)}).assignments.empty());
  EXPECT_EQ(AssignedOf(MustSchedule(jobs, {Worker("w1"), Worker("w2")})),
            (Assigned{{"head", {"w1", "w2"}}}));
}

TEST(SchedulerTest, DeviceKindMustMatch) {
  ScheduleDecision decision =
      MustSchedule({Job("gpu", 1, 1, kCuda, 1), Job("cpu", 2, 1, kCpu, 1)},
                   {Worker("a-cpu", kIdle, kCpu, 4), Worker("z-gpu", kIdle, kCuda, 1)});
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"gpu", {"z-gpu"}}, {"cpu", {"a-cpu"}}}));

  ScheduleDecision only_cpu =
      MustSchedule({Job("gpu", 1, 1, kCuda, 1)}, {Worker("c1", kIdle, kCpu, 8)});
  EXPECT_TRUE(only_cpu.assignments.empty());
  EXPECT_EQ(ReasonsOf(only_cpu), (Reasons{{"gpu", "needs 1 CUDA worker, 0 registered"}}));
}

TEST(SchedulerTest, DevicesPerWorkerIsALowerBoundAndTheBestFitIsTaken) {
  const std::vector<SchedulerWorker> workers = {
      Worker("w8", kIdle, kCuda, 8), Worker("w2", kIdle, kCuda, 2), Worker("w4", kIdle, kCuda, 4)};
  EXPECT_EQ(AssignedOf(MustSchedule({Job("a", 1, 1, kCuda, 4)}, workers)),
            (Assigned{{"a", {"w4"}}}));
  EXPECT_EQ(AssignedOf(MustSchedule({Job("a", 1, 2, kCuda, 4)}, workers)),
            (Assigned{{"a", {"w4", "w8"}}}));
  EXPECT_EQ(AssignedOf(MustSchedule({Job("a", 1, 1, kCuda, 3), Job("b", 2, 1, kCuda, 1)}, workers)),
            (Assigned{{"a", {"w4"}}, {"b", {"w2"}}}));
  ScheduleDecision too_big = MustSchedule({Job("a", 1, 1, kCuda, 16)}, workers);
  EXPECT_TRUE(too_big.assignments.empty());
  EXPECT_EQ(ReasonsOf(too_big),
            (Reasons{{"a", "needs 1 CUDA worker with at least 16 devices each, 0 registered"}}));
}

TEST(SchedulerTest, BusyDrainingAndLostWorkersAreNotUsed) {
  const std::vector<SchedulerWorker> workers = {
      Worker("busy", kBusy), Worker("draining", kDraining), Worker("lost", kLost)};
  ScheduleDecision decision = MustSchedule({Job("a", 1)}, workers);
  EXPECT_TRUE(decision.assignments.empty());
  EXPECT_TRUE(decision.unschedulable.empty());  // busy and draining still count as registered

  // LOST does not count: two registered workers cannot host a gang of three.
  ScheduleDecision gang = MustSchedule({Job("gang", 1, 3)}, workers);
  EXPECT_EQ(ReasonsOf(gang), (Reasons{{"gang", "needs 3 CPU workers, 2 registered"}}));

  std::vector<SchedulerWorker> with_idle = workers;
  with_idle.push_back(Worker("idle"));
  EXPECT_EQ(AssignedOf(MustSchedule({Job("a", 1)}, with_idle)), (Assigned{{"a", {"idle"}}}));
}

TEST(SchedulerTest, WorkerChoiceIsDeterministicAndRanksFollowWorkerId) {
  const std::vector<PendingJob> jobs = {Job("a", 1, 2), Job("b", 2, 1), Job("c", 3, 2, kCpu, 1, 3)};
  std::vector<SchedulerWorker> workers = {Worker("w3"), Worker("w1"), Worker("w5"), Worker("w2"),
                                          Worker("w4")};
  const ScheduleDecision first = MustSchedule(jobs, workers);
  EXPECT_EQ(AssignedOf(first), (Assigned{{"c", {"w1", "w2"}}, {"a", {"w3", "w4"}}, {"b", {"w5"}}}));

  std::vector<PendingJob> shuffled_jobs = jobs;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(workers.begin(), workers.end(), rng);
    std::shuffle(shuffled_jobs.begin(), shuffled_jobs.end(), rng);
    EXPECT_EQ(AssignedOf(MustSchedule(shuffled_jobs, workers)), AssignedOf(first));
  }
}

TEST(SchedulerTest, UnschedulableJobsAreReportedAndDoNotBlockTheQueue) {
  const std::vector<SchedulerWorker> workers = {Worker("c1"), Worker("c2", kBusy),
                                                Worker("g1", kIdle, kCuda, 8),
                                                Worker("g2", kLost, kCuda, 8)};
  ScheduleDecision decision =
      MustSchedule({Job("cpu-4", 1, 4, kCpu, 1, /*priority=*/9), Job("cuda-2x8", 2, 2, kCuda, 8, 9),
                    Job("cuda-1", 3, 1, kCuda, 1, 8), Job("cpu-1", 4, 1, kCpu, 1, 0)},
                   workers);
  EXPECT_EQ(
      ReasonsOf(decision),
      (Reasons{{"cpu-4", "needs 4 CPU workers, 2 registered"},
               {"cuda-2x8", "needs 2 CUDA workers with at least 8 devices each, 1 registered"}}));
  // Neither unschedulable job reserves anything: the jobs behind them start.
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"cuda-1", {"g1"}}, {"cpu-1", {"c1"}}}));
}

TEST(SchedulerTest, RejectsMalformedInput) {
  const std::vector<SchedulerWorker> workers = {Worker("w1")};
  const std::vector<std::vector<PendingJob>> bad_jobs = {
      {Job("", 1)},     {Job("a", 1), Job("a", 2)}, {Job("a", 1), Job("b", 1)},
      {Job("a", 1, 0)}, {Job("a", 1, 1, kCpu, -1)},
  };
  for (const std::vector<PendingJob>& jobs : bad_jobs) {
    absl::StatusOr<ScheduleDecision> decision = Schedule(jobs, workers);
    EXPECT_EQ(decision.status().code(), absl::StatusCode::kInvalidArgument) << jobs[0].job_id;
  }
  EXPECT_EQ(Schedule({Job("a", 1)}, {Worker("w1"), Worker("w1")}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Schedule({Job("a", 1)}, {Worker("")}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Schedule({Job("a", 1)}, {Worker("w1", kIdle, kCpu, -2)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ScheduleDecision> twice = Schedule({Job("a", 1, 0)}, workers);
  EXPECT_NE(twice.status().message().find("workers_needed = 0"), std::string::npos)
      << twice.status();
}

// Rule 2, written out again: what the random test holds the decisions to.
bool Fits(const PendingJob& job, const SchedulerWorker& worker) {
  const bool memory_known = job.device_memory_bytes > 0 && worker.device_memory_bytes > 0;
  return worker.device_kind == job.device_kind && worker.device_count >= job.devices_per_worker &&
         (!memory_known || worker.device_memory_bytes >= job.device_memory_bytes);
}

// Random fleets and queues: the invariants every decision must keep.
TEST(SchedulerTest, RandomDecisionsKeepTheInvariants) {
  std::mt19937 rng(20261202);
  const WorkerState states[] = {kIdle, kIdle, kIdle, kBusy, kDraining, kLost};
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<SchedulerWorker> workers;
    const int num_workers = std::uniform_int_distribution<int>(0, 8)(rng);
    for (int i = 0; i < num_workers; ++i) {
      workers.push_back(Worker(absl::StrCat("w", i), states[rng() % 6], rng() % 2 ? kCpu : kCuda,
                               static_cast<int32_t>(rng() % 9)));
      // 0 (unknown), 40, 80 or 120 GiB per device.
      workers.back().device_memory_bytes = static_cast<int64_t>(rng() % 4) * (int64_t{40} << 30);
    }
    std::vector<PendingJob> jobs;
    const int num_jobs = std::uniform_int_distribution<int>(0, 6)(rng);
    for (int i = 0; i < num_jobs; ++i) {
      jobs.push_back(Job(absl::StrCat("j", i), i, static_cast<int32_t>(1 + rng() % 4),
                         rng() % 2 ? kCpu : kCuda, static_cast<int32_t>(rng() % 9),
                         static_cast<int32_t>(rng() % 3)));
      jobs.back().device_memory_bytes = static_cast<int64_t>(rng() % 4) * (int64_t{40} << 30);
    }
    const ScheduleDecision decision = MustSchedule(jobs, workers);
    std::map<std::string, const PendingJob*> job_by_id;
    for (const PendingJob& job : jobs) job_by_id[job.job_id] = &job;
    std::map<std::string, const SchedulerWorker*> worker_by_id;
    for (const SchedulerWorker& worker : workers) worker_by_id[worker.worker_id] = &worker;

    std::set<std::string> used;
    std::set<std::string> decided;
    for (const Assignment& a : decision.assignments) {
      ASSERT_TRUE(decided.insert(a.job_id).second) << a.job_id;
      const PendingJob& job = *job_by_id.at(a.job_id);
      ASSERT_EQ(a.worker_ids.size(), static_cast<size_t>(job.workers_needed));
      EXPECT_TRUE(std::is_sorted(a.worker_ids.begin(), a.worker_ids.end()));
      for (const std::string& id : a.worker_ids) {
        EXPECT_TRUE(used.insert(id).second) << "worker " << id << " assigned twice";
        const SchedulerWorker& worker = *worker_by_id.at(id);
        EXPECT_EQ(worker.state, kIdle);
        EXPECT_TRUE(Fits(job, worker)) << job.job_id << " on " << id;
      }
    }
    for (const UnschedulableJob& u : decision.unschedulable) {
      EXPECT_TRUE(decided.insert(u.job_id).second) << u.job_id;
      const PendingJob& job = *job_by_id.at(u.job_id);
      int registered = 0;
      for (const SchedulerWorker& worker : workers) {
        registered += worker.state != kLost && Fits(job, worker);
      }
      EXPECT_LT(registered, job.workers_needed);
    }

    // Jobs later in order never change the decision for earlier ones: so backfill never delays
    // the head, and a job's outcome does not depend on what was submitted after it.
    std::vector<const PendingJob*> order;
    for (const PendingJob& job : jobs) order.push_back(&job);
    std::sort(order.begin(), order.end(), [](const PendingJob* a, const PendingJob* b) {
      return a->priority != b->priority ? a->priority > b->priority
                                        : a->submit_sequence < b->submit_sequence;
    });
    // And no job after the head (the first job that waits) runs on a worker the head could use.
    const PendingJob* head = nullptr;
    for (const PendingJob* job : order) {
      if (head != nullptr) {
        for (const Assignment& a : decision.assignments) {
          if (a.job_id != job->job_id) continue;
          for (const std::string& id : a.worker_ids) {
            const SchedulerWorker& worker = *worker_by_id.at(id);
            EXPECT_FALSE(Fits(*head, worker))
                << job->job_id << " took " << id << " from head " << head->job_id;
          }
        }
      } else if (decided.count(job->job_id) == 0) {
        head = job;
      }
    }
    std::vector<PendingJob> prefix;
    std::set<std::string> prefix_ids;
    for (const PendingJob* job : order) {
      prefix.push_back(*job);
      prefix_ids.insert(job->job_id);
      Assigned expected;
      for (const auto& [job_id, worker_ids] : AssignedOf(decision)) {
        if (prefix_ids.count(job_id) == 1) expected.emplace_back(job_id, worker_ids);
      }
      EXPECT_EQ(AssignedOf(MustSchedule(prefix, workers)), expected);
    }
  }
}

Reasons WaitingOf(const ScheduleDecision& decision) {
  Reasons out;
  for (const UnschedulableJob& u : decision.waiting) out.emplace_back(u.job_id, u.reason);
  return out;
}

TEST(SchedulerTest, EveryJobThatDoesNotStartSaysWhy) {
  // "a" takes w1; "gang" could run on the fleet but not now; "huge" never could; "gpu" waits for
  // the busy g1.
  const std::vector<PendingJob> jobs = {Job("a", 1), Job("gang", 2, 2), Job("huge", 3, 5),
                                        Job("gpu", 4, 1, kCuda, 8)};
  const std::vector<SchedulerWorker> workers = {Worker("w1"), Worker("w2", kBusy),
                                                Worker("g1", kBusy, kCuda, 8)};
  const ScheduleDecision decision = MustSchedule(jobs, workers);
  EXPECT_EQ(AssignedOf(decision), (Assigned{{"a", {"w1"}}}));
  EXPECT_EQ(ReasonsOf(decision), (Reasons{{"huge", "needs 5 CPU workers, 2 registered"}}));
  EXPECT_EQ(WaitingOf(decision),
            (Reasons{{"gang", "waiting for 2 CPU workers to be free at once, 2 registered"},
                     {"gpu",
                      "waiting for 1 CUDA worker with at least 8 devices each to be free, "
                      "1 registered"}}));
}

constexpr int64_t kGiB = int64_t{1} << 30;

SchedulerWorker GpuWorker(std::string id, int32_t device_count, int64_t memory_bytes,
                          WorkerState state = kIdle) {
  SchedulerWorker worker = Worker(std::move(id), state, kCuda, device_count);
  worker.device_memory_bytes = memory_bytes;
  return worker;
}

TEST(SchedulerTest, ACudaJobGoesOnlyToCudaWorkersWithEnoughGpus) {
  // The CPU worker is free and the first by id; the one-GPU worker is too small.
  const std::vector<SchedulerWorker> workers = {Worker("a-cpu", kIdle, kCpu, 1),
                                                GpuWorker("b-gpu1", 1, 80 * kGiB),
                                                GpuWorker("c-gpu2", 2, 80 * kGiB)};
  EXPECT_EQ(AssignedOf(MustSchedule({Job("two-gpus", 1, 1, kCuda, 2)}, workers)),
            (Assigned{{"two-gpus", {"c-gpu2"}}}));
  EXPECT_EQ(AssignedOf(MustSchedule({Job("cpu", 1, 1, kCpu, 1)}, workers)),
            (Assigned{{"cpu", {"a-cpu"}}}));
  const ScheduleDecision too_many = MustSchedule({Job("four", 1, 1, kCuda, 4)}, workers);
  EXPECT_EQ(ReasonsOf(too_many),
            (Reasons{{"four", "needs 1 CUDA worker with at least 4 devices each, 0 registered"}}));
}

TEST(SchedulerTest, DeviceMemoryExcludesOnlyWorkersKnownToBeSmaller) {
  const std::vector<SchedulerWorker> workers = {GpuWorker("a-small", 1, 40 * kGiB),
                                                GpuWorker("b-large", 1, 80 * kGiB),
                                                GpuWorker("c-unknown", 1, 0)};
  PendingJob big = Job("big", 1, 2, kCuda, 1);
  big.device_memory_bytes = 60 * kGiB;
  EXPECT_EQ(AssignedOf(MustSchedule({big}, workers)),
            (Assigned{{"big", {"b-large", "c-unknown"}}}));
  // A need of 0 (unknown) takes any worker.
  EXPECT_EQ(AssignedOf(MustSchedule({Job("any", 1, 1, kCuda, 1)}, workers)),
            (Assigned{{"any", {"a-small"}}}));

  PendingJob huge = Job("huge", 1, 1, kCuda, 1);
  huge.device_memory_bytes = 100 * kGiB;
  const ScheduleDecision one_unknown = MustSchedule(
      {huge}, {GpuWorker("a-small", 1, 40 * kGiB), GpuWorker("c-unknown", 1, 0, kBusy)});
  EXPECT_TRUE(one_unknown.assignments.empty());
  EXPECT_TRUE(ReasonsOf(one_unknown).empty());
  EXPECT_EQ(WaitingOf(one_unknown),
            (Reasons{{"huge",
                      "waiting for 1 CUDA worker with a device of 100.0 GiB to be free, "
                      "1 registered"}}));

  PendingJob gang = Job("gang", 1, 2, kCuda, 2);
  gang.device_memory_bytes = 60 * kGiB;
  const ScheduleDecision too_small =
      MustSchedule({gang}, {GpuWorker("a", 2, 40 * kGiB), GpuWorker("b", 2, 80 * kGiB)});
  EXPECT_EQ(ReasonsOf(too_small),
            (Reasons{{"gang",
                      "needs 2 CUDA workers with at least 2 devices of 60.0 GiB each, "
                      "1 registered"}}));

  PendingJob negative = Job("negative", 1, 1, kCuda, 1);
  negative.device_memory_bytes = -1;
  EXPECT_EQ(Schedule({negative}, workers).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Schedule({Job("a", 1, 1, kCuda, 1)}, {GpuWorker("w", 1, -1)}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moetrain::server
