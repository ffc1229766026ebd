// Drives the real `moetrain` binary as a child process, the way a person or a script does:
// `moetrain run` (JSON lines, checkpoints in the Hugging Face layout), the refusal to train over
// a job's checkpoints, stop by signal and exact resume, checkpoint.init_from, spec errors.
// `moetrain eval`, `export` and `import` are cli_eval_test.cc's.
//
// Every test works in a fresh directory under ::testing::TempDir() (the child's working directory
// too) and removes it at the end. A child that outlives its deadline is killed and fails the test.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cli_fixture.h"

namespace moetrain {
namespace {

using namespace cli_testing;  // NOLINT: the fixture and its helpers

TEST_F(CliTest, RunPrintsJsonLinesAndWritesHuggingFaceCheckpoints) {
  const TinySpec spec;  // 40 steps, eval and checkpoint every 10, keep_last 3
  const fs::path checkpoints = dir_ / "ckpt";
  const Finished run = RunOk(WriteSpec(spec), checkpoints);
  ASSERT_EQ(run.exit_code, 0);

  const std::vector<json> lines = JsonLines(run.out);
  ASSERT_FALSE(lines.empty());
  const std::map<int64_t, json> steps = StepLines(lines);
  ASSERT_EQ(steps.size(), 40u) << "log_every 1 prints every step";
  EXPECT_EQ(steps.begin()->first, 1);
  EXPECT_EQ(steps.rbegin()->first, 40);
  for (const auto& [step, line] : steps) {
    SCOPED_TRACE(line.dump());
    ASSERT_TRUE(line.at("loss").is_number());
    EXPECT_TRUE(std::isfinite(line.at("loss").get<double>()));
    ASSERT_TRUE(line.contains("eval_loss"));
    if (step % 10 == 0) {
      ASSERT_TRUE(line.at("eval_loss").is_number());
      EXPECT_GT(line.at("eval_loss").get<double>(), 0.0);
    } else {
      EXPECT_TRUE(line.at("eval_loss").is_null());
    }
    ASSERT_TRUE(line.at("lr").is_number());
    EXPECT_GT(line.at("lr").get<double>(), 0.0);
    EXPECT_LE(line.at("lr").get<double>(), 3.0001e-3);
    ASSERT_TRUE(line.at("grad_norm").is_number());
    EXPECT_GT(line.at("grad_norm").get<double>(), 0.0);
    ASSERT_TRUE(line.at("tokens_per_s").is_number());
    EXPECT_GT(line.at("tokens_per_s").get<double>(), 0.0);
    // max / mean over E = 4 experts lies in [1, 4].
    ASSERT_TRUE(line.at("expert_load_max_over_mean").is_number());
    EXPECT_GE(line.at("expert_load_max_over_mean").get<double>(), 1.0);
    EXPECT_LE(line.at("expert_load_max_over_mean").get<double>(), 4.0);
  }
  const double first_loss = steps.at(1).at("loss").get<double>();
  const double last_loss = steps.at(40).at("loss").get<double>();
  // Small initial weights give near-uniform predictions over the 64 tokens.
  EXPECT_NEAR(first_loss, std::log(64.0), 0.2);
  EXPECT_LT(last_loss, first_loss);

  const json& summary = lines.back();
  ASSERT_TRUE(summary.value("summary", false)) << "the last line is the summary: " << summary;
  EXPECT_EQ(summary.at("job"), "tiny");
  EXPECT_EQ(summary.at("steps"), 40);
  EXPECT_EQ(summary.at("tokens_seen"), 40 * 4 * 32);
  EXPECT_EQ(summary.at("final_loss"), steps.at(40).at("loss"));
  EXPECT_EQ(summary.at("eval_loss"), steps.at(40).at("eval_loss"));
  const fs::path job_dir = checkpoints / "tiny";
  EXPECT_EQ(summary.at("checkpoint"), (job_dir / StepDirName(40)).string());

  std::vector<int64_t> checkpoint_lines;
  for (const json& line : lines) {
    if (line.contains("checkpoint") && !line.contains("summary")) {
      checkpoint_lines.push_back(line.at("step").get<int64_t>());
    }
  }
  EXPECT_EQ(checkpoint_lines, (std::vector<int64_t>{10, 20, 30, 40}));

  // keep_last 3: step 10 was pruned.
  EXPECT_EQ(Entries(job_dir),
            (std::set<std::string>{StepDirName(20), StepDirName(30), StepDirName(40)}));
  const std::set<std::string> kFiles = {"manifest.json", "model-rank00000.safetensors",
                                        "optim-rank00000.safetensors", "config.json"};
  for (int64_t step : {20, 30, 40}) {
    const fs::path step_dir = job_dir / StepDirName(step);
    SCOPED_TRACE(step_dir.string());
    EXPECT_EQ(Entries(step_dir), kFiles);
    const json manifest = json::parse(ReadFile(step_dir / "manifest.json"), nullptr, false);
    ASSERT_TRUE(manifest.is_object());
    EXPECT_EQ(manifest.at("step"), step);
    EXPECT_EQ(manifest.at("job_id"), "tiny");
    EXPECT_EQ(manifest.at("tokens_seen"), step * 4 * 32);
    for (const json& file : manifest.at("files")) {
      const std::string name = file.at("name").get<std::string>();
      EXPECT_EQ(fs::file_size(step_dir / name), file.at("bytes").get<uint64_t>()) << name;
    }
  }

  const fs::path last = job_dir / StepDirName(40);
  const json config = json::parse(ReadFile(last / "config.json"), nullptr, false);
  ASSERT_TRUE(config.is_object()) << "config.json does not parse";
  const std::map<std::string, json> expected_config = {
      {"vocab_size", 64},
      {"hidden_size", 32},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 1},
      {"head_dim", 16},
      {"intermediate_size", 48},
      {"moe_intermediate_size", 24},
      {"n_routed_experts", 4},
      {"num_experts_per_tok", 2},
      {"n_shared_experts", 0},
      {"first_k_dense_replace", 1},
      {"scoring_func", "softmax"},
      {"norm_topk_prob", true},
      {"n_group", 1},
      {"topk_group", 1},
      {"max_position_embeddings", 32},
      {"tie_word_embeddings", false},
  };
  for (const auto& [key, value] : expected_config) {
    ASSERT_TRUE(config.contains(key)) << "config.json lacks " << key;
    EXPECT_EQ(config.at(key), value) << key;
  }
  // The spec's floats are f32 in the engine: compare at f32.
  const std::map<std::string, float> expected_floats = {
      {"routed_scaling_factor", 1.5f}, {"rms_norm_eps", 1e-5f}, {"rope_theta", 5000.0f}};
  for (const auto& [key, value] : expected_floats) {
    ASSERT_TRUE(config.contains(key) && config.at(key).is_number()) << "config.json: " << key;
    EXPECT_FLOAT_EQ(config.at(key).get<float>(), value) << key;
  }

