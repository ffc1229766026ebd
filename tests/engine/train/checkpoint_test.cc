#include "engine/train/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train/safetensors.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string BytesOf(const TensorView& t) {
  return std::string(static_cast<const char*>(t.raw()), t.numel() * DTypeSize(t.dtype()));
}

std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

bool Contains(absl::string_view haystack, const std::string& needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // A small model whose values depend on the step, so that steps are told apart by content.
  CheckpointContents Contents(int64_t step, int rank = 0) {
    auto filled = [&](DType dtype, std::vector<int64_t> shape) {
      Tensor t = Tensor::Empty(dtype, shape);
      auto* bytes = static_cast<unsigned char*>(t.view().raw());
      for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(DTypeSize(dtype)); ++i) {
        bytes[i] = static_cast<unsigned char>(i * 31 + step * 7 + rank);
      }
      owned_.push_back(std::move(t));
      return owned_.back().view();
    };
    CheckpointContents c;
    c.step = step;
    c.tokens_seen = step * 4096;
    c.rank = rank;
    c.sections = {{"model_config", {{"hidden_size", 4}, {"num_experts", 2}}},
                  {"world_layout", {{"expert_parallel", 1}, {"data_parallel", 1}}},
                  {"data_position", {{"shard", 0}, {"offset", step * 64}}},
                  {"rng_state", {{"seed", 1234}, {"step", step}}}};
    c.model_tensors = {
        {"model.embed_tokens.weight", filled(DType::kF32, {8, 4})},
        {"model.layers.0.mlp.experts.0.gate_proj.weight", filled(DType::kBF16, {4, 4})},
        {"model.layers.0.mlp.gate.weight", filled(DType::kF32, {2, 4})},
        {"model.norm.weight", filled(DType::kF32, {4})}};
    c.optim_tensors = {{"exp_avg.model.norm.weight", filled(DType::kF32, {4})},
                       {"exp_avg_sq.model.norm.weight", filled(DType::kF32, {4})},
                       {"step", filled(DType::kI64, {})}};
    c.hf_config = {{"architectures", {"DeepseekV3ForCausalLM"}}, {"hidden_size", 4}};
    return c;
  }

  std::string Write(int64_t step) {
    absl::StatusOr<std::string> path = WriteCheckpoint(root_.string(), Contents(step));
    EXPECT_TRUE(path.ok()) << path.status();
    return path.value_or("");
  }

  // Writes steps 100 and 200, damages 200, and expects LoadLatestCheckpoint to fall back to 100
  // with a warning that contains `warning`.
  void ExpectFallbackTo100(const std::function<void(const fs::path& step200)>& damage,
                           const std::string& warning) {
    Write(100);
    const fs::path step200 = Write(200);
    damage(step200);
    absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root_.string());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 100);
    EXPECT_EQ(loaded->path, (root_ / "step-00000100").string());
    ASSERT_EQ(loaded->warnings.size(), 1u);
    EXPECT_TRUE(Contains(loaded->warnings[0], warning)) << loaded->warnings[0];
    // The explicit load of the damaged step says the same, naming the directory.
    const absl::StatusOr<LoadedCheckpoint> direct = LoadCheckpoint(step200.string());
    EXPECT_FALSE(direct.ok());
    EXPECT_TRUE(Contains(direct.status().message(), step200.string())) << direct.status();
  }

  const testutil::TempDir temp_dir_{"checkpoint_test"};
  const fs::path base_ = temp_dir_.path();
  fs::path root_ = base_ / "job-42";
  std::vector<Tensor> owned_;
};

TEST(CheckpointNamesTest, StepDirectoriesHaveEightDigits) {
  EXPECT_EQ(CheckpointStepDirName(100), "step-00000100");
  EXPECT_EQ(CheckpointStepDirName(0), "step-00000000");
  EXPECT_EQ(CheckpointStepDirName(123456789), "step-123456789");
  EXPECT_EQ(ModelFileName(0), "model-rank00000.safetensors");
  EXPECT_EQ(OptimFileName(12), "optim-rank00012.safetensors");
}

