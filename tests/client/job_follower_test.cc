// FollowJob through `moetrain logs -f` and `moetrain submit --follow` of the real binary, following
// a job that the test drives through the real WorkerService protocol: every step printed exactly
// once, across a coordinator restart too; giving up on a coordinator that stays away; and the exit
// code of each way a job ends.
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"

namespace moetrain::testutil {
namespace {

using nlohmann::json;

// The keys of a step line, exactly as `moetrain run --json` prints them.
const std::set<std::string> kStepKeys = {"step",
                                         "loss",
                                         "eval_loss",
                                         "lr",
                                         "grad_norm",
                                         "tokens_per_s",
                                         "expert_load_max_over_mean",
                                         "aux_loss",
                                         "tokens_seen"};

bool IsStepLine(const json& line) { return line.contains("loss"); }

int CountStepLines(const std::string& out) {
  int count = 0;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) count += Contains(line, "\"loss\":");
  return count;
}

// Checks that the step lines are steps 1..steps, each once, with the worker's metrics.
void ExpectEveryStepOnce(const std::vector<json>& lines, int64_t steps) {
  std::map<int64_t, int> seen;
  for (const json& line : lines) {
    if (!IsStepLine(line)) continue;
    std::set<std::string> keys;
    for (const auto& [key, value] : line.items()) keys.insert(key);
    EXPECT_EQ(keys, kStepKeys) << line.dump();
    const int64_t step = line.at("step").get<int64_t>();
    ++seen[step];
    const v1::StepMetrics expected = TestStepMetrics(step);
    EXPECT_EQ(line.at("loss").get<double>(), expected.loss()) << line.dump();
    EXPECT_EQ(line.at("tokens_seen").get<int64_t>(), expected.tokens_seen()) << line.dump();
    if (expected.has_eval_loss()) {
      EXPECT_EQ(line.at("eval_loss").get<double>(), expected.eval_loss()) << line.dump();
    } else {
      EXPECT_TRUE(line.at("eval_loss").is_null()) << line.dump();
    }
  }
  for (int64_t step = 1; step <= steps; ++step) {
    EXPECT_EQ(seen[step], 1) << "step " << step << " printed " << seen[step] << " times";
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(steps));
}

// The states of the {"state": ...} lines, in order.
std::vector<std::string> States(const std::vector<json>& lines) {
  std::vector<std::string> states;
  for (const json& line : lines) {
    if (line.contains("state")) states.push_back(line.at("state"));
  }
  return states;
}

using LogsFollowTest = ClientTest;

TEST_F(LogsFollowTest, FollowPrintsEveryStepOnceAndEndsWithTheJob) {
  constexpr int64_t kSteps = 12;
  std::unique_ptr<TestWorker> worker = RegisterWorker();
  ASSERT_NE(worker, nullptr);
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", kSteps)));
  ASSERT_FALSE(id.empty());

  Child follower(MoetrainBinary());
  ASSERT_EQ(follower.Start(Args({"logs", id, "-f", "--json"}), dir_, CleanEnv()), "");
  absl::StatusOr<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  for (int64_t step = 1; step <= kSteps; ++step) {
    ASSERT_TRUE(worker->ReportStep(step).ok()) << step;
    if (step % 5 == 0) {
      ASSERT_TRUE(worker->ReportCheckpoint(step).ok()) << step;
    }
  }
  ASSERT_TRUE(worker->ReportCheckpoint(kSteps).ok());
  ASSERT_TRUE(worker->ReportAttemptEnd(v1::ATTEMPT_OUTCOME_SUCCEEDED, kSteps).ok());

  const Finished finished = follower.Wait(kCommandTimeout);
  ASSERT_FALSE(finished.timed_out) << finished.err;
  EXPECT_EQ(finished.exit_code, 0) << finished.err;
  const std::vector<json> lines = JsonLines(finished.out);
  ExpectEveryStepOnce(lines, kSteps);
  std::vector<int64_t> checkpoints;
  for (const json& line : lines) {
    if (line.contains("checkpoint")) {
      EXPECT_EQ(line.at("checkpoint"), absl::StrFormat("%s/step-%08d", assignment->checkpoint_dir(),
                                                       line.at("step").get<int64_t>()));
      checkpoints.push_back(line.at("step"));
    }
  }
  EXPECT_EQ(checkpoints, (std::vector<int64_t>{5, 10, 12}));
  const std::vector<std::string> states = States(lines);
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.front(), "PENDING");
  EXPECT_EQ(states.back(), "SUCCEEDED");
  EXPECT_EQ(lines.back().value("state", ""), "SUCCEEDED") << "the final state is the last line";

  // Without -f, the recorded history again, the same lines.
  const Finished replay = Moetrain(Args({"logs", id, "--json"}));
  EXPECT_EQ(replay.exit_code, 0) << replay.err;
  EXPECT_EQ(replay.out, finished.out);
  // And as text: one line per step (not a terminal), the states and the checkpoints.
  const Finished text = Moetrain(Args({"logs", id}));
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_TRUE(Contains(text.out, absl::StrCat("step 1/", kSteps, "  loss 3.9844"))) << text.out;
  EXPECT_TRUE(Contains(text.out, "state SUCCEEDED")) << text.out;
  EXPECT_TRUE(Contains(text.out, "checkpoint ")) << text.out;
}