  // D = 32, V = 64, dense F = 48, expert F = 24, E = 4, 2 query heads and 1 kv head of 16.
  using Shape = std::vector<int64_t>;
  std::map<std::string, Shape> expected_tensors = {
      {"model.embed_tokens.weight", {64, 32}},
      {"model.layers.0.mlp.gate_proj.weight", {48, 32}},
      {"model.layers.0.mlp.up_proj.weight", {48, 32}},
      {"model.layers.0.mlp.down_proj.weight", {32, 48}},
      {"model.layers.1.mlp.gate.weight", {4, 32}},
      {"model.norm.weight", {32}},
      {"lm_head.weight", {64, 32}},
  };
  for (int layer = 0; layer < 2; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    expected_tensors[prefix + "input_layernorm.weight"] = {32};
    expected_tensors[prefix + "post_attention_layernorm.weight"] = {32};
    expected_tensors[prefix + "self_attn.q_proj.weight"] = {32, 32};
    expected_tensors[prefix + "self_attn.k_proj.weight"] = {16, 32};
    expected_tensors[prefix + "self_attn.v_proj.weight"] = {16, 32};
    expected_tensors[prefix + "self_attn.o_proj.weight"] = {32, 32};
  }
  for (int expert = 0; expert < 4; ++expert) {
    const std::string prefix = "model.layers.1.mlp.experts." + std::to_string(expert) + ".";
    expected_tensors[prefix + "gate_proj.weight"] = {24, 32};
    expected_tensors[prefix + "up_proj.weight"] = {24, 32};
    expected_tensors[prefix + "down_proj.weight"] = {32, 24};
  }
  const json model = SafetensorsHeader(last / "model-rank00000.safetensors");
  ASSERT_TRUE(model.is_object());
  std::map<std::string, Shape> model_tensors;
  for (const auto& [name, info] : model.items()) {
    if (name != "__metadata__") model_tensors[name] = info.at("shape").get<Shape>();
  }
  EXPECT_EQ(model_tensors, expected_tensors);
  EXPECT_EQ(model.value("__metadata__", json::object()).value("format", ""), "pt");

