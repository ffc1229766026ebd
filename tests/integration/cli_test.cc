// Drives the real `moetrain` binary as a child process, the way a person or a script does:
// `moetrain run` (JSON lines, checkpoints in the Hugging Face layout), the refusal to train over
// a job's checkpoints, stop by signal and exact resume, spec errors, `moetrain eval`, and
// `moetrain export` / `moetrain import` (compared with the engine's own Evaluate, linked in).
//
// Every test works in a fresh directory under ::testing::TempDir() (the child's working directory
// too) and removes it at the end. A child that outlives its deadline is killed and fails the test.
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/integration/tiny_spec.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;
using testutil::Child;
using testutil::EnvChanges;
using testutil::Finished;
using testutil::JsonLines;
using testutil::TinySpec;

// A normal run of the tiny spec takes a second or two; this only catches a hang.
constexpr seconds kRunTimeout{60};

fs::path MoetrainBinary() { return fs::path(MOETRAIN_BIN_DIR) / "moetrain"; }

// One thread unless the caller chose (the engine's pool and oneDNN's): the model is tiny, and on a
// loaded machine spinning OpenMP workers turn a one-second run into tens of seconds. Results
// depend on the thread count, but every run of a test uses the same.
EnvChanges OneThreadUnlessChosen() {
  EnvChanges env;
  for (const char* name : {"MOETRAIN_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (getenv(name) == nullptr) env[name] = "1";
  }
  return env;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteFile(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

bool IsStepLine(const json& line) { return line.contains("loss") && !line.contains("summary"); }

// The step lines of a --json run, by step; a step printed twice fails the test.
std::map<int64_t, json> StepLines(const std::vector<json>& lines) {
  std::map<int64_t, json> steps;
  for (const json& line : lines) {
    if (!IsStepLine(line)) continue;
    const int64_t step = line.at("step").get<int64_t>();
    EXPECT_TRUE(steps.emplace(step, line).second) << "step " << step << " printed twice";
  }
  return steps;
}

int CountStepLines(const std::string& out) {
  int count = 0;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) count += Contains(line, "\"loss\":");
  return count;
}

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

// The names of the entries of `dir`, sorted; empty when it does not exist.
std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Every regular file under `dir` (relative path) with its contents.
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), dir).string()] = ReadFile(entry.path());
    }
  }
  return files;
}

// The JSON header of a safetensors file (8-byte little-endian length, then the header), checked
// against the file: every tensor F32 with offsets inside the data section that match its shape,
// and the data section ending where the file ends.
json SafetensorsHeader(const fs::path& path) {
  const std::string bytes = ReadFile(path);
  EXPECT_GE(bytes.size(), 8u) << path;
  if (bytes.size() < 8) return json();
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(bytes[i]);
  EXPECT_LE(8 + header_len, bytes.size()) << path;
  if (8 + header_len > bytes.size()) return json();
  json header = json::parse(bytes.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(header.is_object()) << path << ": header is not a JSON object";
  if (!header.is_object()) return json();
  const uint64_t data_bytes = bytes.size() - 8 - header_len;
  uint64_t data_end = 0;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(info.value("dtype", ""), "F32") << name;
    uint64_t numel = 1;
    for (const json& d : info.at("shape")) numel *= d.get<uint64_t>();
    const uint64_t begin = info.at("data_offsets").at(0).get<uint64_t>();
    const uint64_t end = info.at("data_offsets").at(1).get<uint64_t>();
    EXPECT_EQ(end - begin, 4 * numel) << name;
    EXPECT_LE(end, data_bytes) << name;
    data_end = std::max(data_end, end);
  }
  EXPECT_EQ(data_end, data_bytes) << path << ": data section has trailing bytes";
  return header;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(MoetrainBinary())) << MoetrainBinary() << " is not built";
    std::string pattern = (fs::path(::testing::TempDir()) / "moetrain_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern << ": " << std::strerror(errno);
    dir_ = pattern;
  }

  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Writes `spec` as <dir>/<file> and returns its path.
  std::string WriteSpec(const TinySpec& spec, const std::string& file = "spec.yaml") {
    const fs::path path = dir_ / file;
    WriteFile(path, spec.Yaml());
    return path.string();
  }

  // Runs `moetrain args...` in the test directory to the end (or kills it past `timeout`).
  Finished Moetrain(const std::vector<std::string>& args, Clock::duration timeout = kRunTimeout) {
    Child child(MoetrainBinary());
    const std::string error = child.Start(args, dir_, OneThreadUnlessChosen());
    if (!error.empty()) {
      ADD_FAILURE() << "cannot start moetrain: " << error;
      return Finished();
    }
    Finished result = child.Wait(timeout);
    EXPECT_FALSE(result.timed_out) << "moetrain hung and was killed; stderr:\n" << result.err;
    return result;
  }

  // `moetrain run spec --checkpoint-dir checkpoint_dir --json` plus `extra`, expected to succeed.
  Finished RunOk(const std::string& spec, const fs::path& checkpoint_dir,
                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"run", spec, "--checkpoint-dir", checkpoint_dir.string(),
                                     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    Finished result = Moetrain(args);
    EXPECT_EQ(result.exit_code, 0) << "stderr:\n" << result.err;
    return result;
  }

  fs::path dir_;
};

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

