#include "engine/train/hf_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/checkpoint.h"
#include "engine/train/hf_config.h"
#include "engine/train/model_config_json.h"
#include "engine/train/safetensors.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using transformer_test::MakeModel;
using transformer_test::RandomTokens;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

constexpr int64_t kSeqLen = 8;

// DeepSeek-V3 in miniature: MLA with query compression, sigmoid routing with the expert bias,
// 8 experts in 4 groups, the best 2 groups, top_k = 4 (a group scores its best 4 / 2 = 2, as
// Hugging Face's code does), a shared expert, one dense block first.
ModelConfig MlaConfig() {
  ModelConfig c = transformer_test::TinyMlaConfig(/*q_lora_rank=*/6);
  c.num_layers = 3;
  c.moe.num_experts = 8;
  c.moe.num_groups = 4;
  c.moe.group_top_k = 2;
  c.moe.top_k = 4;
  c.moe.routed_scaling_factor = 2.5f;
  c.moe.aux_loss = AuxLossType::kNone;
  c.moe.aux_loss_coeff = 0.0f;
  c.moe.z_loss_coeff = 0.0f;
  return c;
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

Json ReadJson(const fs::path& path) { return Json::parse(ReadBytes(path)); }

std::string BytesOf(const TensorView& t) {
  return std::string(static_cast<const char*>(t.raw()), t.numel() * DTypeSize(t.dtype()));
}

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

// The expert index of "model.layers.1.mlp.experts.3.up_proj.weight", or -1.
int64_t ExpertOf(const std::string& name) {
  const size_t at = name.find(".experts.");
  return at == std::string::npos ? -1 : std::atoll(name.c_str() + at + sizeof(".experts.") - 1);
}

// The model's parameters as `dtype` copies, by name, in checkpoint order.
NamedTensors Parameters(const Transformer& model, DType dtype) {
  NamedTensors out;
  for (const NamedParameter& p : model.parameters()) {
    Tensor t = Tensor::Empty(dtype, p.value.shape());
    EXPECT_TRUE(ops::ConvertTensor(ExecContext::Cpu(), p.value, t).ok());
    out.emplace_back(p.name, std::move(t));
  }
  return out;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  // Writes `model` as a step of a two-rank (ep = 2) job, as the trainer does: rank 0 the dense
  // part and the first half of the experts, rank 1 the rest. `skip` names a tensor left out.
  std::string WriteStep(const Transformer& model, const std::string& job,
                        const std::string& skip = "") {
    const ModelConfig& c = model.config();
    const int64_t half = c.moe.num_experts / 2;
    CheckpointContents contents;
    contents.step = 3;
    contents.sections = {
        {"model_config", ModelConfigToJson(c)},
        {"world_layout", {{"world_size", 2}, {"data_parallel", 1}, {"expert_parallel", 2}}}};
    contents.hf_config = HuggingFaceConfig(c, kSeqLen);
    const std::string root = (dir_ / job).string();
    const uint64_t nonce = NewCheckpointNonce();
    absl::StatusOr<std::string> tmp = BeginCheckpoint(root, contents.step, nonce);
    EXPECT_TRUE(tmp.ok()) << tmp.status();
    std::vector<CheckpointFile> files;
    for (int rank = 0; rank < 2; ++rank) {
      CheckpointContents shard = contents;
      shard.rank = rank;
      for (const NamedParameter& p : model.parameters()) {
        const int64_t expert = ExpertOf(p.name);
        const bool mine = expert < 0 ? rank == 0 : (expert >= half) == (rank == 1);
        if (mine && p.name != skip) shard.model_tensors.push_back({p.name, p.value});
      }
      absl::StatusOr<std::vector<CheckpointFile>> written = WriteCheckpointShard(*tmp, shard);
      EXPECT_TRUE(written.ok()) << written.status();
      files.insert(files.end(), written->begin(), written->end());
    }
    absl::StatusOr<std::string> step = CommitCheckpoint(root, *tmp, contents, files);
    EXPECT_TRUE(step.ok()) << step.status();
    return step.value_or("");
  }

  // The tensors of an imported step, by name.
  static std::map<std::string, Tensor> Imported(const std::string& step_dir) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(step_dir);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? std::move(loaded->model_tensors) : std::map<std::string, Tensor>();
  }

  // Writes a Hugging Face directory by hand: `config`, `tensors` in `num_shards` shards and
  // their index.
  static void WriteHfDir(const fs::path& dir, const Json& config, const NamedTensors& tensors,
                         int num_shards = 2) {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    Json weight_map = Json::object();
    int64_t total = 0;
    const size_t per_shard = (tensors.size() + num_shards - 1) / num_shards;
    for (int s = 0; s < num_shards; ++s) {
      const std::string file = HfShardFileName(s + 1, num_shards);
      std::vector<std::pair<std::string, TensorView>> views;
      for (size_t i = s * per_shard; i < std::min(tensors.size(), (s + 1) * per_shard); ++i) {
        views.emplace_back(tensors[i].first, tensors[i].second.view());
        weight_map[tensors[i].first] = file;
        total += tensors[i].second.numel() * DTypeSize(tensors[i].second.dtype());
      }
      ASSERT_TRUE(WriteSafetensors((dir / file).string(), views, {{"format", "pt"}}).ok());
    }
    std::ofstream(dir / kHfIndexName)
        << Json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2);
  }

  const testutil::TempDir temp_dir_{"hf_checkpoint_test"};
  const fs::path dir_ = temp_dir_.path();
};