  // The optimizer file holds both Adam moments of every (trainable) parameter.
  const json optim = SafetensorsHeader(last / "optim-rank00000.safetensors");
  ASSERT_TRUE(optim.is_object());
  for (const auto& [name, shape] : expected_tensors) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      ASSERT_TRUE(optim.contains(name + suffix)) << name + suffix;
      EXPECT_EQ(optim.at(name + suffix).at("shape").get<Shape>(), shape) << name + suffix;
    }
  }
}

TEST_F(CliTest, RunRefusesToTrainOverCheckpointsWithoutResume) {
  TinySpec spec;
  spec.steps = 20;
  const std::string spec_path = WriteSpec(spec);
  const fs::path checkpoints = dir_ / "ckpt";
  ASSERT_EQ(RunOk(spec_path, checkpoints).exit_code, 0);
  const std::map<std::string, std::string> before = Snapshot(checkpoints);
  ASSERT_EQ(Entries(checkpoints / "tiny"),
            (std::set<std::string>{StepDirName(10), StepDirName(20)}));

  const Finished again = Moetrain({"run", spec_path, "--checkpoint-dir", checkpoints, "--json"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_EQ(again.term_signal, 0);
  EXPECT_TRUE(Contains(again.err, "--resume")) << again.err;
  EXPECT_TRUE(Contains(again.err, (checkpoints / "tiny").string())) << again.err;
  EXPECT_EQ(CountStepLines(again.out), 0) << again.out;

  const std::map<std::string, std::string> after = Snapshot(checkpoints);
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [file, contents] : before) {
    ASSERT_TRUE(after.contains(file)) << file << " was removed";
    EXPECT_EQ(after.at(file).size(), contents.size()) << file;
    EXPECT_TRUE(after.at(file) == contents) << file << " changed";
  }
}

TEST_F(CliTest, ResumeOfAFinishedJobExitsZeroWithoutTraining) {
  TinySpec spec;
  spec.steps = 20;
  const std::string spec_path = WriteSpec(spec);
  const fs::path checkpoints = dir_ / "ckpt";
  ASSERT_EQ(RunOk(spec_path, checkpoints).exit_code, 0);
  const std::map<std::string, std::string> before = Snapshot(checkpoints);

  // The newest checkpoint is the last step: nothing to train, and nothing to write.
  const Finished again = RunOk(spec_path, checkpoints, {"--resume"});
  ASSERT_EQ(again.exit_code, 0);
  const std::vector<json> lines = JsonLines(again.out);
  EXPECT_EQ(CountStepLines(again.out), 0) << again.out;
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(lines.back().value("summary", false));
  EXPECT_EQ(lines.back().at("steps"), 20);
  EXPECT_TRUE(Snapshot(checkpoints) == before) << "the checkpoints changed";
}

TEST_F(CliTest, KeepLastZeroKeepsEveryCheckpoint) {
  TinySpec spec;  // 40 steps, a checkpoint every 10
  spec.keep_last = 0;
  const fs::path checkpoints = dir_ / "ckpt";
  ASSERT_EQ(RunOk(WriteSpec(spec), checkpoints).exit_code, 0);
  EXPECT_EQ(
      Entries(checkpoints / "tiny"),
      (std::set<std::string>{StepDirName(10), StepDirName(20), StepDirName(30), StepDirName(40)}));
}

// Starts a long run, signals it with `sig` after a few step lines, checks that it stops cleanly
// with a checkpoint of the step it reached, resumes it to the end, and checks that the losses of
// both parts equal those of an uninterrupted run of the same spec, as printed.
class StopResumeTest : public CliTest, public ::testing::WithParamInterface<int> {};

TEST_P(StopResumeTest, StopsWithACheckpointAndResumesBitIdentically) {
  const int sig = GetParam();
  TinySpec spec;
  spec.steps = 300;
  spec.eval_every = 50;
  spec.checkpoint_every = 0;  // only the final (or stop) checkpoint
  const std::string spec_path = WriteSpec(spec);

  const Finished reference = RunOk(spec_path, dir_ / "reference");
  ASSERT_EQ(reference.exit_code, 0);
  const std::map<int64_t, json> expected = StepLines(JsonLines(reference.out));
  ASSERT_EQ(expected.size(), 300u);

  const fs::path checkpoints = dir_ / "stopped";
  int64_t stopped_at = 0;
  std::map<int64_t, json> first_part;
  {
    Child child(MoetrainBinary());
    ASSERT_EQ(child.Start({"run", spec_path, "--checkpoint-dir", checkpoints, "--json"}, dir_,
                          OneThreadUnlessChosen()),
              "");
    ASSERT_TRUE(child.WaitForStdout([](const std::string& out) { return CountStepLines(out) >= 5; },
                                    kRunTimeout))
        << "no step lines; stderr:\n"
        << child.err();
    child.Signal(sig);
    const Clock::time_point signalled = Clock::now();
    const Finished stopped = child.Wait(seconds(10));
    ASSERT_FALSE(stopped.timed_out) << "still running 10 s after signal " << sig;
    EXPECT_LT(Clock::now() - signalled, seconds(5));
    ASSERT_EQ(stopped.term_signal, 0) << "killed by signal " << stopped.term_signal;
    ASSERT_EQ(stopped.exit_code, 0) << stopped.err;

    const std::vector<json> lines = JsonLines(stopped.out);
    first_part = StepLines(lines);
    ASSERT_FALSE(first_part.empty());
    stopped_at = first_part.rbegin()->first;
    ASSERT_LT(stopped_at, 300) << "the run ended before the signal took effect";
    EXPECT_EQ(first_part.size(), static_cast<size_t>(stopped_at)) << "a step line is missing";
    ASSERT_FALSE(lines.empty());
    const json& summary = lines.back();
    ASSERT_TRUE(summary.value("summary", false)) << summary;
    EXPECT_EQ(summary.at("steps"), stopped_at);
    EXPECT_EQ(summary.at("checkpoint"), (checkpoints / "tiny" / StepDirName(stopped_at)).string());
  }
  EXPECT_EQ(Entries(checkpoints / "tiny"), std::set<std::string>{StepDirName(stopped_at)});
  const json manifest = json::parse(
      ReadFile(checkpoints / "tiny" / StepDirName(stopped_at) / "manifest.json"), nullptr, false);
  ASSERT_TRUE(manifest.is_object());
  EXPECT_EQ(manifest.at("step"), stopped_at);

  const Finished resumed = RunOk(spec_path, checkpoints, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0);
  const std::vector<json> lines = JsonLines(resumed.out);
  const std::map<int64_t, json> second_part = StepLines(lines);
  ASSERT_FALSE(second_part.empty());
  EXPECT_EQ(second_part.begin()->first, stopped_at + 1);
  EXPECT_EQ(second_part.rbegin()->first, 300);
  EXPECT_EQ(second_part.size(), static_cast<size_t>(300 - stopped_at));
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(lines.back().value("summary", false));
  EXPECT_EQ(lines.back().at("steps"), 300);

  // JSON numbers print as the shortest string that reads back to the same double: equal text is
  // equal bits.
  for (const std::map<int64_t, json>* part : {&std::as_const(first_part), &second_part}) {
    for (const auto& [step, line] : *part) {
      ASSERT_TRUE(expected.contains(step));
      const json& want = expected.at(step);
      for (const char* key : {"loss", "eval_loss", "grad_norm", "lr", "aux_loss"}) {
        EXPECT_EQ(line.at(key).dump(), want.at(key).dump()) << "step " << step << " " << key;
      }
    }
  }
  // And the final weights, byte for byte.
  const std::string final_model = "tiny/" + StepDirName(300) + "/model-rank00000.safetensors";
  EXPECT_TRUE(ReadFile(checkpoints / final_model) == ReadFile(dir_ / "reference" / final_model))
      << "the resumed run's final weights differ from the uninterrupted run's";
}

INSTANTIATE_TEST_SUITE_P(Signals, StopResumeTest, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGTERM ? "Sigterm" : "Sigint");
                         });

