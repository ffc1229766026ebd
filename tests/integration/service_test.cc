// The service end to end, with real processes on 127.0.0.1: jobs submitted through the CLI train
// on `moetrain-worker`s under `moetrain-coordinator`; gang scheduling; cancel; and the requests
// the coordinator must refuse. Faults (kill -9) are in fault_test.cc, Prometheus in
// prometheus_test.cc.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

// The step lines of `--json` output, by step; a step printed twice fails the test.
std::map<int64_t, json> StepLines(const std::string& out) {
  std::map<int64_t, json> steps;
  for (const json& line : JsonLines(out)) {
    if (!line.contains("loss") || line.contains("summary")) continue;
    const int64_t step = line.at("step").get<int64_t>();
    EXPECT_TRUE(steps.emplace(step, line).second) << "step " << step << " printed twice";
  }
  return steps;
}

TEST_F(ServiceTest, ASubmittedJobTrainsToSucceededAndItsLogsShowEveryStepOnce) {
  StartCoordinator();
  StartWorker("w1");
  TinySpec job = ServiceSpec();
  job.steps = 60;
  const Finished followed =
      Moetrain({"submit", WriteSpec(job).string(), "--id", "follow-1", "--follow", "--json"});
  ASSERT_EQ(followed.exit_code, 0) << followed.err;
  const std::vector<json> lines = JsonLines(followed.out);
  ASSERT_FALSE(lines.empty());
  const std::string job_id = lines.front().value("id", "");
  ASSERT_FALSE(job_id.empty()) << "submit --json prints the job first: " << lines.front();
  std::map<int64_t, json> steps = StepLines(followed.out);
  ASSERT_EQ(steps.size(), 60u);
  EXPECT_EQ(steps.begin()->first, 1);
  EXPECT_EQ(steps.rbegin()->first, 60);
  EXPECT_EQ(steps.at(60).at("tokens_seen"), 60 * 4 * 32);
  EXPECT_EQ(StateOf(job_id), v1::JOB_STATE_SUCCEEDED);

  // The recorded history, and following a job that is already over.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"logs", job_id, "--json"},
        std::vector<std::string>{"logs", job_id, "-f", "--json"}}) {
    const Finished logs = Moetrain(args);
    ASSERT_EQ(logs.exit_code, 0) << logs.err;
    const std::map<int64_t, json> logged = StepLines(logs.out);
    ASSERT_EQ(logged.size(), 60u) << args[2];
    for (const auto& [step, line] : logged) {
      EXPECT_EQ(line.at("loss").dump(), steps.at(step).at("loss").dump()) << "step " << step;
    }
  }
  // The checkpoints are on disk where the coordinator says, written by the worker.
  const Finished checkpoints = Moetrain({"checkpoints", job_id, "--json"});
  ASSERT_EQ(checkpoints.exit_code, 0) << checkpoints.err;
  const json listed = json::parse(checkpoints.out);
  ASSERT_EQ(listed.at("checkpoints").size(), 3u);  // steps 20, 40, 60
  for (const json& checkpoint : listed.at("checkpoints")) {
    EXPECT_TRUE(fs::exists(fs::path(checkpoint.at("path").get<std::string>()) / "manifest.json"))
        << checkpoint;
  }
}

TEST_F(ServiceTest, TwoJobsOnOneWorkerRunOneAfterTheOther) {
  StartCoordinator();
  StartWorker("w1");
  TinySpec first = ServiceSpec("first"), second = ServiceSpec("second");
  first.steps = second.steps = 300;
  const std::string a = Submit(first), b = Submit(second);
  ASSERT_TRUE(WaitForState(a, v1::JOB_STATE_SUCCEEDED)) << coordinator_->Log();
  ASSERT_TRUE(WaitForState(b, v1::JOB_STATE_SUCCEEDED)) << coordinator_->Log();
  const std::vector<v1::JobEvent> a_events = Events(a), b_events = Events(b);
  const v1::JobEvent* a_done = FirstTransitionTo(a_events, v1::JOB_STATE_SUCCEEDED);
  const v1::JobEvent* b_scheduled = FirstTransitionTo(b_events, v1::JOB_STATE_SCHEDULED);
  ASSERT_NE(a_done, nullptr);
  ASSERT_NE(b_scheduled, nullptr);
  EXPECT_GE(EventMicros(*b_scheduled), EventMicros(*a_done))
      << "the second job started before the first had finished";
}