TEST_F(HfCheckpointTest, F32RoundTripIsExact) {
  const Transformer model = MakeModel(MlaConfig(), DType::kF32, 7);
  const std::string step = WriteStep(model, "job");
  const fs::path hf = dir_ / "hf";
  absl::StatusOr<HfExportReport> exported =
      ExportHuggingFace(step, hf.string(), {.dtype = DType::kF32, .shard_bytes = 4096});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->architecture, kDeepseekV3Architecture);
  EXPECT_TRUE(exported->notes.empty());
  EXPECT_GT(exported->num_shards, 2);
  EXPECT_EQ(exported->num_tensors, static_cast<int64_t>(model.parameters().size()));

  const Json config = ReadJson(hf / "config.json");
  EXPECT_EQ(config.at("architectures"), Json({kDeepseekV3Architecture}));
  EXPECT_FALSE(config.contains("moetrain_differences"));
  EXPECT_EQ(config.at("torch_dtype"), "float32");
  EXPECT_EQ(config.at("max_position_embeddings"), kSeqLen);
  EXPECT_EQ(ReadJson(hf / "generation_config.json"),
            Json({{"_from_model_config", true}, {"max_length", kSeqLen}}));
  // The index lists every parameter in the shard that holds it; total_size counts data bytes.
  const Json index = ReadJson(hf / kHfIndexName);
  int64_t data_bytes = 0;
  std::set<std::string> files;
  for (const NamedParameter& p : model.parameters()) {
    SCOPED_TRACE(p.name);
    const std::string file = index.at("weight_map").at(p.name);
    files.insert(file);
    absl::StatusOr<SafetensorsFile> shard = ReadSafetensors((hf / file).string());
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
    absl::StatusOr<TensorView> t = shard->View(p.name);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(BytesOf(*t), BytesOf(p.value));
    data_bytes += p.value.numel() * 4;
  }
  EXPECT_EQ(index.at("weight_map").size(), model.parameters().size());
  EXPECT_EQ(index.at("metadata").at("total_size"), data_bytes);
  EXPECT_EQ(static_cast<int>(files.size()), exported->num_shards);
  EXPECT_TRUE(files.contains(HfShardFileName(exported->num_shards, exported->num_shards)));

  absl::StatusOr<HfImportReport> imported = ImportHuggingFace(hf.string(), (dir_ / "in").string());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(fs::path(imported->step_dir).lexically_normal(),
            (dir_ / "in" / "step-00000000").lexically_normal());
  EXPECT_EQ(imported->seq_len, kSeqLen);
  EXPECT_EQ(ModelConfigToJson(imported->config), ModelConfigToJson(model.config()));
  const std::map<std::string, Tensor> tensors = Imported(imported->step_dir);
  ASSERT_EQ(tensors.size(), model.parameters().size());
  for (const NamedParameter& p : model.parameters()) {
    ASSERT_TRUE(tensors.contains(p.name)) << p.name;
    EXPECT_EQ(BytesOf(tensors.at(p.name).view()), BytesOf(p.value)) << p.name;
  }
  // What eval reads: the manifest's model_config and config.json's sequence length.
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(imported->step_dir);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->manifest.at("model_config"), ModelConfigToJson(model.config()));
  EXPECT_EQ(loaded->manifest.at("world_layout").at("world_size"), 1);
  EXPECT_EQ(loaded->hf_config.at("max_position_embeddings"), kSeqLen);
}