TEST_F(CheckpointTest, WriteListLoadRoundTrip) {
  const CheckpointContents contents = Contents(100);
  absl::StatusOr<std::string> path = WriteCheckpoint(root_.string(), contents);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, (root_ / "step-00000100").string());
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"step-00000100"}));  // no .tmp-* left
  EXPECT_EQ(Entries(*path),
            (std::set<std::string>{"manifest.json", "config.json", "model-rank00000.safetensors",
                                   "optim-rank00000.safetensors"}));

  const Json manifest = Json::parse(ReadBytes(fs::path(*path) / "manifest.json"));
  EXPECT_EQ(manifest["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(manifest["job_id"], "job-42");
  EXPECT_EQ(manifest["step"], 100);
  EXPECT_EQ(manifest["tokens_seen"], 100 * 4096);
  for (const auto& [key, value] : contents.sections.items()) EXPECT_EQ(manifest[key], value);
  ASSERT_EQ(manifest["files"].size(), 3u);
  for (const Json& file : manifest["files"]) {
    const fs::path file_path = fs::path(*path) / file["name"].get<std::string>();
    EXPECT_EQ(file["bytes"], fs::file_size(file_path)) << file_path;
    EXPECT_EQ(file["sha256"], DigestFile(file_path.string())->sha256) << file_path;
  }
  EXPECT_EQ(Json::parse(ReadBytes(fs::path(*path) / "config.json")), contents.hf_config);
  // Hugging Face loaders look for this tag.
  EXPECT_EQ(ReadSafetensors(*path + "/model-rank00000.safetensors")->metadata().at("format"), "pt");

  EXPECT_EQ(*ListCheckpointSteps(root_.string()), (std::vector<int64_t>{100}));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->path, *path);
  EXPECT_EQ(loaded->step, 100);
  EXPECT_EQ(loaded->tokens_seen, 100 * 4096);
  EXPECT_TRUE(loaded->warnings.empty());
  EXPECT_EQ(loaded->manifest["rng_state"], contents.sections["rng_state"]);
  EXPECT_EQ(loaded->manifest["data_position"], contents.sections["data_position"]);
  EXPECT_EQ(loaded->hf_config, contents.hf_config);
  for (const auto& [written, read] : {std::pair{&contents.model_tensors, &loaded->model_tensors},
                                      std::pair{&contents.optim_tensors, &loaded->optim_tensors}}) {
    ASSERT_EQ(read->size(), written->size());
    for (const auto& [name, t] : *written) {
      SCOPED_TRACE(name);
      ASSERT_EQ(read->count(name), 1u);
      const Tensor& back = read->at(name);
      EXPECT_EQ(back.dtype(), t.dtype());
      EXPECT_EQ(back.view().DebugString(), t.DebugString());
      EXPECT_EQ(BytesOf(back), BytesOf(t));
    }
  }
}

TEST_F(CheckpointTest, ARootWithATrailingSlashNamesTheSameJob) {
  ASSERT_TRUE(WriteCheckpoint(root_.string() + "/", Contents(5)).ok());
  const Json manifest = Json::parse(ReadBytes(root_ / "step-00000005" / "manifest.json"));
  EXPECT_EQ(manifest["job_id"], "job-42");
}

