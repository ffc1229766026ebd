// What `moetrain import --from-hf` refuses of a hostile or broken Hugging Face directory, naming
// the file, key or tensor (issue 31): files that are not the directory's own regular files (a
// symbolic link out of it, a FIFO that would block the open forever), JSON files too large to
// read, a sequence length that is negative or no exact integer, NaN or Inf weights, more memory
// than the limit. And `export --to-hf` onto a symbolic link, resolved before anything is written.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/hf_checkpoint.h"
#include "engine/train/hf_config.h"
#include "engine/train/memory_estimate.h"
#include "engine/train/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/transformer_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::HasSubstr;
using transformer_test::MakeModel;
using transformer_test::TinyConfig;

constexpr int64_t kSeqLen = 8;

class HfInputTest : public ::testing::Test {
 protected:
  HfInputTest() : model_(MakeModel(TinyConfig(), DType::kF32, 5)) {}

  // The Hugging Face directory of the tiny model as export writes it (config.json with
  // moetrain_model_config) with `config` in place of its config.json and the f32 parameters in
  // one model.safetensors, `edit` applied to the first value of `poisoned` (a parameter's name).
  fs::path WriteDir(const std::string& name, const Json& config, const std::string& poisoned = "",
                    float edit = 0.0f) {
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump(2);
    std::vector<Tensor> copies;
    std::vector<std::pair<std::string, TensorView>> views;
    for (const NamedParameter& p : model_.parameters()) {
      copies.push_back(Tensor::Empty(DType::kF32, p.value.shape()));
      EXPECT_OK(ops::CopyTensor(ExecContext::Cpu(), p.value, copies.back()));
      if (p.name == poisoned) copies.back().data<float>()[0] = edit;
      views.emplace_back(p.name, copies.back().view());
    }
    EXPECT_OK(WriteSafetensors((dir / kHfSingleFileName).string(), views, {{"format", "pt"}}));
    return dir;
  }
  fs::path WriteDir(const std::string& name) { return WriteDir(name, Config()); }

  Json Config() const { return HuggingFaceConfig(model_.config(), kSeqLen); }

  absl::Status Import(const fs::path& dir, const HfImportOptions& options = {}) {
    return ImportHuggingFace(dir.string(), (dir_ / ("out-" + dir.filename().string())).string(),
                             options)
        .status();
  }

  const Transformer model_;
  const testutil::TempDir temp_dir_{"hf_checkpoint_input_test"};
  const fs::path dir_ = temp_dir_.path();
};

TEST_F(HfInputTest, ImportsTheDirectoryAsExportWritesIt) { EXPECT_OK(Import(WriteDir("plain"))); }

// -1 passed before (a moetrain export's config does not read the key otherwise), and 1e30 became
// INT64_MIN: both went into the checkpoint's config.json as the sequence length.
TEST_F(HfInputTest, RefusesASequenceLengthBelowOneOrNotAnExactInteger) {
  const std::pair<Json, const char*> cases[] = {
      {Json(-1), "config.json: max_position_embeddings = -1 must be at least 1"},
      {Json(0), "config.json: max_position_embeddings = 0 must be at least 1"},
      {Json(1e30), "config.json: max_position_embeddings = 1e+30 is out of range"},
      {Json(8.5), "config.json: max_position_embeddings = 8.5 is not an integer"},
      {Json("8"), "config.json: max_position_embeddings must be an integer, not a JSON string"},
  };
  int i = 0;
  for (const auto& [value, message] : cases) {
    SCOPED_TRACE(value.dump());
    Json config = Config();
    config["max_position_embeddings"] = value;
    const absl::Status status = Import(WriteDir(absl::StrCat("seq", i++), config));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
  Json exact = Config();
  exact["max_position_embeddings"] = 8.0;  // an integer written with a fraction point
  EXPECT_OK(Import(WriteDir("exact", exact)));
}

TEST_F(HfInputTest, RefusesNaNAndInfiniteWeightsNamingTheTensor) {
  const std::string name = model_.parameters()[1].name;
  int i = 0;
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    const fs::path dir = WriteDir(absl::StrCat("bad", i++), Config(), name, bad);
    const absl::Status status = Import(dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat((dir / kHfSingleFileName).string(), ": tensor ", name,
                                       " holds NaN or infinite values")));
  }
}

// A link could lead anywhere, such as another job's checkpoint: the weights are read only from the
// directory's own files, and the link is named with where it leads.
TEST_F(HfInputTest, RefusesSymbolicLinksOutOfTheDirectory) {
  const fs::path elsewhere = WriteDir("elsewhere");
  for (const char* file : {kHfSingleFileName, "config.json"}) {
    SCOPED_TRACE(file);
    const fs::path dir = WriteDir(absl::StrCat("linked-", file));
    fs::remove(dir / file);
    fs::create_symlink(elsewhere / file, dir / file);
    const absl::Status status = Import(dir);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat((dir / file).string(), " is a symbolic link to ",
                                       (elsewhere / file).string())));
  }
}