TEST_F(HfCheckpointTest, Bf16RoundTripGivesByteIdenticalShards) {
  const Transformer model = MakeModel(MlaConfig(), DType::kF32, 11);
  const std::string step = WriteStep(model, "job");
  const HfExportOptions bf16{.dtype = DType::kBF16, .shard_bytes = 2048};
  ASSERT_TRUE(ExportHuggingFace(step, (dir_ / "hf1").string(), bf16).ok());
  absl::StatusOr<HfImportReport> imported =
      ImportHuggingFace((dir_ / "hf1").string(), (dir_ / "in").string());
  ASSERT_TRUE(imported.ok()) << imported.status();
  // The imported weights are the bf16 values, widened exactly.
  const std::map<std::string, Tensor> tensors = Imported(imported->step_dir);
  for (const auto& [name, rounded] : Parameters(model, DType::kBF16)) {
    Tensor widened = Tensor::Empty(DType::kF32, rounded.view().shape());
    ASSERT_TRUE(ops::ConvertTensor(ExecContext::Cpu(), rounded, widened).ok());
    EXPECT_EQ(BytesOf(tensors.at(name).view()), BytesOf(widened.view())) << name;
  }
  absl::StatusOr<HfExportReport> again =
      ExportHuggingFace(imported->step_dir, (dir_ / "hf2").string(), bf16);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ReadJson(dir_ / "hf2" / "config.json").at("torch_dtype"), "bfloat16");
  int shards = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_ / "hf1")) {
    const std::string name = entry.path().filename();
    if (name == "config.json") continue;  // the exported one also keeps moetrain_model_config
    EXPECT_EQ(ReadBytes(entry.path()), ReadBytes(dir_ / "hf2" / name)) << name;
    shards += name.ends_with(".safetensors");
  }
  EXPECT_EQ(shards, again->num_shards);
  EXPECT_GT(shards, 1);
}

TEST_F(HfCheckpointTest, GroupScoringIsRefusedWithoutForce) {
  ModelConfig config = MlaConfig();
  config.moe.top_k = 2;  // a group scores its best 2 / 2 = 1 expert; Hugging Face's its best 2
  const Transformer model = MakeModel(config, DType::kF32, 3);
  const std::string step = WriteStep(model, "job");
  const fs::path hf = dir_ / "out" / "hf";
  absl::StatusOr<HfExportReport> refused = ExportHuggingFace(step, hf.string());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "best 2 experts")) << refused.status();
  EXPECT_TRUE(Contains(refused.status().message(), "--force")) << refused.status();
  EXPECT_FALSE(fs::exists(hf));

  absl::StatusOr<HfExportReport> forced = ExportHuggingFace(step, hf.string(), {.force = true});
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->architecture, kDeepseekV3Architecture);
  ASSERT_EQ(forced->notes.size(), 1u);
  EXPECT_TRUE(Contains(forced->notes[0], "--force"));
  const Json written = ReadJson(hf / "config.json");
  EXPECT_EQ(written.at("architectures"), Json({kDeepseekV3Architecture}));
  EXPECT_EQ(written.at("moetrain_differences").size(), 1u);
  // Nothing but the directory itself is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(hf.parent_path()), fs::directory_iterator()), 1);
}

