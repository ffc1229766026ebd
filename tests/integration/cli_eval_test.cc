// `moetrain eval`, `moetrain export` and `moetrain import` as a person runs them, through the real
// binary: the loss of every window, damaged checkpoints and data named, Hugging Face round trips
// and a hand-written DeepSeek-V3 directory compared with the engine's own Evaluate (linked in).

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

#include "absl/strings/escaping.h"
#include "engine/core/sha256.h"
#include "engine/model/transformer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/child_process.h"
#include "tests/integration/cli_fixture.h"
#include "tests/integration/tiny_spec.h"

namespace moetrain {
namespace {

using namespace cli_testing;  // NOLINT: the fixture and its helpers

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

// A checkpoint's config.json, rewritten with its manifest's record to match, whose sequence
// length is no integer: `moetrain eval` read it unchecked, and a string there threw out of main
// (SIGABRT). Now it is refused naming the key.
TEST_F(EvalTest, AConfigJsonSequenceLengthThatIsNoIntegerIsRefused) {
  const fs::path checkpoint = TrainedCheckpoint();
  ASSERT_TRUE(fs::exists(checkpoint));
  const std::string data = WriteU16("tokens.u16", Tokens(10 * kSeqLen + 1));
  for (const json& value : {json("32"), json(32.5)}) {
    SCOPED_TRACE(value.dump());
    const fs::path edited = dir_ / "edited" / StepDirName(10);
    fs::remove_all(edited.parent_path());
    fs::create_directories(edited.parent_path());
    fs::copy(checkpoint, edited, fs::copy_options::recursive);
    json config = json::parse(ReadFile(edited / "config.json"));
    config["max_position_embeddings"] = value;
    const std::string text = config.dump(2);
    WriteFile(edited / "config.json", text);
    json manifest = json::parse(ReadFile(edited / "manifest.json"));
    for (json& file : manifest["files"]) {
      if (file["name"] != "config.json") continue;
      absl::StatusOr<std::string> digest = Sha256Digest(text);
      ASSERT_TRUE(digest.ok()) << digest.status();
      file["bytes"] = text.size();
      file["sha256"] = absl::BytesToHexString(*digest);
    }
    WriteFile(edited / "manifest.json", manifest.dump(2));
    const Finished run = Eval(edited, data);
    EXPECT_EQ(run.term_signal, 0) << run.err;
    EXPECT_EQ(run.exit_code, 1) << run.err;
    EXPECT_TRUE(Contains(run.err, "config.json: max_position_embeddings")) << run.err;
  }
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

// A config.json nested 500,000 deep (1 MB, within import's 1 MiB cap on config.json): `moetrain
// import` printed its architectures in the refusal, recursing once per level, and died of SIGSEGV.
// Now it exits 2 naming the file.
TEST_F(EvalTest, DeeplyNestedConfigJsonIsRefusedByImport) {
  const fs::path hf = dir_ / "deep-hf";
  fs::create_directories(hf);
  WriteFile(hf / "config.json", "{\"max_position_embeddings\": 32, \"architectures\": " +
                                    testutil::NestedJsonArrays(500000) + "}");
  const Finished run =
      Moetrain({"import", "--from-hf", hf.string(), "--out", (dir_ / "out").string()});
  EXPECT_EQ(run.term_signal, 0);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_TRUE(Contains(run.err, (hf / "config.json").string() +
                                    " nests JSON arrays and objects deeper than 64 levels"))
      << run.err;
  EXPECT_FALSE(fs::exists(dir_ / "out"));
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