// Opening a FIFO for reading waits for a writer: the import hung forever. Run apart, so that a
// hang fails the test (its writer end is then opened, which lets the open return) instead of
// blocking it.
TEST_F(HfInputTest, RefusesAFifoShardWithoutWaitingForAWriter) {
  const fs::path dir = WriteDir("fifo");
  const fs::path shard = dir / kHfSingleFileName;
  fs::remove(shard);
  ASSERT_EQ(mkfifo(shard.c_str(), 0600), 0) << strerror(errno);
  std::future<absl::Status> import = std::async(std::launch::async, [&] { return Import(dir); });
  if (import.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the import still waits on the FIFO after 60 s";
    const int writer = open(shard.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
  }
  const absl::Status status = import.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(shard.string(), " is a FIFO, not a regular file")));
}

// Refused by their size before they are read: a 300 MB config.json took 1.7 GB to parse.
TEST_F(HfInputTest, RefusesJsonFilesLargerThanTheirCap) {
  const fs::path config_dir = WriteDir("big-config");
  std::ofstream(config_dir / "config.json")
      << Config().dump() << std::string((int64_t{1} << 20) - Config().dump().size() + 1, ' ');
  ASSERT_EQ(fs::file_size(config_dir / "config.json"), (uint64_t{1} << 20) + 1);
  absl::Status status = Import(config_dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("config.json is 1048577 bytes, more than the 1048576"));

  // Sparse: its size is what counts.
  const fs::path index_dir = WriteDir("big-index");
  std::ofstream(index_dir / kHfIndexName).close();
  fs::resize_file(index_dir / kHfIndexName, (uint64_t{16} << 20) + 1);
  status = Import(index_dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(kHfIndexName,
                                                       " is 16777217 bytes, more than the "
                                                       "16777216")));
}

TEST_F(HfInputTest, RefusesAnImportLargerThanItsMemoryLimitNamingBothFigures) {
  const fs::path dir = WriteDir("memory");
  const int64_t shard_bytes = static_cast<int64_t>(fs::file_size(dir / kHfSingleFileName));
  const double model_bytes = 8 * ParameterCount(TinyConfig());
  const int64_t needed = static_cast<int64_t>(model_bytes) + shard_bytes;
  const absl::Status status =
      Import(dir, {.memory_limit_bytes = needed - 1, .memory_limit_name = "--memory-limit"});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr(FormatBytes(static_cast<double>(needed))));
  EXPECT_THAT(status.message(), HasSubstr(FormatBytes(static_cast<double>(needed - 1))));
  EXPECT_THAT(status.message(), HasSubstr((dir / kHfSingleFileName).string()));
  EXPECT_THAT(status.message(), HasSubstr("--memory-limit"));
  EXPECT_FALSE(fs::exists(dir_ / "out-memory"));
  // The parameter count is the model's (its buffer pads each tensor to 16 elements).
  EXPECT_NEAR(ParameterCount(TinyConfig()), static_cast<double>(model_.master_buffer().numel()),
              16.0 * static_cast<double>(model_.parameters().size()));
  EXPECT_OK(Import(dir, {.memory_limit_bytes = needed, .memory_limit_name = "--memory-limit"}));
}

// The final rename replaced what the link named and failed on the link itself, after the whole
// export was written. Now the link is followed first.
TEST_F(HfInputTest, ExportOntoASymbolicLinkWritesIntoTheDirectoryItLeadsTo) {
  absl::StatusOr<HfImportReport> step =
      ImportHuggingFace(WriteDir("source").string(), (dir_ / "job").string());
  ASSERT_OK(step.status());
  const fs::path target = dir_ / "target";
  fs::create_directories(target);
  const fs::path link = dir_ / "link";
  fs::create_symlink(target, link);
  absl::StatusOr<HfExportReport> exported = ExportHuggingFace(step->step_dir, link.string());
  ASSERT_OK(exported.status());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::canonical(link), fs::canonical(target));
  EXPECT_TRUE(fs::exists(target / "config.json"));
  EXPECT_TRUE(fs::exists(target / kHfIndexName));
  EXPECT_EQ(exported->out_dir, fs::canonical(target).string());

  // A link that leads nowhere is refused before anything is written beside it.
  const fs::path dangling = dir_ / "dangling";
  fs::create_symlink(dir_ / "nowhere", dangling);
  const absl::Status refused = ExportHuggingFace(step->step_dir, dangling.string()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("which does not exist"));
  EXPECT_FALSE(fs::exists(dir_ / "nowhere"));
  // A link to a directory that is not empty: refused up front, as the directory itself is.
  EXPECT_EQ(ExportHuggingFace(step->step_dir, link.string()).status().code(),
            absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace moetrain