TEST_F(HfCheckpointTest, GqaModelExportsAsMoetrainAndRoundTrips) {
  const Transformer model = MakeModel(transformer_test::TinySoftmaxTiedConfig(), DType::kF32, 5);
  const std::string step = WriteStep(model, "job");
  absl::StatusOr<HfExportReport> exported =
      ExportHuggingFace(step, (dir_ / "hf").string(), {.dtype = DType::kF32});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->architecture, kMoetrainArchitecture);
  EXPECT_EQ(exported->num_shards, 1);
  ASSERT_EQ(exported->notes.size(), 1u);
  EXPECT_TRUE(Contains(exported->notes[0], "grouped-query")) << exported->notes[0];
  EXPECT_TRUE(Contains(exported->notes[0], "softmax")) << exported->notes[0];
  const Json config = ReadJson(dir_ / "hf" / "config.json");
  EXPECT_EQ(config.at("architectures"), Json({kMoetrainArchitecture}));
  // Grouped-query attention, softmax scores, no selection bias.
  EXPECT_EQ(config.at("moetrain_differences").size(), 3u);

  absl::StatusOr<HfImportReport> imported =
      ImportHuggingFace((dir_ / "hf").string(), (dir_ / "in").string());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(ModelConfigToJson(imported->config), ModelConfigToJson(model.config()));
  const std::map<std::string, Tensor> tensors = Imported(imported->step_dir);
  for (const NamedParameter& p : model.parameters()) {
    EXPECT_EQ(BytesOf(tensors.at(p.name).view()), BytesOf(p.value)) << p.name;
  }
}

// --force is only for a model that DeepSeek-V3's code would otherwise compute: with grouped-query
// attention too, config.json names MoetrainForCausalLM and the group scoring is one more note.
TEST_F(HfCheckpointTest, GroupScoringOfAGqaModelIsANote) {
  ModelConfig config = transformer_test::TinyConfig();
  config.moe.num_groups = 2;
  config.moe.group_top_k = 1;
  config.moe.top_k = 1;
  const Transformer model = MakeModel(config, DType::kF32, 4);
  absl::StatusOr<HfExportReport> exported =
      ExportHuggingFace(WriteStep(model, "job"), (dir_ / "hf").string());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->architecture, kMoetrainArchitecture);
  ASSERT_EQ(exported->notes.size(), 1u);
  EXPECT_TRUE(Contains(exported->notes[0], "best 2")) << exported->notes[0];
  EXPECT_EQ(ReadJson(dir_ / "hf" / "config.json").at("moetrain_differences").size(), 2u);
}

TEST_F(HfCheckpointTest, MtpLayersGetCopiesOfTheEmbeddingAndHead) {
  ModelConfig config = MlaConfig();
  config.mtp_depth = 1;
  const Transformer model = MakeModel(config, DType::kF32, 9);
  const std::string step = WriteStep(model, "job");
  ASSERT_TRUE(ExportHuggingFace(step, (dir_ / "hf").string(), {.dtype = DType::kF32}).ok());
  const Json weight_map = ReadJson(dir_ / "hf" / kHfIndexName).at("weight_map");
  EXPECT_EQ(weight_map.size(), model.parameters().size() + 2);
  const std::string layer = absl::StrCat("model.layers.", config.num_layers, ".");
  const std::map<std::string, std::string> copies = {
      {layer + "embed_tokens.weight", "model.embed_tokens.weight"},
      {layer + "shared_head.head.weight", "lm_head.weight"}};
  std::map<std::string, const NamedParameter*> parameters;
  for (const NamedParameter& p : model.parameters()) parameters[p.name] = &p;
  ASSERT_TRUE(parameters.contains(layer + "eh_proj.weight"));
  for (const auto& [copy, original] : copies) {
    absl::StatusOr<SafetensorsFile> shard =
        ReadSafetensors((dir_ / "hf" / weight_map.at(copy).get<std::string>()).string());
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ(BytesOf(shard->View(copy).value()), BytesOf(parameters.at(original)->value)) << copy;
  }

  absl::StatusOr<HfImportReport> imported =
      ImportHuggingFace((dir_ / "hf").string(), (dir_ / "in").string());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->ignored_tensors, 2);
  const std::map<std::string, Tensor> tensors = Imported(imported->step_dir);
  EXPECT_EQ(tensors.size(), model.parameters().size());
  for (const NamedParameter& p : model.parameters()) {
    EXPECT_EQ(BytesOf(tensors.at(p.name).view()), BytesOf(p.value)) << p.name;
  }
}

