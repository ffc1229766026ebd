// `moetrain run --stop-at-step N`, through the real binary: the run stops after step N with a
// checkpoint there, says so and how to continue, and `--resume` then ends where an uninterrupted
// run ends, bit for bit (the schedule and data order are those of train.steps throughout). Also
// the refusals: N out of range, N not beyond the resumed step, and --steps below the warmup.
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cli_fixture.h"

namespace moetrain {
namespace {

using namespace cli_testing;  // NOLINT: the fixture and its helpers

constexpr int64_t kSteps = 12;
constexpr int64_t kStopAt = 7;  // not a multiple of the checkpoint interval, nor of eval_every

TinySpec TwelveSteps() {
  TinySpec spec;
  spec.steps = kSteps;
  spec.eval_every = 4;
  spec.checkpoint_every = 5;
  return spec;
}

// The checkpoint steps of a --json run's output, in order.
std::vector<int64_t> CheckpointLines(const std::vector<json>& lines) {
  std::vector<int64_t> steps;
  for (const json& line : lines) {
    if (line.contains("checkpoint") && !line.contains("summary")) {
      steps.push_back(line.at("step").get<int64_t>());
    }
  }
  return steps;
}

TEST_F(CliTest, StopAtStepThenResumeEqualsAnUninterruptedRun) {
  const std::string spec_path = WriteSpec(TwelveSteps());
  const Finished reference = RunOk(spec_path, dir_ / "reference");
  ASSERT_EQ(reference.exit_code, 0);
  const std::map<int64_t, json> expected = StepLines(JsonLines(reference.out));
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));

  const fs::path checkpoints = dir_ / "stopped";
  const Finished stopped =
      RunOk(spec_path, checkpoints, {"--stop-at-step", std::to_string(kStopAt)});
  ASSERT_EQ(stopped.exit_code, 0);
  const std::vector<json> first_lines = JsonLines(stopped.out);
  const std::map<int64_t, json> first_part = StepLines(first_lines);
  ASSERT_EQ(first_part.size(), static_cast<size_t>(kStopAt)) << stopped.out;
  EXPECT_EQ(first_part.rbegin()->first, kStopAt);
  EXPECT_EQ(CheckpointLines(first_lines), (std::vector<int64_t>{5, kStopAt}));
  EXPECT_EQ(Entries(checkpoints / "tiny"),
            (std::set<std::string>{StepDirName(5), StepDirName(kStopAt)}));
  ASSERT_GE(first_lines.size(), 2u);
  const json& summary = first_lines.back();
  ASSERT_TRUE(summary.value("summary", false)) << summary;
  EXPECT_EQ(summary.at("stopped"), true);
  EXPECT_EQ(summary.at("steps"), kStopAt);
  EXPECT_EQ(summary.at("checkpoint"), (checkpoints / "tiny" / StepDirName(kStopAt)).string());
  const std::string message = first_lines[first_lines.size() - 2].value("message", "");
  EXPECT_TRUE(Contains(message, "stopped at step 7 of 12")) << message;
  EXPECT_TRUE(Contains(message, "moetrain run " + spec_path + " --resume")) << message;

  // --resume must go beyond the step it resumes from; the refusal changes nothing.
  const std::map<std::string, std::string> before = Snapshot(checkpoints);
  const Finished again =
      Moetrain({"run", spec_path, "--checkpoint-dir", checkpoints.string(), "--json", "--resume",
                "--stop-at-step", std::to_string(kStopAt)});
  EXPECT_EQ(again.exit_code, 2) << again.err;
  EXPECT_TRUE(Contains(again.err, "--stop-at-step = 7 is not beyond step 7")) << again.err;
  EXPECT_EQ(CountStepLines(again.out), 0) << again.out;
  EXPECT_TRUE(Snapshot(checkpoints) == before) << "a refused run changed the checkpoints";
  // Nor may --steps end below it: there is nothing to train, and no checkpoint to end on.
  const Finished shorter =
      Moetrain({"run", spec_path, "--checkpoint-dir", checkpoints.string(), "--json", "--resume",
                "--steps", "6"});
  EXPECT_EQ(shorter.exit_code, 2) << shorter.err;
  EXPECT_TRUE(Contains(shorter.err, "train.steps = 6 (--steps) is below step 7")) << shorter.err;
  EXPECT_TRUE(Snapshot(checkpoints) == before) << "a refused run changed the checkpoints";

