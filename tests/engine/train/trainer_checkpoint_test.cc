// The trainer's checkpoints against files a job does not control: a manifest nested 10^6 deep
// that a job starts from (checkpoint.init_from) or resumes from, a token file truncated while the
// job trains, and one changed between a checkpoint and its resume. The crashes of old (SIGSEGV,
// SIGBUS) are run in child processes, so that each fails only its own test.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/train/tiny_trainer_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testing_config::TinyTrainerConfig;
using testutil::ExitWithError;
using testutil::TempDir;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Trains `config` to its last step; the step directory of its last checkpoint.
fs::path Train(const TrainerConfig& config) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  EXPECT_OK(trainer);
  if (!trainer.ok()) return {};
  EXPECT_OK((*trainer)->Run(nullptr));
  return fs::path(config.checkpoint_dir) / config.job_id / CheckpointStepDirName(config.steps);
}

// `step`'s manifest with the section `key` replaced by arrays nested 10^6 deep (2 MB).
void NestSectionDeep(const fs::path& step, const std::string& key) {
  Json manifest = Json::parse(ReadText(step / "manifest.json"));
  manifest[key] = "DEEP";
  std::string text = manifest.dump();
  text.replace(text.find("\"DEEP\""), 6, testutil::NestedJsonArrays(1000000));
  WriteText(step / "manifest.json", text);
}

// The tiny job on a uint16 token file of 40 windows (its vocabulary is 32), 4 steps, a
// checkpoint at the last.
class FileJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The trainer's threads are running: the children of the death tests start afresh.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    std::string bytes;
    for (int64_t i = 0; i < 40 * 33; ++i) {
      bytes.push_back(static_cast<char>(i * 7 % 32));
      bytes.push_back('\0');
    }
    WriteText(data_, bytes);
  }

  TrainerConfig Config() const {
    TrainerConfig c = TinyTrainerConfig(dir_.path().string());
    c.data.format = DataConfig::Format::kU16;
    c.data.path = data_.string();
    c.data.eval_fraction = 0;
    c.steps = 4;
    return c;
  }

  absl::Status Resume() const {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(Config());
    if (!trainer.ok()) return trainer.status();
    return (*trainer)->Resume(nullptr);
  }

  const TempDir dir_;
  const fs::path data_ = dir_.path() / "tokens.u16";
};

// A manifest whose model_config is nested 10^6 deep: copying it (init_from, resume) or the data
// position (resume) recursed once per level and overflowed the stack, and the worker died of
// SIGSEGV. Now the manifest is refused as it is parsed: init_from fails naming it, and resume
// finds no good step.
TEST_F(FileJobTest, ADeeplyNestedManifestIsRefusedNotACrash) {
  const fs::path step = Train(Config());
  ASSERT_TRUE(fs::exists(step / "manifest.json"));
  const std::string refusal = "manifest.json nests JSON arrays and objects deeper than 64 levels";
  for (const std::string section : {"model_config", "data_position"}) {
    SCOPED_TRACE(section);
    const std::string saved = ReadText(step / "manifest.json");
    NestSectionDeep(step, section);
    EXPECT_EXIT(ExitWithError(Resume()), ::testing::ExitedWithCode(0),
                "no good checkpoint under .*step-00000004: " + refusal);
    TrainerConfig finetune = Config();
    finetune.job_id = "finetune";
    const auto initialize = [&] {
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(finetune);
      return trainer.ok() ? (*trainer)->InitializeFrom(step.string()) : trainer.status();
    };
    // The child makes its own directory: the path differs from this process's.
    EXPECT_EXIT(ExitWithError(initialize()), ::testing::ExitedWithCode(0),
                "DATA_LOSS: /.*/tiny/step-00000004: " + refusal);
    WriteText(step / "manifest.json", saved);
  }
  EXPECT_OK(Resume());
}

// The layout a manifest records is read exactly: 2.5 ranks was read as 2 (and 1e300 as whatever
// the conversion, undefined there, gave). Now the step is damaged, naming the key and value.
TEST_F(FileJobTest, AManifestLayoutThatIsNoCountIsDamage) {
  const fs::path step = Train(Config());
  const std::string saved = ReadText(step / "manifest.json");
  const std::pair<Json, std::string> cases[] = {
      {2.5, "world_layout.data_parallel = 2.5 is not an integer"},
      {1e300, "world_layout.data_parallel = 1e+300 is out of range"},
      {-1, "world_layout.data_parallel = -1 is below 1"},
      {"2", "world_layout.data_parallel must be an integer, not a JSON string"},
      {int64_t{1} << 31,
       "world_layout.data_parallel = 2147483648 is out of the range of a 32-bit"}};
  for (const auto& [value, message] : cases) {
    SCOPED_TRACE(value.dump());
    Json manifest = Json::parse(saved);
    manifest["world_layout"]["data_parallel"] = value;
    WriteText(step / "manifest.json", manifest.dump());
    const absl::Status resumed = Resume();
    EXPECT_NE(resumed.message().find(message), std::string::npos) << resumed;
  }
  WriteText(step / "manifest.json", saved);
  EXPECT_OK(Resume());
}

// Truncating the token file under a training job: the file was memory-mapped, and the next batch
// killed the process with SIGBUS (exit 135). Now the step fails naming the file and the offset.
TEST_F(FileJobTest, ATokenFileTruncatedWhileTrainingFailsTheStepNamingIt) {
  const auto truncated_run = [&] {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(Config());
    if (!trainer.ok()) return trainer.status();
    fs::resize_file(data_, 0);
    return (*trainer)->Run(nullptr);
  };
  EXPECT_EXIT(ExitWithError(truncated_run()), ::testing::ExitedWithCode(0),
              "FAILED_PRECONDITION: data.path /.*/tokens.u16: byte offset [0-9]+ is past the end "
              "of the file, which has 0 bytes now and had 2640 when it was opened");
}

// A resume over a data file that changed since the checkpoint would count windows of other data:
// refused, naming the file, what the checkpoint recorded, what is there now, and what to do.
TEST_F(FileJobTest, AResumeOverAChangedDataFileIsRefused) {
  const fs::path step = Train(Config());
  ASSERT_TRUE(fs::exists(step));
  const Json manifest = Json::parse(ReadText(step / "manifest.json"));
  const Json& file = manifest["data_position"]["file"];
  EXPECT_EQ(file["path"], data_.string());
  EXPECT_EQ(file["bytes"], 2640);
  ASSERT_OK(Resume());  // unchanged: resumes

  // Longer by a window: the same windows per epoch at first sight, but other data.
  WriteText(data_, ReadText(data_) + std::string(66, '\0'));
  absl::Status status = Resume();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  const std::string message(status.message());
  for (const std::string& part :
       {step.string() + ": data.path " + data_.string() + " has changed since the checkpoint",
        std::string("it had 2640 bytes, modified "), std::string("it has 2706 bytes, modified "),
        std::string("restore the file"), std::string("in a new job")}) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }

  // The same size, touched: refused too.
  WriteText(data_, ReadText(data_).substr(0, 2640));
  fs::last_write_time(data_, fs::last_write_time(data_) + std::chrono::seconds(5));
  status = Resume();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("it has 2640 bytes, modified "), std::string::npos) << status;

  // A checkpoint written before the record is not checked: it resumes.
  Json old = manifest;
  old["data_position"].erase("file");
  WriteText(step / "manifest.json", old.dump());
  EXPECT_OK(Resume());
}

}  // namespace
}  // namespace moetrain