TEST_F(HfCheckpointTest, ExportNamesAMissingTensorAndRefusesAFullDirectory) {
  const Transformer model = MakeModel(MlaConfig(), DType::kF32, 1);
  const std::string missing = "model.layers.2.mlp.experts.6.down_proj.weight";
  const std::string damaged = WriteStep(model, "damaged", missing);
  absl::StatusOr<HfExportReport> failed = ExportHuggingFace(damaged, (dir_ / "hf").string());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss) << failed.status();
  EXPECT_TRUE(Contains(failed.status().message(), missing)) << failed.status();
  EXPECT_FALSE(fs::exists(dir_ / "hf"));

  const std::string good = WriteStep(model, "good");
  fs::create_directories(dir_ / "full");
  std::ofstream(dir_ / "full" / "README") << "mine";
  EXPECT_EQ(ExportHuggingFace(good, (dir_ / "full").string()).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadBytes(dir_ / "full" / "README"), "mine");
  fs::create_directories(dir_ / "empty");
  EXPECT_TRUE(ExportHuggingFace(good, (dir_ / "empty").string()).ok());
  EXPECT_TRUE(fs::exists(dir_ / "empty" / kHfIndexName));
  EXPECT_EQ(ExportHuggingFace((dir_ / "nowhere").string(), (dir_ / "x").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// A config.json as Hugging Face's DeepSeek-V3 writes it: its own keys only.
Json DeepseekV3Json(const ModelConfig& c) {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.ffn_dim},
          {"moe_intermediate_size", c.moe.expert_ffn_dim},
          {"num_hidden_layers", c.num_layers},
          {"num_nextn_predict_layers", 0},
          {"num_attention_heads", c.num_heads},
          {"num_key_value_heads", c.num_heads},
          {"n_shared_experts", c.moe.num_shared_experts},
          {"n_routed_experts", c.moe.num_experts},
          {"routed_scaling_factor", 2.5},
          {"kv_lora_rank", c.mla.kv_lora_rank},
          {"q_lora_rank", c.mla.q_lora_rank},
          {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
          {"v_head_dim", c.mla.v_head_dim},
          {"qk_nope_head_dim", c.mla.qk_nope_head_dim},
          {"topk_method", "noaux_tc"},
          {"n_group", c.moe.num_groups},
          {"topk_group", c.moe.group_top_k},
          {"num_experts_per_tok", c.moe.top_k},
          {"moe_layer_freq", 1},
          {"first_k_dense_replace", c.first_dense_layers},
          {"norm_topk_prob", true},
          {"scoring_func", "sigmoid"},
          {"hidden_act", "silu"},
          {"max_position_embeddings", kSeqLen},
          {"initializer_range", 0.02},
          {"rms_norm_eps", 1e-6},
          {"use_cache", true},
          {"tie_word_embeddings", false},
          {"rope_theta", 10000.0},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"torch_dtype", "bfloat16"}};
}

TEST_F(HfCheckpointTest, ImportsAHuggingFaceDirectoryAndEvaluatesLikeItsTensors) {
  // bf16 tensors in two shards and a config.json with DeepSeek-V3's keys only.
  const ModelConfig config = MlaConfig();
  const NamedTensors tensors = Parameters(MakeModel(config, DType::kF32, 21), DType::kBF16);
  const fs::path hf = dir_ / "hf";
  WriteHfDir(hf, DeepseekV3Json(config), tensors);
  absl::StatusOr<HfImportReport> imported = ImportHuggingFace(hf.string(), (dir_ / "in").string());
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->architecture, kDeepseekV3Architecture);
  EXPECT_EQ(imported->num_tensors, static_cast<int64_t>(tensors.size()));

  // The reference: a model of the same shape holding the same tensors, widened.
  absl::StatusOr<Transformer> direct = Transformer::Create(config, DType::kF32);
  ASSERT_TRUE(direct.ok());
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_EQ(direct->parameters()[i].name, tensors[i].first);
    ASSERT_TRUE(
        ops::ConvertTensor(ExecContext::Cpu(), tensors[i].second, direct->parameters()[i].value)
            .ok());
  }
  // The imported step, as `moetrain eval` loads it.
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(imported->step_dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<ModelConfig> loaded_config =
      ModelConfigFromJson(loaded->manifest.at("model_config"));
  ASSERT_TRUE(loaded_config.ok()) << loaded_config.status();
  EXPECT_EQ(loaded->hf_config.at("architectures"), Json({kDeepseekV3Architecture}));
  absl::StatusOr<Transformer> restored = Transformer::Create(*loaded_config, DType::kF32);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE(RestoreModelParameters(*loaded, &*restored).ok());

  const Tensor tokens = RandomTokens(3, kSeqLen, config.vocab_size, 5);
  absl::StatusOr<float> want = direct->Evaluate(tokens);
  absl::StatusOr<float> got = restored->Evaluate(tokens);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want);
  EXPECT_GT(*want, 0.0f);
}