TEST_F(CliTest, StepsFlagOverridesTrainSteps) {
  const TinySpec spec;  // train.steps 40
  const fs::path checkpoints = dir_ / "ckpt";
  const Finished run = RunOk(WriteSpec(spec), checkpoints, {"--steps", "5"});
  ASSERT_EQ(run.exit_code, 0);
  const std::vector<json> lines = JsonLines(run.out);
  const std::map<int64_t, json> steps = StepLines(lines);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.rbegin()->first, 5);
  EXPECT_EQ(lines.back().at("steps"), 5);
  EXPECT_EQ(Entries(checkpoints / "tiny"), std::set<std::string>{StepDirName(5)});
}

// checkpoint.init_from: a new job starts from another job's step (fine-tuning): its first step's
// loss is already near where the other job ended, far below a fresh start's.
TEST_F(CliTest, InitFromStartsAJobFromAnotherJobsWeights) {
  const TinySpec pretrain;  // 40 steps
  const fs::path checkpoints = dir_ / "ckpt";
  const std::map<int64_t, json> first =
      StepLines(JsonLines(RunOk(WriteSpec(pretrain, "pretrain.yaml"), checkpoints).out));
  ASSERT_TRUE(first.contains(1) && first.contains(40));
  const double fresh = first.at(1).at("loss"), trained = first.at(40).at("loss");
  ASSERT_LT(trained, fresh - 0.5);

  TinySpec finetune;
  finetune.name = "finetune";
  finetune.steps = 4;
  finetune.checkpoint_extra =
      absl::StrCat("  init_from: ", (checkpoints / pretrain.name / StepDirName(40)).string(), "\n");
  const std::map<int64_t, json> second =
      StepLines(JsonLines(RunOk(WriteSpec(finetune, "finetune.yaml"), checkpoints).out));
  ASSERT_TRUE(second.contains(1));
  EXPECT_LT(second.at(1).at("loss").get<double>(), (fresh + trained) / 2);

  // Another model is refused, naming the field.
  TinySpec other = finetune;
  other.name = "other";
  other.top_k_line = "top_k: 1";
  const Finished refused = Moetrain({"run", WriteSpec(other, "other.yaml"), "--checkpoint-dir",
                                     (dir_ / "ckpt2").string(), "--json"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(Contains(refused.err + refused.out, "checkpoint.init_from")) << refused.err;
}

TEST_F(CliTest, BadSpecsFailNamingTheField) {
  struct Case {
    std::string top_k_line;
    std::string field;  // stderr must name it
  };
  for (const Case& c : {Case{"topk: 2", "model.moe.topk"}, Case{"top_k: 9", "model.moe.top_k"},
                        Case{"top_k: 0", "model.moe.top_k"}}) {
    SCOPED_TRACE(c.top_k_line);
    TinySpec spec;
    spec.top_k_line = c.top_k_line;
    const Finished run =
        Moetrain({"run", WriteSpec(spec), "--checkpoint-dir", (dir_ / "ckpt").string(), "--json"});
    EXPECT_NE(run.exit_code, 0);
    EXPECT_EQ(run.term_signal, 0);
    EXPECT_TRUE(Contains(run.err, c.field)) << run.err;
    EXPECT_EQ(CountStepLines(run.out), 0);
    EXPECT_FALSE(fs::exists(dir_ / "ckpt" / "tiny"));
  }
}

TEST_F(CliTest, MissingSpecFileFailsNamingThePath) {
  const std::string missing = (dir_ / "no-such-spec.yaml").string();
  const Finished run = Moetrain({"run", missing, "--json"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.term_signal, 0);
  EXPECT_TRUE(Contains(run.err, missing)) << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "checkpoints"));
}

}  // namespace
}  // namespace moetrain