TEST_F(CheckpointTest, ListsOnlyCanonicalStepDirectories) {
  Write(200);
  Write(100);
  for (const char* name : {"step-100", "step-0000030x", "notes", ".tmp-step-00000300-abc"}) {
    fs::create_directories(root_ / name);
  }
  WriteBytes(root_ / "step-00000400", "a file, not a directory");
  EXPECT_EQ(*ListCheckpointSteps(root_.string()), (std::vector<int64_t>{100, 200}));
  const absl::StatusOr<std::vector<int64_t>> none = ListCheckpointSteps((base_ / "no").string());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(CheckpointTest, FlippedByteInATensorFileFallsBack) {
  ExpectFallbackTo100(
      [](const fs::path& step) {
        const fs::path file = step / "model-rank00000.safetensors";
        std::string bytes = ReadBytes(file);
        bytes[bytes.size() - 5] ^= 0x10;
        WriteBytes(file, bytes);
      },
      "step-00000200: model-rank00000.safetensors sha256 mismatch");
}

TEST_F(CheckpointTest, TruncatedFileFallsBack) {
  ExpectFallbackTo100(
      [](const fs::path& step) {
        const fs::path file = step / "optim-rank00000.safetensors";
        fs::resize_file(file, fs::file_size(file) - 7);
      },
      "step-00000200: optim-rank00000.safetensors has");
}

TEST_F(CheckpointTest, MissingFileFallsBack) {
  ExpectFallbackTo100([](const fs::path& step) { fs::remove(step / "config.json"); },
                      "step-00000200: config.json is missing");
}

TEST_F(CheckpointTest, CorruptManifestFallsBack) {
  ExpectFallbackTo100(
      [](const fs::path& step) { WriteBytes(step / "manifest.json", "{\"format_version\": 1,"); },
      "step-00000200: manifest.json is not valid JSON");
}

// A files entry that is malformed and holds a member nested 10^6 deep (2 MB): quoting the entry in
// the error recursed once per level and overflowed the stack (SIGSEGV), in every reader of the
// step. In a child process, so that the old crash fails only this test.
TEST_F(CheckpointTest, DeeplyNestedManifestIsDamageNotACrash) {
  Write(100);
  const fs::path step200 = Write(200);
  Json manifest = Json::parse(ReadBytes(step200 / "manifest.json"));
  manifest["files"][0]["name"] = "../elsewhere";
  std::string text = manifest.dump();
  const std::string name = "\"name\":\"../elsewhere\"";
  ASSERT_NE(text.find(name), std::string::npos) << text;
  text.insert(text.find(name) + name.size(), ",\"deep\":" + testutil::NestedJsonArrays(1000000));
  WriteBytes(step200 / "manifest.json", text);
  const std::string refusal = "manifest.json nests JSON arrays and objects deeper than 64 levels";
  EXPECT_EXIT(testutil::ExitWithError(LoadCheckpointManifest(step200.string())),
              ::testing::ExitedWithCode(0), refusal);
  if (HasFailure()) return;  // the old code would crash the test process below
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100);
  ASSERT_EQ(loaded->warnings.size(), 1u);
  EXPECT_EQ(loaded->warnings[0], "step-00000200: " + refusal);
}

// config.json is parsed with the same bound when a step is loaded.
TEST_F(CheckpointTest, DeeplyNestedConfigJsonFallsBack) {
  ExpectFallbackTo100(
      [](const fs::path& step) {
        const fs::path config = step / "config.json";
        WriteBytes(config, "{\"architectures\": " + testutil::NestedJsonArrays(1000000) + "}");
        const FileDigest digest = *DigestFile(config.string());
        Json manifest = Json::parse(ReadBytes(step / "manifest.json"));
        for (Json& entry : manifest["files"]) {
          if (entry["name"] == "config.json") {
            entry["bytes"] = digest.bytes;
            entry["sha256"] = digest.sha256;
          }
        }
        WriteBytes(step / "manifest.json", manifest.dump());
      },
      "step-00000200: config.json nests JSON arrays and objects deeper than 64 levels");
}

// A step's manifest.json or config.json that is a FIFO, a link or too large, as a checkpoint from
// elsewhere (init_from) can hold: the FIFO blocked the reader for good, a large one was read whole.
// Now each is damage, named, and an older good step is used. On a thread with a deadline, so that
// a blocking read fails the test rather than hanging it.
TEST_F(CheckpointTest, AManifestThatIsNoPlainFileOrTooLargeFallsBack) {
  Write(100);
  const fs::path step200 = Write(200);
  const std::string saved = ReadBytes(step200 / "manifest.json");
  const std::pair<std::function<void(const fs::path&)>, std::string> cases[] = {
      {[](const fs::path& file) { ASSERT_EQ(mkfifo(file.c_str(), 0600), 0); }, "a FIFO"},
      {[](const fs::path& file) { fs::create_symlink("elsewhere.json", file); }, "a symbolic link"},
      {[](const fs::path& file) { WriteBytes(file, std::string((16 << 20) + 1, ' ')); },
       "more than"}};
  for (const auto& [make, what] : cases) {
    SCOPED_TRACE(what);
    fs::remove(step200 / "manifest.json");
    make(step200 / "manifest.json");
    std::future<absl::StatusOr<LoadedCheckpoint>> loading =
        std::async(std::launch::async, [&] { return LoadLatestCheckpoint(root_.string()); });
    ASSERT_EQ(loading.wait_for(std::chrono::seconds(20)), std::future_status::ready)
        << "the reader blocks on " << what;
    const absl::StatusOr<LoadedCheckpoint> loaded = loading.get();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 100);
    ASSERT_EQ(loaded->warnings.size(), 1u);
    EXPECT_NE(loaded->warnings[0].find("manifest.json"), std::string::npos) << loaded->warnings[0];
    EXPECT_NE(loaded->warnings[0].find(what), std::string::npos) << loaded->warnings[0];
  }
  fs::remove(step200 / "manifest.json");
  WriteBytes(step200 / "manifest.json", saved);
}