class EvalTest : public CliTest {
 protected:
  static constexpr int64_t kSeqLen = 32;

  // Trains the tiny spec for 10 steps; returns the step directory.
  fs::path TrainedCheckpoint() {
    const fs::path checkpoints = dir_ / "ckpt";
    const Finished run = RunOk(WriteSpec(TinySpec()), checkpoints, {"--steps", "10"});
    EXPECT_EQ(run.exit_code, 0);
    return checkpoints / "tiny" / StepDirName(10);
  }

  // Writes `tokens` as raw little-endian uint16 and returns the path.
  std::string WriteU16(const std::string& name, const std::vector<uint16_t>& tokens) {
    std::string bytes;
    for (uint16_t t : tokens) {
      bytes.push_back(static_cast<char>(t & 0xff));
      bytes.push_back(static_cast<char>(t >> 8));
    }
    WriteFile(dir_ / name, bytes);
    return (dir_ / name).string();
  }

  // Writes `tokens` as raw little-endian uint32 and returns the path.
  std::string WriteU32(const std::string& name, const std::vector<uint16_t>& tokens) {
    std::string bytes;
    for (uint32_t t : tokens) {
      for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
    }
    WriteFile(dir_ / name, bytes);
    return (dir_ / name).string();
  }

  static std::vector<uint16_t> Tokens(int64_t n) {
    std::vector<uint16_t> tokens(n);
    // Any tokens below the vocabulary of 64; a fixed, irregular sequence.
    for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((i * 37 + i / 5) % 64);
    return tokens;
  }

  Finished Eval(const fs::path& checkpoint, const std::string& data,
                const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"eval",        "--checkpoint", checkpoint.string(),
                                     "--data-path", data,           "--data-format",
                                     "u16",         "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Moetrain(args);
  }

  // The one JSON object eval prints.
  static json EvalResult(const Finished& run) {
    const std::vector<json> lines = JsonLines(run.out);
    EXPECT_EQ(lines.size(), 1u) << run.out;
    return lines.empty() ? json() : lines[0];
  }
};

