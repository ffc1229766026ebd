// Jobs whose ranks span several worker processes, all real processes on 127.0.0.1: a two-worker
// expert-parallel job trains the model one process would, and a gang whose worker is killed with
// SIGKILL restarts from its latest checkpoint on other workers, with no rank left hanging.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

// Losses by step of `moetrain run` of `job` on one rank (the single-process reference).
std::map<int64_t, double> SingleProcessLosses(TinySpec job, const fs::path& dir) {
  job.name += "-reference";
  job.workers = 1;
  job.expert_parallel = 1;
  const fs::path spec = dir / (job.name + ".yaml");
  std::ofstream(spec) << job.Yaml();
  return RunLosses(spec, dir);
}

std::map<int64_t, double> StepLosses(const std::vector<v1::JobEvent>& events) {
  std::map<int64_t, double> losses;
  for (const v1::JobEvent& event : events) {
    if (event.has_step_metrics()) losses[event.step_metrics().step()] = event.step_metrics().loss();
  }
  return losses;
}

TEST_F(ServiceTest, ATwoWorkerExpertParallelJobTrainsTheModelOneProcessWould) {
  TinySpec job = ServiceSpec("gang");
  job.workers = 2;
  job.expert_parallel = 2;
  job.steps = 30;
  const std::map<int64_t, double> reference = SingleProcessLosses(job, dir_);
  ASSERT_EQ(reference.size(), 30u);

  StartCoordinator();
  StartWorker("a", {"--comm-timeout", "20s"});
  StartWorker("b", {"--comm-timeout", "20s"});
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(120)))
      << coordinator_->Log() << workers_.at("a")->Log() << workers_.at("b")->Log();
  const std::map<int64_t, double> losses = StepLosses(Events(id));
  ASSERT_EQ(losses.size(), reference.size());
  double worst = 0;
  for (const auto& [step, loss] : losses) {
    ASSERT_TRUE(reference.contains(step)) << step;
    const double relative = std::abs(loss - reference.at(step)) / std::abs(reference.at(step));
    worst = std::max(worst, relative);
    EXPECT_LE(relative, 1e-5) << "step " << step << ": " << loss << " vs " << reference.at(step);
  }
  std::printf("ep=2 over two workers: %zu steps, worst relative loss difference %.2e\n",
              losses.size(), worst);
}

TEST_F(ServiceTest, AGangWhoseWorkerIsKilledRestartsFromItsCheckpointAndNoRankHangs) {
  TinySpec job = ServiceSpec("gang-fault");
  job.workers = 2;
  job.expert_parallel = 2;
  job.steps = 1500;
  job.log_every = 10;
  job.checkpoint_every = 200;
  StartCoordinator();
  const std::vector<std::string> fast_failure = {"--comm-timeout", "5s"};
  StartWorker("a", fast_failure);
  StartWorker("b", fast_failure);
  StartWorker("c", fast_failure);
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> running = GetJob(id);
        return running.has_value() && running->has_latest_checkpoint_step() &&
               running->last_metrics().step() >= 300;
      },
      std::chrono::seconds(120)))
      << coordinator_->Log();
  std::vector<std::string> gang;
  for (const v1::WorkerInfo& worker : Workers()) {
    if (worker.current_job_id() == id) gang.push_back(worker.name());
  }
  ASSERT_EQ(gang.size(), 2u);
  const std::string victim = gang[1], survivor = gang[0];
  workers_.at(victim)->Kill();
  std::printf("killed worker %s of the gang {%s, %s} at step %lld\n", victim.c_str(),
              gang[0].c_str(), gang[1].c_str(),
              static_cast<long long>(GetJob(id)->last_metrics().step()));

  // The survivor's rank fails within its comm timeout instead of hanging, so the survivor and the
  // spare form the next gang.
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(240)))
      << coordinator_->Log() << workers_.at(survivor)->Log();
  const v1::Job done = *GetJob(id);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.attempt(), 2);
  int64_t resumed_from = -1;
  for (const v1::JobEvent& event : Events(id)) {
    const std::string& text = event.log_line().text();
    if (resumed_from < 0 && text.find("resumed from ") != std::string::npos) {
      resumed_from = std::stoll(text.substr(text.rfind("(step ") + 6));
    }
  }
  EXPECT_GE(resumed_from, 200) << "the second attempt did not resume from a checkpoint";
  EXPECT_EQ(resumed_from % 200, 0);
  std::printf("the gang restarted on the survivor %s and the spare; resumed from step %lld\n",
              survivor.c_str(), static_cast<long long>(resumed_from));
}

}  // namespace
}  // namespace moetrain::testutil