TEST_F(CheckpointTest, ManifestOfAnotherVersionFallsBack) {
  ExpectFallbackTo100(
      [](const fs::path& step) {
        Json manifest = Json::parse(ReadBytes(step / "manifest.json"));
        manifest["format_version"] = kCheckpointFormatVersion + 1;
        WriteBytes(step / "manifest.json", manifest.dump());
      },
      absl::StrCat("step-00000200: manifest.json: format_version ", kCheckpointFormatVersion + 1,
                   " is not supported"));
}

TEST_F(CheckpointTest, ConsistentChecksumsOfAnUnparsableFileFallBack) {
  // Same size, matching sha256 in the manifest, but not a safetensors file: the parse catches it.
  ExpectFallbackTo100(
      [](const fs::path& step) {
        const fs::path file = step / "model-rank00000.safetensors";
        WriteBytes(file, std::string(fs::file_size(file), 'x'));
        Json manifest = Json::parse(ReadBytes(step / "manifest.json"));
        for (Json& entry : manifest["files"]) {
          if (entry["name"] == "model-rank00000.safetensors") {
            entry["sha256"] = DigestFile(file.string())->sha256;
          }
        }
        WriteBytes(step / "manifest.json", manifest.dump());
      },
      "model-rank00000.safetensors: header length");
}

TEST_F(CheckpointTest, LeftoverTemporaryDirectoryIsReportedAndIgnored) {
  Write(100);
  Write(200);
  // What a crash in the middle of writing step 300 leaves behind.
  const fs::path tmp = root_ / ".tmp-step-00000300-deadbeef";
  fs::create_directories(tmp);
  WriteBytes(tmp / "model-rank00000.safetensors", "partial");
  EXPECT_EQ(*ListCheckpointSteps(root_.string()), (std::vector<int64_t>{100, 200}));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root_.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 200);
  ASSERT_EQ(loaded->warnings.size(), 1u);
  EXPECT_TRUE(Contains(loaded->warnings[0], ".tmp-step-00000300-deadbeef")) << loaded->warnings[0];
}

TEST_F(CheckpointTest, NoGoodCheckpointIsDataLossNamingEveryStep) {
  Write(100);
  Write(200);
  fs::remove(root_ / "step-00000100" / "manifest.json");
  fs::remove(root_ / "step-00000200" / "model-rank00000.safetensors");
  const absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(root_.string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(loaded.status().message(), "step-00000100: manifest.json"))
      << loaded.status();
  EXPECT_TRUE(Contains(loaded.status().message(), "step-00000200: model-rank00000"))
      << loaded.status();
}