TEST_F(EvalTest, ReportsMeanLossOverEveryWindow) {
  const fs::path checkpoint = TrainedCheckpoint();
  ASSERT_TRUE(fs::exists(checkpoint));
  const int64_t windows = 20;
  // N = 20·S + 5 tokens: windows share their boundary token, the last 4 tokens are left over.
  const std::string data = WriteU16("tokens.u16", Tokens(windows * kSeqLen + 5));

  const Finished all = Eval(checkpoint, data);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const json result = EvalResult(all);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result.size(), 2u) << result;
  ASSERT_TRUE(result.at("loss").is_number());
  const double loss = result.at("loss").get<double>();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0);
  EXPECT_EQ(result.at("tokens"), windows * kSeqLen);

  // One batch of the default 8 windows.
  const Finished one = Eval(checkpoint, data, {"--batches", "1"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const json one_result = EvalResult(one);
  ASSERT_TRUE(one_result.is_object());
  EXPECT_EQ(one_result.at("tokens"), 8 * kSeqLen);
  EXPECT_TRUE(std::isfinite(one_result.at("loss").get<double>()));

  // The mean is over windows, whatever the batching (8 + 8 + 4 windows, or all 20 at once).
  const Finished single_batch = Eval(checkpoint, data, {"--batch-size", "20"});
  ASSERT_EQ(single_batch.exit_code, 0) << single_batch.err;
  const json single_result = EvalResult(single_batch);
  ASSERT_TRUE(single_result.is_object());
  EXPECT_EQ(single_result.at("tokens"), windows * kSeqLen);
  EXPECT_NEAR(single_result.at("loss").get<double>(), loss, 1e-5 * loss);

  // The same tokens as raw uint32, the format of vocabularies above 65,536.
  const std::string wide = WriteU32("tokens.u32", Tokens(windows * kSeqLen + 5));
  const Finished u32 = Moetrain({"eval", "--checkpoint", checkpoint.string(), "--data-path", wide,
                                 "--data-format", "u32", "--json"});
  ASSERT_EQ(u32.exit_code, 0) << u32.err;
  const json u32_result = EvalResult(u32);
  ASSERT_TRUE(u32_result.is_object());
  EXPECT_EQ(u32_result.at("tokens"), windows * kSeqLen);
  EXPECT_EQ(u32_result.at("loss").get<double>(), loss);
}

TEST_F(EvalTest, CorruptCheckpointFailsNamingTheFile) {
  const fs::path checkpoint = TrainedCheckpoint();
  ASSERT_TRUE(fs::exists(checkpoint));
  const std::string data = WriteU16("tokens.u16", Tokens(10 * kSeqLen + 1));
  // A copy under the same step name, with one byte of tensor data flipped.
  const fs::path corrupt = dir_ / "corrupt" / StepDirName(10);
  fs::create_directories(corrupt.parent_path());
  fs::copy(checkpoint, corrupt, fs::copy_options::recursive);
  const fs::path model = corrupt / "model-rank00000.safetensors";
  std::string bytes = ReadFile(model);
  bytes[bytes.size() / 2 + 3] ^= 0x40;
  WriteFile(model, bytes);

  ASSERT_EQ(Eval(checkpoint, data).exit_code, 0) << "the original still evaluates";
  const Finished run = Eval(corrupt, data);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.term_signal, 0);
  EXPECT_TRUE(Contains(run.err, "model-rank00000.safetensors")) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

TEST_F(EvalTest, TokenOutsideTheVocabularyFailsNamingFileAndOffset) {
  const fs::path checkpoint = TrainedCheckpoint();
  ASSERT_TRUE(fs::exists(checkpoint));
  std::vector<uint16_t> tokens = Tokens(10 * kSeqLen + 1);
  tokens[100] = 64;  // = vocab_size, at byte offset 200
  const std::string data = WriteU16("bad.u16", tokens);
  const Finished run = Eval(checkpoint, data);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_EQ(run.term_signal, 0);
  EXPECT_TRUE(Contains(run.err, data)) << run.err;
  EXPECT_TRUE(Contains(run.err, "offset 200")) << run.err;
  EXPECT_TRUE(run.out.empty()) << run.out;
}

TEST_F(EvalTest, ExportedAndReimportedCheckpointEvaluatesTheSame) {
  const fs::path checkpoint = TrainedCheckpoint();
  ASSERT_TRUE(fs::exists(checkpoint));
  const std::string data = WriteU16("tokens.u16", Tokens(10 * kSeqLen + 1));
  const std::string hf = (dir_ / "hf").string();
  const std::vector<std::string> export_args = {
      "export",  "--checkpoint", checkpoint.string(), "--to-hf", hf,
      "--dtype", "f32",          "--max-shard-size",  "16KiB"};
  const Finished exported = Moetrain(export_args);
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  // The tiny spec has grouped-query attention: not DeepSeek-V3's code, and the note says why.
  EXPECT_TRUE(Contains(exported.out, "MoetrainForCausalLM")) << exported.out;
  EXPECT_TRUE(Contains(exported.err, "note: ")) << exported.err;
  // 16 KiB shards: several, each where the index says.
  const json index = json::parse(ReadFile(dir_ / "hf" / "model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : index.at("weight_map").items()) shards.insert(file);
  EXPECT_GT(shards.size(), 1u);
  for (const std::string& file : shards) EXPECT_TRUE(fs::exists(dir_ / "hf" / file)) << file;

  const fs::path root = dir_ / "imported" / "tiny";
  const Finished imported = Moetrain({"import", "--from-hf", hf, "--out", root.string()});
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_TRUE(Contains(imported.out, StepDirName(0))) << imported.out;
  const Finished original = Eval(checkpoint, data);
  const Finished reimported = Eval(root / StepDirName(0), data);
  ASSERT_EQ(original.exit_code, 0) << original.err;
  ASSERT_EQ(reimported.exit_code, 0) << reimported.err;
  EXPECT_EQ(EvalResult(reimported), EvalResult(original));

  // Neither overwrites what is there; both say so with exit 2.
  const Finished again = Moetrain(export_args);
  EXPECT_EQ(again.exit_code, 2) << again.err;
  EXPECT_TRUE(Contains(again.err, hf)) << again.err;
  const Finished twice = Moetrain({"import", "--from-hf", hf, "--out", root.string()});
  EXPECT_EQ(twice.exit_code, 2) << twice.err;
  const Finished missing = Moetrain(
      {"import", "--from-hf", (dir_ / "nothing").string(), "--out", (dir_ / "x").string()});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
}

// A Hugging Face DeepSeek-V3 directory written here without Python: a config.json of DeepSeek-V3's
// own keys, bf16 weights in two shards and their index. `moetrain import` then `moetrain eval`
// give the loss the engine computes for those weights.
TEST_F(EvalTest, ImportedDeepseekV3DirectoryEvaluatesAsTheEngineDoes) {
  constexpr int64_t kHfSeqLen = 16;
  ModelConfig config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 2;
  config.ffn_dim = 48;
  config.first_dense_layers = 1;
  config.max_seq_len = kHfSeqLen;
  config.attention = AttentionType::kMla;
  config.mla = {.q_lora_rank = 0,
                .kv_lora_rank = 16,
                .qk_nope_head_dim = 8,
                .qk_rope_head_dim = 8,
                .v_head_dim = 8};
  config.moe = {.num_experts = 8,
                .top_k = 4,
                .expert_ffn_dim = 16,
                .num_shared_experts = 1,
                .score_function = ScoreFunction::kSigmoid,
                .routed_scaling_factor = 2.5f,
                .num_groups = 4,
                .group_top_k = 2,
                .expert_bias = true};
  absl::StatusOr<Transformer> model = Transformer::Create(config, DType::kF32);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(model->Initialize(17).ok());

  // The weights in bf16, the first half of them in shard 1; the model then holds them widened.
  const fs::path hf = dir_ / "hf";
  fs::create_directories(hf);
  const std::vector<NamedParameter>& parameters = model->parameters();
  std::vector<Tensor> rounded;
  json weight_map = json::object();
  int64_t total_size = 0;
  for (int shard = 0; shard < 2; ++shard) {
    const std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    std::vector<std::pair<std::string, TensorView>> tensors;
    const size_t half = parameters.size() / 2;
    for (size_t i = shard == 0 ? 0 : half; i < (shard == 0 ? half : parameters.size()); ++i) {
      rounded.push_back(Tensor::Empty(DType::kBF16, parameters[i].value.shape()));
      ASSERT_TRUE(ops::ConvertTensor(ExecContext::Cpu(), parameters[i].value, rounded.back()).ok());
      ASSERT_TRUE(ops::ConvertTensor(ExecContext::Cpu(), rounded.back(), parameters[i].value).ok());
      tensors.emplace_back(parameters[i].name, rounded.back().view());
      weight_map[parameters[i].name] = file;
      total_size += 2 * parameters[i].value.numel();
    }
    ASSERT_TRUE(WriteSafetensors((hf / file).string(), tensors, {{"format", "pt"}}).ok());
  }
  WriteFile(hf / "model.safetensors.index.json",
            json({{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}}).dump());
  const json hf_config = {{"architectures", {"DeepseekV3ForCausalLM"}},
                          {"model_type", "deepseek_v3"},
                          {"vocab_size", 64},
                          {"hidden_size", 32},
                          {"intermediate_size", 48},
                          {"moe_intermediate_size", 16},
                          {"num_hidden_layers", 2},
                          {"num_nextn_predict_layers", 0},
                          {"num_attention_heads", 2},
                          {"num_key_value_heads", 2},
                          {"n_shared_experts", 1},
                          {"n_routed_experts", 8},
                          {"routed_scaling_factor", 2.5},
                          {"kv_lora_rank", 16},
                          {"q_lora_rank", nullptr},
                          {"qk_rope_head_dim", 8},
                          {"v_head_dim", 8},
                          {"qk_nope_head_dim", 8},
                          {"topk_method", "noaux_tc"},
                          {"n_group", 4},
                          {"topk_group", 2},
                          {"num_experts_per_tok", 4},
                          {"moe_layer_freq", 1},
                          {"first_k_dense_replace", 1},
                          {"norm_topk_prob", true},
                          {"scoring_func", "sigmoid"},
                          {"hidden_act", "silu"},
                          {"max_position_embeddings", kHfSeqLen},
                          {"rms_norm_eps", 1e-6},
                          {"rope_theta", 10000.0},
                          {"rope_scaling", nullptr},
                          {"tie_word_embeddings", false},
                          {"attention_bias", false},
                          {"torch_dtype", "bfloat16"}};
  WriteFile(hf / "config.json", hf_config.dump(2));

  const fs::path root = dir_ / "imported" / "dsv3";
  const Finished imported = Moetrain({"import", "--from-hf", hf.string(), "--out", root.string()});
  ASSERT_EQ(imported.exit_code, 0) << imported.err;
  EXPECT_TRUE(Contains(imported.out, "DeepseekV3ForCausalLM")) << imported.out;

  // One batch of every window of the file, as eval reads them: window w is tokens
  // [w·S, w·S + S + 1).
  constexpr int64_t kWindows = 6;
  const std::vector<uint16_t> tokens = Tokens(kWindows * kHfSeqLen + 1);
  const std::string data = WriteU16("dsv3.u16", tokens);
  const Finished eval =
      Moetrain({"eval", "--checkpoint", (root / StepDirName(0)).string(), "--data-path", data,
                "--data-format", "u16", "--batch-size", std::to_string(kWindows), "--json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const json result = EvalResult(eval);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result.at("tokens"), kWindows * kHfSeqLen);
  Tensor batch = Tensor::Empty(DType::kI32, {kWindows, kHfSeqLen + 1});
  for (int64_t w = 0; w < kWindows; ++w) {
    for (int64_t i = 0; i <= kHfSeqLen; ++i) {
      batch.data<int32_t>()[w * (kHfSeqLen + 1) + i] = tokens[w * kHfSeqLen + i];
    }
  }
  absl::StatusOr<float> want = model->Evaluate(batch);
  ASSERT_TRUE(want.ok()) << want.status();
  // The child runs one thread and this process may run more: sums may round differently.
  EXPECT_NEAR(result.at("loss").get<double>(), *want, 1e-5 * *want);
}

}  // namespace
}  // namespace moetrain
