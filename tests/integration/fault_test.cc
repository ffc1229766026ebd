// Faults, with real processes on 127.0.0.1: a worker killed with SIGKILL mid-job (the job resumes
// from its latest checkpoint on another worker, and trains exactly the steps an uninterrupted run
// trains), and the coordinator killed with SIGKILL mid-job and started again on the same state
// file (no job lost, the running one carries on).
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

TEST_F(ServiceTest, AKilledWorkersJobResumesElsewhereAndTrainsTheSameSteps) {
  TinySpec job = ServiceSpec("resumed");
  job.steps = 3000;
  job.log_every = 10;
  job.checkpoint_every = 250;
  const fs::path spec = WriteSpec(job);
  // An uninterrupted run is the reference a restarted job must match bit for bit.
  const std::map<int64_t, double> reference = RunLosses(spec, dir_);
  ASSERT_EQ(reference.size(), 301u);  // step 1, then every 10th

  StartCoordinator();
  StartWorker("a");
  StartWorker("b");
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> running = GetJob(id);
        return running.has_value() && running->has_latest_checkpoint_step() &&
               running->last_metrics().step() >= 600;
      },
      std::chrono::seconds(120)))
      << coordinator_->Log();
  std::string victim;
  for (const v1::WorkerInfo& worker : Workers()) {
    if (worker.current_job_id() == id) victim = worker.name();
  }
  ASSERT_FALSE(victim.empty());
  workers_.at(victim)->Kill();
  const int64_t killed_at = GetJob(id)->last_metrics().step();
  std::printf("killed worker %s at step %lld of job %s\n", victim.c_str(),
              static_cast<long long>(killed_at), id.c_str());

  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(180)))
      << coordinator_->Log();
  const v1::Job done = *GetJob(id);
  EXPECT_EQ(done.restarts(), 1);
  EXPECT_EQ(done.attempt(), 2);

  // The events after the restart: the second attempt on the other worker, resumed from a
  // checkpoint, then steps whose losses equal the uninterrupted run's exactly.
  const std::vector<v1::JobEvent> events = Events(id);
  bool restarted = false;
  std::string second_attempt_on;
  int64_t resumed_from = -1, first_step_after = -1, steps_after = 0;
  for (const v1::JobEvent& event : events) {
    if (event.has_state_change() && event.state_change().to() == v1::JOB_STATE_RESTARTING) {
      restarted = true;
      EXPECT_THAT(event.state_change().reason(), ::testing::HasSubstr("no heartbeat"));
    }
    if (!restarted) continue;
    if (event.has_state_change() && event.state_change().to() == v1::JOB_STATE_SCHEDULED) {
      second_attempt_on = event.state_change().reason();
    }
    const std::string& text = event.log_line().text();
    if (resumed_from < 0 && text.rfind("resumed from ", 0) == 0) {
      resumed_from = std::stoll(text.substr(text.rfind("(step ") + 6));
    }
    if (event.has_step_metrics()) {
      const v1::StepMetrics& metrics = event.step_metrics();
      if (first_step_after < 0) first_step_after = metrics.step();
      ++steps_after;
      ASSERT_TRUE(reference.contains(metrics.step())) << metrics.step();
      EXPECT_EQ(metrics.loss(), reference.at(metrics.step())) << "step " << metrics.step();
    }
  }
  ASSERT_TRUE(restarted);
  const std::string survivor = victim == "a" ? "b" : "a";
  std::string survivor_id;
  for (const v1::WorkerInfo& worker : Workers()) {
    if (worker.name() == survivor) survivor_id = worker.id();
  }
  EXPECT_THAT(second_attempt_on, ::testing::HasSubstr(survivor_id));
  ASSERT_GE(resumed_from, 250) << "the second attempt did not resume from a checkpoint";
  EXPECT_LE(resumed_from, killed_at);
  EXPECT_EQ(resumed_from % 250, 0);
  EXPECT_EQ(first_step_after, resumed_from + 10);
  EXPECT_EQ(steps_after, (3000 - resumed_from) / 10);
  std::printf("resumed from step %lld; %lld steps after it matched the uninterrupted run\n",
              static_cast<long long>(resumed_from), static_cast<long long>(steps_after));
}

TEST_F(ServiceTest, AKilledCoordinatorLosesNoJobAndTheRunningOneCarriesOn) {
  // A generous grace period: the worker reconnects with backoff after the restart.
  const std::vector<std::string> grace = {"--reconcile-grace", "15s"};
  StartCoordinator(0, grace);
  StartWorker("a");
  TinySpec running = ServiceSpec("running"), queued = ServiceSpec("queued");
  running.steps = 4000;
  running.log_every = 50;
  running.checkpoint_every = 500;
  queued.steps = 50;
  const std::string r = Submit(running), q = Submit(queued);
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> job = GetJob(r);
        return job.has_value() && job->last_metrics().step() >= 500;
      },
      std::chrono::seconds(120)));
  EXPECT_EQ(StateOf(q), v1::JOB_STATE_PENDING);
  const int port = grpc_port_;
  const int64_t step_at_kill = GetJob(r)->last_metrics().step();
  coordinator_->Kill();
  std::printf("killed the coordinator at step %lld of job %s\n",
              static_cast<long long>(step_at_kill), r.c_str());
  StartCoordinator(port, grace);

  const Finished listed = Moetrain({"jobs", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  std::set<std::string> ids;
  const json jobs = json::parse(listed.out);
  for (const json& job : jobs.at("jobs")) {
    ids.insert(job.at("id").get<std::string>());
  }
  EXPECT_EQ(ids, (std::set<std::string>{r, q})) << listed.out;

  ASSERT_TRUE(WaitForState(r, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(180)))
      << coordinator_->Log();
  ASSERT_TRUE(WaitForState(q, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(60)))
      << coordinator_->Log();
  // The worker kept training through the outage and the new coordinator took it back.
  EXPECT_EQ(GetJob(r)->restarts(), 0);
  EXPECT_EQ(GetJob(r)->attempt(), 1);
  EXPECT_EQ(GetJob(r)->last_metrics().step(), 4000);
}

}  // namespace
}  // namespace moetrain::testutil