TEST_F(CheckpointTest, NoCheckpointIsNotFound) {
  EXPECT_EQ(LoadLatestCheckpoint(root_.string()).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(root_ / ".tmp-step-00000001-0");
  EXPECT_EQ(LoadLatestCheckpoint(root_.string()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadCheckpoint((root_ / "step-00000007").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, LoadsAnExplicitStep) {
  Write(100);
  Write(200);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint((root_ / "step-00000100").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 100);
  EXPECT_EQ(loaded->manifest["data_position"]["offset"], 100 * 64);
}

TEST_F(CheckpointTest, ManifestStepMustMatchTheDirectory) {
  Write(100);
  fs::rename(root_ / "step-00000100", root_ / "step-00000300");
  const absl::StatusOr<LoadedCheckpoint> loaded =
      LoadCheckpoint((root_ / "step-00000300").string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(loaded.status().message(), "says step 100")) << loaded.status();
}

TEST_F(CheckpointTest, RanksHaveTheirOwnFiles) {
  const absl::StatusOr<std::string> path = WriteCheckpoint(root_.string(), Contents(100, 3));
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(fs::exists(fs::path(*path) / "model-rank00003.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(*path) / "optim-rank00003.safetensors"));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(*path, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model_tensors.size(), 4u);
  const absl::StatusOr<LoadedCheckpoint> other = LoadCheckpoint(*path, 0);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(other.status().message(), "lists no model-rank00000.safetensors"));
  EXPECT_EQ(LoadCheckpoint(*path, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, FormatVersionOneStillLoads) {
  const std::string path = Write(100);
  Json manifest = Json::parse(ReadBytes(fs::path(path) / "manifest.json"));
  manifest["format_version"] = 1;
  WriteBytes(fs::path(path) / "manifest.json", manifest.dump());
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->model_tensors.size(), 4u);
}

// Two ranks write their own tensors into one temporary directory, the first commits the step.
TEST_F(CheckpointTest, ShardsOfSeveralRanksMakeOneStep) {
  CheckpointContents rank0 = Contents(100, 0), rank1 = Contents(100, 1);
  rank1.model_tensors.erase(rank1.model_tensors.begin());  // the embedding only in rank 0's
  for (auto& [name, view] : rank1.model_tensors) name += ".rank1";
  for (auto& [name, view] : rank1.optim_tensors) name += ".rank1";
  const uint64_t nonce = NewCheckpointNonce();
  absl::StatusOr<std::string> tmp = BeginCheckpoint(root_.string(), 100, nonce);
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  EXPECT_EQ(*tmp, CheckpointTempDir(root_.string(), 100, nonce));
  EXPECT_EQ(BeginCheckpoint(root_.string(), 100, nonce).status().code(),
            absl::StatusCode::kAlreadyExists);
  std::vector<CheckpointFile> files;
  for (const CheckpointContents* shard : {&rank1, &rank0}) {
    absl::StatusOr<std::vector<CheckpointFile>> written = WriteCheckpointShard(*tmp, *shard);
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_EQ(written->size(), 2u);
    files.insert(files.end(), written->begin(), written->end());
  }
  absl::StatusOr<std::string> path = CommitCheckpoint(root_.string(), *tmp, rank0, files);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"step-00000100"}));
  EXPECT_EQ(Entries(*path),
            (std::set<std::string>{"manifest.json", "config.json", "model-rank00000.safetensors",
                                   "optim-rank00000.safetensors", "model-rank00001.safetensors",
                                   "optim-rank00001.safetensors"}));
  EXPECT_EQ(Json::parse(ReadBytes(fs::path(*path) / "manifest.json"))["files"].size(), 5u);

  // Each rank reads what it needs; files read together are merged.
  absl::StatusOr<LoadedCheckpoint> both =
      LoadCheckpoint(*path, CheckpointReadOptions{.ranks = {0, 1}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(both->model_tensors.size(), 7u);
  EXPECT_EQ(both->optim_tensors.size(), 6u);
  EXPECT_EQ(BytesOf(both->model_tensors.at("model.norm.weight.rank1")),
            BytesOf(rank1.model_tensors.back().second));
  absl::StatusOr<LoadedCheckpoint> models_only =
      LoadCheckpoint(*path, CheckpointReadOptions{.ranks = {1}, .optimizer = false});
  ASSERT_TRUE(models_only.ok()) << models_only.status();
  EXPECT_EQ(models_only->model_tensors.size(), 3u);
  EXPECT_TRUE(models_only->optim_tensors.empty());

  // Only the files read are hashed: damage in rank 1's optimizer file spares a model-only read.
  const fs::path optim1 = fs::path(*path) / "optim-rank00001.safetensors";
  std::string bytes = ReadBytes(optim1);
  bytes[bytes.size() - 3] ^= 0x40;
  WriteBytes(optim1, bytes);
  EXPECT_TRUE(
      LoadCheckpoint(*path, CheckpointReadOptions{.ranks = {0, 1}, .optimizer = false}).ok());
  const absl::Status damaged =
      LoadCheckpoint(*path, CheckpointReadOptions{.ranks = {0, 1}}).status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(damaged.message(), "optim-rank00001.safetensors sha256 mismatch"))
      << damaged;
  EXPECT_TRUE(LoadCheckpointManifest(*path).ok()) << "the manifest check does not hash";
}

TEST_F(CheckpointTest, ATensorInTwoRankFilesIsDamage) {
  const uint64_t nonce = NewCheckpointNonce();
  absl::StatusOr<std::string> tmp = BeginCheckpoint(root_.string(), 7, nonce);
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  std::vector<CheckpointFile> files;
  for (int rank : {0, 1}) {
    absl::StatusOr<std::vector<CheckpointFile>> written =
        WriteCheckpointShard(*tmp, Contents(7, rank));
    ASSERT_TRUE(written.ok()) << written.status();
    files.insert(files.end(), written->begin(), written->end());
  }
  absl::StatusOr<std::string> path = CommitCheckpoint(root_.string(), *tmp, Contents(7), files);
  ASSERT_TRUE(path.ok()) << path.status();
  const absl::Status status =
      LoadCheckpoint(*path, CheckpointReadOptions{.ranks = {0, 1}}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(status.message(), "is in another rank file too")) << status;
}

TEST_F(CheckpointTest, AFailedCommitLeavesNothing) {
  absl::StatusOr<std::string> tmp = BeginCheckpoint(root_.string(), 3, NewCheckpointNonce());
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  CheckpointContents bad = Contents(3);
  bad.sections["step"] = 4;  // the manifest's own key
  EXPECT_EQ(CommitCheckpoint(root_.string(), *tmp, bad, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries(root_).empty());
}

TEST_F(CheckpointTest, RewritingAStepIsAlreadyExistsAndLeavesNothing) {
  Write(100);
  const absl::StatusOr<std::string> again = WriteCheckpoint(root_.string(), Contents(100));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"step-00000100"}));
}

TEST_F(CheckpointTest, RejectsBadContents) {
  CheckpointContents reserved = Contents(1);
  reserved.sections["files"] = Json::array();
  EXPECT_EQ(WriteCheckpoint(root_.string(), reserved).status().code(),
            absl::StatusCode::kInvalidArgument);
  CheckpointContents not_object = Contents(1);
  not_object.sections = Json::array();
  EXPECT_EQ(WriteCheckpoint(root_.string(), not_object).status().code(),
            absl::StatusCode::kInvalidArgument);
  CheckpointContents negative = Contents(-1);
  EXPECT_EQ(WriteCheckpoint(root_.string(), negative).status().code(),
            absl::StatusCode::kInvalidArgument);
  CheckpointContents duplicate = Contents(1);
  duplicate.model_tensors.push_back(duplicate.model_tensors[0]);
  const absl::Status status = WriteCheckpoint(root_.string(), duplicate).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "duplicate name")) << status;
  // A failed write cleans up after itself.
  EXPECT_TRUE(Entries(root_).empty());
}

TEST_F(CheckpointTest, PruneKeepsTheNewestAndRemovesLeftovers) {
  for (int64_t step : {100, 200, 300, 400, 500}) Write(step);
  fs::create_directories(root_ / ".tmp-step-00000600-0123abcd");
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 2).ok());
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"step-00000400", "step-00000500"}));
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 5).ok());
  EXPECT_EQ(*ListCheckpointSteps(root_.string()), (std::vector<int64_t>{400, 500}));
  EXPECT_EQ(PruneCheckpoints(root_.string(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(PruneCheckpoints((base_ / "nothing-here").string(), 1).ok());
}

TEST_F(CheckpointTest, PruneDoesNotCountDamagedSteps) {
  for (int64_t step : {100, 200, 300}) Write(step);
  fs::remove(root_ / "step-00000300" / "optim-rank00000.safetensors");
  ASSERT_TRUE(PruneCheckpoints(root_.string(), 2).ok());
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"step-00000100", "step-00000200"}));
  EXPECT_EQ(LoadLatestCheckpoint(root_.string())->step, 200);
}

}  // namespace
}  // namespace moetrain