TEST_F(LogsFollowTest, FollowSurvivesACoordinatorRestart) {
  constexpr int64_t kSteps = 10, kBeforeRestart = 4;
  std::unique_ptr<TestWorker> worker = RegisterWorker();
  ASSERT_NE(worker, nullptr);
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", kSteps)));
  ASSERT_FALSE(id.empty());
  absl::StatusOr<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();

  Child follower(MoetrainBinary());
  ASSERT_EQ(follower.Start(Args({"logs", id, "--follow", "--json"}), dir_, CleanEnv()), "");
  for (int64_t step = 1; step <= kBeforeRestart; ++step) {
    ASSERT_TRUE(worker->ReportStep(step).ok()) << step;
  }
  // The follower has the stream open and has printed everything so far...
  ASSERT_TRUE(follower.WaitForStdout(
      [](const std::string& out) { return CountStepLines(out) >= kBeforeRestart; },
      kCommandTimeout))
      << follower.err();

  // ...when the coordinator goes away and comes back on the same port and state file.
  const int port = port_;
  StopCoordinator();
  StartCoordinator(port);
  ASSERT_EQ(port_, port);
  // The worker's heartbeats tell the restarted coordinator that the attempt still runs.
  ASSERT_TRUE(worker->AwaitHeartbeat(absl::Seconds(30)).ok());

  for (int64_t step = kBeforeRestart + 1; step <= kSteps; ++step) {
    ASSERT_TRUE(worker->ReportStep(step).ok()) << step;
  }
  ASSERT_TRUE(worker->ReportCheckpoint(kSteps).ok());
  ASSERT_TRUE(worker->ReportAttemptEnd(v1::ATTEMPT_OUTCOME_SUCCEEDED, kSteps).ok());

  const Finished finished = follower.Wait(kCommandTimeout);
  ASSERT_FALSE(finished.timed_out) << finished.err;
  EXPECT_EQ(finished.exit_code, 0) << finished.err;
  const std::vector<json> lines = JsonLines(finished.out);
  ExpectEveryStepOnce(lines, kSteps);
  // The whole history exactly once: what was followed is what is recorded.
  EXPECT_EQ(finished.out, Moetrain(Args({"logs", id, "--json"})).out);
  EXPECT_EQ(States(lines).back(), "SUCCEEDED");
}

TEST_F(LogsFollowTest, FollowGivesUpWhenTheCoordinatorStaysAway) {
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 10)));
  ASSERT_FALSE(id.empty());
  Child follower(MoetrainBinary());
  ASSERT_EQ(follower.Start(Args({"logs", id, "-f", "--reconnect-timeout", "1s"}), dir_, CleanEnv()),
            "");
  ASSERT_TRUE(follower.WaitForStdout(
      [](const std::string& out) { return Contains(out, "state PENDING"); }, kCommandTimeout))
      << follower.err();
  StopCoordinator();
  const Finished finished = follower.Wait(kCommandTimeout);
  ASSERT_FALSE(finished.timed_out) << finished.err;
  EXPECT_EQ(finished.exit_code, 3) << finished.err;
  EXPECT_TRUE(Contains(finished.err, "unreachable")) << finished.err;
  EXPECT_TRUE(Contains(finished.err, id)) << finished.err;
}

TEST_F(LogsFollowTest, SubmitFollowExitsOneWhenTheJobIsCancelled) {
  const std::string spec = WriteSpec(TinySpecYaml("tiny", 10));
  Child follower(MoetrainBinary());
  ASSERT_EQ(follower.Start(Args({"submit", spec, "--follow", "--json"}), dir_, CleanEnv()), "");
  // The first line is the submitted Job; the events follow.
  ASSERT_TRUE(follower.WaitForStdout(
      [](const std::string& out) { return Contains(out, "\"state\":\"PENDING\""); },
      kCommandTimeout))
      << follower.err();
  const std::string first_line = follower.out().substr(0, follower.out().find('\n'));
  const json job = json::parse(first_line, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(job.is_object()) << first_line;
  const std::string id = job.value("id", "");
  ASSERT_FALSE(id.empty());

  const Finished cancel = Moetrain(Args({"cancel", id, "--reason", "test over"}));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  const Finished finished = follower.Wait(kCommandTimeout);
  ASSERT_FALSE(finished.timed_out) << finished.err;
  EXPECT_EQ(finished.exit_code, 1) << finished.err;
  EXPECT_TRUE(Contains(finished.err, "CANCELLED")) << finished.err;
  const std::vector<json> lines = JsonLines(finished.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), json({{"state", "CANCELLED"}, {"reason", "test over"}}));
}

}  // namespace
}  // namespace moetrain::testutil