TEST_F(ServiceTest, AGangWaitsForEnoughFreeWorkersAndLaterJobsDoNotStarveIt) {
  StartCoordinator();
  StartWorker("w1");
  TinySpec blocker = ServiceSpec("blocker"), gang = ServiceSpec("gang");
  TinySpec later = ServiceSpec("later");
  blocker.steps = 1000000;  // until cancelled
  blocker.log_every = 100;
  blocker.checkpoint_every = 0;
  gang.workers = 2;
  gang.max_restarts = 0;
  later.steps = 20;
  const std::string b = Submit(blocker);
  ASSERT_TRUE(WaitForState(b, v1::JOB_STATE_RUNNING));
  const std::string g = Submit(gang);
  // One worker registered: the gang says why it waits.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const v1::JobEvent& event : Events(g)) {
          if (event.log_line().text().find("needs 2 CPU workers, 1 registered") !=
              std::string::npos) {
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(30)));
  // A second worker, free while the blocker runs: the gang still cannot start, and it keeps
  // that worker for itself, so a later small job does not take it.
  StartWorker("w2");
  const std::string l = Submit(later);
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const v1::WorkerInfo& worker : Workers()) {
          if (worker.name() == "w2" && worker.state() == v1::WORKER_STATE_IDLE) return true;
        }
        return false;
      },
      std::chrono::seconds(30)));
  // Scheduling passes run within a fraction of a second of a change: give them several.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(StateOf(b), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(StateOf(g), v1::JOB_STATE_PENDING);
  EXPECT_EQ(StateOf(l), v1::JOB_STATE_PENDING) << "the later job took the gang's worker";
  ASSERT_EQ(Moetrain({"cancel", b}).exit_code, 0);
  // Both workers free once the blocker's rank has stopped: the gang starts on both at once and
  // trains; the later job runs after it.
  ASSERT_TRUE(WaitForState(g, v1::JOB_STATE_SUCCEEDED)) << coordinator_->Log();
  ASSERT_TRUE(WaitForState(l, v1::JOB_STATE_SUCCEEDED)) << coordinator_->Log();
  const std::vector<v1::JobEvent> gang_events = Events(g);
  const v1::JobEvent* scheduled = FirstTransitionTo(gang_events, v1::JOB_STATE_SCHEDULED);
  ASSERT_NE(scheduled, nullptr);
  std::set<std::string> gang_workers;
  for (const v1::WorkerInfo& worker : Workers()) {
    if (scheduled->state_change().reason().find(worker.id()) != std::string::npos) {
      gang_workers.insert(worker.name());
    }
  }
  EXPECT_EQ(gang_workers, (std::set<std::string>{"w1", "w2"}))
      << scheduled->state_change().reason();
  EXPECT_GE(EventMicros(*scheduled),
            EventMicros(*FirstTransitionTo(Events(b), v1::JOB_STATE_CANCELLED)));
  EXPECT_GE(EventMicros(*FirstTransitionTo(Events(l), v1::JOB_STATE_SCHEDULED)),
            EventMicros(*scheduled))
      << "the later job started before the gang that was ahead of it";
}

TEST_F(ServiceTest, CancelStopsTheRankAndFreesTheWorker) {
  StartCoordinator();
  Daemon& worker = StartWorker("w1");
  TinySpec job = ServiceSpec();
  job.steps = 1000000;
  job.log_every = 10;
  job.checkpoint_every = 0;
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> running = GetJob(id);
        return running.has_value() && running->last_metrics().step() >= 50;
      },
      std::chrono::seconds(60)));
  const Finished cancelled = Moetrain({"cancel", id, "--reason", "enough"});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  EXPECT_EQ(StateOf(id), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(GetJob(id)->state_reason(), "enough");
  // The rank stops at its next step boundary, without a checkpoint, and the worker is free.
  ASSERT_TRUE(WaitUntil(
      [&] { return worker.Log().find("ATTEMPT_OUTCOME_CANCELLED") != std::string::npos; },
      std::chrono::seconds(30)))
      << worker.Log();
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::vector<v1::WorkerInfo> workers = Workers();
        return workers.size() == 1 && workers[0].state() == v1::WORKER_STATE_IDLE;
      },
      std::chrono::seconds(30)));
  // Nothing the rank reported after the cancellation was recorded.
  bool after_cancel = false;
  for (const v1::JobEvent& event : Events(id)) {
    if (event.has_state_change() && event.state_change().to() == v1::JOB_STATE_CANCELLED) {
      after_cancel = true;
    } else {
      EXPECT_FALSE(after_cancel && event.has_step_metrics()) << event.DebugString();
    }
  }
  EXPECT_FALSE(fs::exists(dir_ / "checkpoints" / id)) << "cancel wrote a checkpoint";
  // A second cancel is refused: the job is final.
  EXPECT_EQ(Moetrain({"cancel", id}).exit_code, 2);
}

TEST_F(ServiceTest, RepeatedSubmissionsBadSpecsAndMissingTokensAreHandled) {
  StartCoordinator();
  TinySpec job = ServiceSpec();
  const std::string first = Submit(job, "same-id");
  EXPECT_EQ(Submit(job, "same-id"), first) << "a repeat returns the same job";
  TinySpec other = job;
  other.steps = 61;
  const Finished conflict =
      Moetrain({"submit", WriteSpec(other).string(), "--id", "same-id"});
  EXPECT_EQ(conflict.exit_code, 2);
  EXPECT_THAT(conflict.err, HasSubstr("ALREADY_EXISTS"));
  EXPECT_THAT(conflict.err, HasSubstr("same-id"));

  // A spec with a field out of range: refused naming the field, nothing stored.
  const fs::path bad = dir_ / "bad.yaml";
  std::string text = job.Yaml();
  text.replace(text.find("top_k: 2"), 8, "top_k: 9");
  std::ofstream(bad) << text;
  const Finished refused = Moetrain({"submit", bad.string()});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("model.moe.top_k"));

  // Without the token, or with another one: UNAUTHENTICATED, clients and workers alike.
  const Finished anonymous = Moetrain({"jobs"}, /*with_token=*/false);
  EXPECT_EQ(anonymous.exit_code, 2);
  EXPECT_THAT(anonymous.err, HasSubstr("UNAUTHENTICATED"));
  std::ofstream(dir_ / "wrong-token") << "not-the-token\n";
  Daemon impostor;
  ASSERT_EQ(impostor.Start(Binary("moetrain-worker"),
                           {"--coordinator", address(), "--token-file",
                            (dir_ / "wrong-token").string(), "--work-dir", (dir_ / "impostor").string()},
                           dir_ / "impostor.log"),
            "");
  EXPECT_EQ(impostor.WaitExit(std::chrono::seconds(30)), 1);
  EXPECT_THAT(impostor.Log(), HasSubstr("invalid bearer token"));
  EXPECT_TRUE(Workers().empty());

  const Finished listed = Moetrain({"jobs", "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_EQ(json::parse(listed.out).at("jobs").size(), 1u);
}

}  // namespace
}  // namespace moetrain::testutil