  const Finished resumed = RunOk(spec_path, checkpoints, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0);
  const std::vector<json> second_lines = JsonLines(resumed.out);
  const std::map<int64_t, json> second_part = StepLines(second_lines);
  ASSERT_FALSE(second_part.empty());
  EXPECT_EQ(second_part.begin()->first, kStopAt + 1);
  EXPECT_EQ(second_part.rbegin()->first, kSteps);
  EXPECT_EQ(second_part.size(), static_cast<size_t>(kSteps - kStopAt));
  // The checkpoint it resumed from is reported first (the in-process coordinator is new).
  EXPECT_EQ(CheckpointLines(second_lines), (std::vector<int64_t>{kStopAt, 10, kSteps}));
  ASSERT_FALSE(second_lines.empty());
  EXPECT_EQ(second_lines.back().at("stopped"), false);
  EXPECT_EQ(second_lines.back().at("steps"), kSteps);

  // JSON numbers print as the shortest string that reads back to the same double: equal text is
  // equal bits. The evaluations (every 4 steps) match too: none was added at the stop.
  for (const std::map<int64_t, json>* part : {&first_part, &second_part}) {
    for (const auto& [step, line] : *part) {
      ASSERT_TRUE(expected.contains(step));
      const json& want = expected.at(step);
      for (const char* key : {"loss", "eval_loss", "grad_norm", "lr", "aux_loss", "tokens_seen"}) {
        EXPECT_EQ(line.at(key).dump(), want.at(key).dump()) << "step " << step << " " << key;
      }
    }
  }
  // The final checkpoints' weights and optimizer moments, byte for byte.
  for (const char* file : {"model-rank00000.safetensors", "optim-rank00000.safetensors"}) {
    const std::string path = "tiny/" + StepDirName(kSteps) + "/" + file;
    EXPECT_TRUE(ReadFile(checkpoints / path) == ReadFile(dir_ / "reference" / path))
        << path << " of the stopped and resumed run differs from the uninterrupted run's";
  }
}

TEST_F(CliTest, StopAtStepSaysInTextWhereItStoppedAndHowToContinue) {
  const std::string spec_path = WriteSpec(TwelveSteps());
  const fs::path checkpoints = dir_ / "ckpt";
  const Finished run = Moetrain({"run", spec_path, "--checkpoint-dir", checkpoints.string(),
                                 "--stop-at-step", "2", "--memory-limit", "4GiB"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(Contains(run.out, "stopping after step 2")) << run.out;
  EXPECT_TRUE(Contains(run.out, "stopped at step 2 of 12 in ")) << run.out;
  // The continuing command keeps what the run was given, the memory limit included.
  EXPECT_TRUE(Contains(run.out, "continue with: moetrain run " + spec_path +
                                    " --resume --checkpoint-dir " + checkpoints.string() +
                                    " --memory-limit 4GiB"))
      << run.out;
  EXPECT_FALSE(Contains(run.out, "done:")) << run.out;
  EXPECT_EQ(Entries(checkpoints / "tiny"), std::set<std::string>{StepDirName(2)});
}

TEST_F(CliTest, StopAtStepOutOfRangeExitsTwoNamingTheFlag) {
  const std::string spec_path = WriteSpec(TwelveSteps());
  struct Case {
    std::vector<std::string> flags;
    std::string error;  // stderr must hold it
  };
  for (const Case& c : {Case{{"--stop-at-step", "0"}, "--stop-at-step = 0 is not in [1, "},
                        Case{{"--stop-at-step", "13"},
                             "--stop-at-step = 13 is not in [1, "
                             "train.steps = 12]"},
                        Case{{"--steps", "5", "--stop-at-step", "6"},
                             "--stop-at-step = 6 is not in [1, train.steps = 5 (--steps)]"}}) {
    std::vector<std::string> args = {"run", spec_path, "--checkpoint-dir", (dir_ / "ckpt").string(),
                                     "--json"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    SCOPED_TRACE(::testing::PrintToString(c.flags));
    const Finished run = Moetrain(args);
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_TRUE(Contains(run.err, c.error)) << run.err;
    EXPECT_EQ(CountStepLines(run.out), 0) << run.out;
    EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "tiny"));
  }
}

TEST_F(CliTest, StepsBelowTheWarmupExitsTwoPointingToStopAtStep) {
  const std::string spec_path = WriteSpec(TwelveSteps());  // train.optimizer.warmup_steps 2
  const Finished run =
      Moetrain({"run", spec_path, "--checkpoint-dir", (dir_ / "ckpt").string(), "--steps", "1"});
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_TRUE(Contains(run.err, "train.optimizer.warmup_steps = 2")) << run.err;
  EXPECT_TRUE(Contains(run.err, "pass --stop-at-step 1")) << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "tiny"));
}

}  // namespace
}  // namespace moetrain