TEST_F(HfCheckpointTest, ImportNamesMissingUnexpectedAndMisshapenTensors) {
  const ModelConfig config = MlaConfig();
  const NamedTensors tensors = Parameters(MakeModel(config, DType::kF32, 2), DType::kBF16);
  const Json hf_config = DeepseekV3Json(config);
  const auto import = [&](const std::string& name, const NamedTensors& contents) {
    WriteHfDir(dir_ / name, hf_config, contents);
    return ImportHuggingFace((dir_ / name).string(), (dir_ / ("in-" + name)).string()).status();
  };
  const auto without = [&](size_t skipped) {
    NamedTensors out;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i == skipped) continue;
      Tensor copy = Tensor::Empty(DType::kBF16, tensors[i].second.view().shape());
      EXPECT_TRUE(ops::ConvertTensor(ExecContext::Cpu(), tensors[i].second, copy).ok());
      out.emplace_back(tensors[i].first, std::move(copy));
    }
    return out;
  };

  const std::string& dropped = tensors[5].first;
  absl::Status missing = import("missing", without(5));
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_TRUE(Contains(missing.message(), dropped)) << missing;
  EXPECT_TRUE(Contains(missing.message(), "model-00001-of-00002.safetensors")) << missing;

  // FP8 weights come with scales: a feature the engine does not have.
  NamedTensors quantized = without(tensors.size());
  const std::string scale = "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv";
  quantized.emplace_back(scale, Tensor::Zeros(DType::kF32, {1, 1}));
  absl::Status unexpected = import("quantized", quantized);
  EXPECT_EQ(unexpected.code(), absl::StatusCode::kInvalidArgument) << unexpected;
  EXPECT_TRUE(Contains(unexpected.message(), scale)) << unexpected;
  EXPECT_TRUE(Contains(unexpected.message(), "model-00002-of-00002.safetensors")) << unexpected;

  NamedTensors misshapen = without(tensors.size());
  misshapen[3].second = Tensor::Zeros(DType::kBF16, {2, 2});
  absl::Status shape = import("misshapen", misshapen);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument) << shape;
  EXPECT_TRUE(Contains(shape.message(), misshapen[3].first)) << shape;
  EXPECT_TRUE(Contains(shape.message(), "(2, 2)")) << shape;

  NamedTensors fp8 = without(tensors.size());
  fp8[4].second = Tensor::Zeros(DType::kF8E4M3, fp8[4].second.view().shape());
  absl::Status dtype = import("fp8", fp8);
  EXPECT_EQ(dtype.code(), absl::StatusCode::kInvalidArgument) << dtype;
  EXPECT_TRUE(Contains(dtype.message(), "F8_E4M3")) << dtype;

  // Features of config.json the engine lacks are refused before any tensor is read.
  Json yarn = hf_config;
  yarn["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}};
  WriteHfDir(dir_ / "yarn", yarn, without(tensors.size()));
  absl::Status scaling =
      ImportHuggingFace((dir_ / "yarn").string(), (dir_ / "y").string()).status();
  EXPECT_EQ(scaling.code(), absl::StatusCode::kInvalidArgument) << scaling;
  EXPECT_TRUE(Contains(scaling.message(), "rope_scaling")) << scaling;

  EXPECT_EQ(ImportHuggingFace((dir_ / "none").string(), (dir_ / "n").string()).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing was written for any of them.
  for (const char* name : {"in-missing", "in-quantized", "in-misshapen", "in-fp8", "y"}) {
    EXPECT_FALSE(fs::exists(dir_ / name / "step-00000000")) << name;
  }
}

}  // namespace
}  // namespace moetrain
