// Data- and expert-parallel training across processes: the job of parallel_test_config.h run on
// dp × ep ranks (parallel_train_rank processes meeting over 127.0.0.1 through a FileKeyValueStore)
// against the same job in one process: per-step losses and the final weights (read back whole
// from the sharded checkpoint, as `moetrain eval` does) agree within float rounding; a rank
// killed after a checkpoint resumes bit-identically; damage in one rank's shard makes every rank
// fall back together. The sharded optimizer and resuming on another layout: sharded_training_test.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/parallel_ranks.h"
#include "tests/engine/train/parallel_test_config.h"
#include "tests/integration/child_process.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using testutil::TempDir;

using parallel_test::Number;
using parallel_test::Ranks;
using parallel_test::RunJob;
using parallel_test::Steps;

constexpr double kRelativeTolerance = 1e-5;

void ExpectClose(double reference, double value, const std::string& what) {
  EXPECT_LE(std::abs(value - reference), kRelativeTolerance * std::abs(reference))
      << what << ": " << value << " vs single-process " << reference;
}

// Records the single-process run's steps.
class Recorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { steps[report.step] = report; }
  std::map<int64_t, StepReport> steps;
};

// The job in this process, on one rank.
struct Reference {
  Recorder recorder;
  std::unique_ptr<Trainer> trainer;
};

std::unique_ptr<Reference> RunReference(const fs::path& dir, int64_t micro_batch_size = 0) {
  auto reference = std::make_unique<Reference>();
  TrainerConfig config = parallel_test::JobConfig((dir / "reference").string(), 1, 1);
  config.micro_batch_size = micro_batch_size;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return nullptr;
  reference->trainer = *std::move(trainer);
  const absl::Status ran = reference->trainer->Run(&reference->recorder);
  EXPECT_TRUE(ran.ok()) << ran;
  return reference;
}

// The whole model in a sharded step directory, loaded as `moetrain eval` does.
std::unique_ptr<Transformer> LoadWholeModel(const fs::path& step_dir) {
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(step_dir.string());
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  absl::StatusOr<Transformer> model =
      Transformer::Create(parallel_test::JobConfig("", 1, 1).model, DType::kF32);
  EXPECT_TRUE(model.ok()) << model.status();
  const absl::Status restored = RestoreModelParameters(*loaded, &*model);
  EXPECT_TRUE(restored.ok()) << restored;
  return std::make_unique<Transformer>(*std::move(model));
}

// Every parameter of `model` within kRelativeTolerance of `reference`'s (in the 2-norm).
void ExpectSameWeights(const Transformer& reference, const Transformer& model) {
  ASSERT_EQ(reference.parameters().size(), model.parameters().size());
  for (size_t i = 0; i < reference.parameters().size(); ++i) {
    const NamedParameter& want = reference.parameters()[i];
    const NamedParameter& got = model.parameters()[i];
    ASSERT_EQ(want.name, got.name);
    double diff = 0, norm = 0;
    for (int64_t j = 0; j < want.value.numel(); ++j) {
      const double w = want.value.data<float>()[j], g = got.value.data<float>()[j];
      diff += (w - g) * (w - g);
      norm += w * w;
    }
    EXPECT_LE(std::sqrt(diff), kRelativeTolerance * std::sqrt(norm))
        << want.name << ": relative difference " << std::sqrt(diff / norm);
  }
}

// Trains the job on dp × ep ranks and compares it with the single process.
void ExpectLayoutMatchesOneProcess(int dp, int ep) {
  TempDir dir;
  std::unique_ptr<Reference> reference = RunReference(dir.path());
  ASSERT_NE(reference, nullptr);
  const std::vector<std::vector<Json>> ranks = RunJob(dp, ep, dir.path());
  ASSERT_EQ(ranks.size(), static_cast<size_t>(dp * ep));
  const std::map<int64_t, Json> steps = Steps(ranks[0]);
  ASSERT_EQ(steps.size(), 10u) << ranks[0].size() << " lines";
  for (const auto& [step, want] : reference->recorder.steps) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const Json& got = steps.at(step);
    ExpectClose(want.loss, Number(got, "loss"), "loss");
    ExpectClose(want.aux_loss, Number(got, "aux_loss"), "aux_loss");
    ExpectClose(want.z_loss, Number(got, "z_loss"), "z_loss");
    ExpectClose(want.grad_norm, Number(got, "grad_norm"), "grad_norm");
    EXPECT_EQ(want.lr, Number(got, "lr"));
    EXPECT_EQ(want.tokens_seen, got["tokens_seen"].get<int64_t>());
    EXPECT_EQ(want.expert_load_max_over_mean, Number(got, "expert_load"));
    EXPECT_EQ(want.expert_tokens, got["expert_tokens"].get<std::vector<int64_t>>());
    ASSERT_EQ(want.eval_loss.has_value(), got.contains("eval_loss"));
    if (want.eval_loss.has_value()) ExpectClose(*want.eval_loss, Number(got, "eval_loss"), "eval");
  }
  // Every rank reports the same global numbers, to the bit.
  for (size_t rank = 1; rank < ranks.size(); ++rank) {
    const std::map<int64_t, Json> other = Steps(ranks[rank]);
    for (const auto& [step, line] : steps) {
      EXPECT_EQ(other.at(step)["loss"], line["loss"]) << "rank " << rank << " step " << step;
      EXPECT_EQ(other.at(step)["grad_norm"], line["grad_norm"]) << "rank " << rank;
    }
  }
  const fs::path step_dir = dir.path() / "checkpoints" / "parallel" / "step-00000010";
  std::unique_ptr<Transformer> whole = LoadWholeModel(step_dir);
  ASSERT_NE(whole, nullptr);
  ExpectSameWeights(reference->trainer->model(), *whole);

  // Only the first replica of each expert shard writes files, rank 0 the dense part too.
  for (int rank = 0; rank < dp * ep; ++rank) {
    EXPECT_EQ(fs::exists(step_dir / ModelFileName(rank)), rank < ep) << rank;
    EXPECT_EQ(fs::exists(step_dir / OptimFileName(rank)), rank < ep) << rank;
  }
  std::ifstream manifest_file(step_dir / "manifest.json");
  const Json layout = Json::parse(manifest_file)["world_layout"];
  EXPECT_EQ(layout["world_size"], dp * ep);
  EXPECT_EQ(layout["data_parallel"], dp);
  EXPECT_EQ(layout["expert_parallel"], ep);
  EXPECT_EQ(layout["shards"].size(), static_cast<size_t>(ep));
}

TEST(ParallelTrainingTest, DataParallel2MatchesOneProcess) { ExpectLayoutMatchesOneProcess(2, 1); }

TEST(ParallelTrainingTest, ExpertParallel2MatchesOneProcess) {
  ExpectLayoutMatchesOneProcess(1, 2);
}

TEST(ParallelTrainingTest, ExpertParallel4MatchesOneProcess) {
  ExpectLayoutMatchesOneProcess(1, 4);
}

TEST(ParallelTrainingTest, DataParallel2ByExpertParallel2MatchesOneProcess) {
  ExpectLayoutMatchesOneProcess(2, 2);
}

// FP8 with delayed scaling on two expert-parallel ranks: each rank records the amaxes of its own
// experts' slots and the step's reduction over the world gives every rank the same scales, those
// of the single process. An expert's rows arrive in blocks from each rank but are quantised with
// its one delayed scale, so the layouts agree up to float rounding (plus the FP8 roundings that
// rounding moves across a boundary: a looser bound than f32's).
TEST(ParallelTrainingTest, Fp8DelayedScalingOnTwoExpertRanksTracksOneProcess) {
  TempDir dir;
  absl::StatusOr<TrainerConfig> config = parallel_test::WithFp8(
      parallel_test::JobConfig((dir.path() / "reference").string(), 1, 1), "delayed");
  ASSERT_OK(config.status());
  Recorder reference;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&reference));
  const std::vector<std::vector<Json>> ranks = RunJob(1, 2, dir.path(), {"--fp8", "delayed"});
  ASSERT_EQ(ranks.size(), 2u);
  const std::map<int64_t, Json> steps = Steps(ranks[0]);
  ASSERT_EQ(steps.size(), 10u) << ranks[0].size() << " lines";
  for (const auto& [step, want] : reference.steps) {
    const double got = Number(steps.at(step), "loss");
    EXPECT_LE(std::abs(got - want.loss), 1e-3 * want.loss) << "step " << step;
    EXPECT_EQ(Steps(ranks[1]).at(step)["loss"], steps.at(step)["loss"]) << "step " << step;
  }
  // Rank 0 wrote the recipe's state with the dense part; rank 1 has no copy of it.
  const fs::path step_dir = dir.path() / "checkpoints" / "parallel" / "step-00000010";
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(step_dir.string());
  ASSERT_OK(loaded.status());
  EXPECT_TRUE(loaded->optim_tensors.contains("fp8_state"));
  std::ifstream manifest_file(step_dir / "manifest.json");
  EXPECT_EQ(Json::parse(manifest_file)["fp8"]["recipe"], "delayed");
}

// DeepSeek-V3's attention and multi-token prediction on 2 × 2 ranks: the MTP module's MoE block
// exchanges tokens like the others, its experts are sharded and its parameters join the first
// gradient stage; the losses (main and MTP) and gradient norms are the single process's.
TEST(ParallelTrainingTest, MlaAndMultiTokenPredictionOnTwoByTwoRanksMatchOneProcess) {
  TempDir dir;
  const TrainerConfig config = parallel_test::WithDeepseekV3(
      parallel_test::JobConfig((dir.path() / "reference").string(), 1, 1));
  Recorder reference;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&reference));
  const std::vector<std::vector<Json>> ranks = RunJob(2, 2, dir.path(), {"--deepseek"});
  ASSERT_EQ(ranks.size(), 4u);
  const std::map<int64_t, Json> steps = Steps(ranks[0]);
  ASSERT_EQ(steps.size(), 10u) << ranks[0].size() << " lines";
  for (const auto& [step, want] : reference.steps) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const Json& got = steps.at(step);
    ExpectClose(want.loss, Number(got, "loss"), "loss");
    ASSERT_TRUE(want.mtp_loss.has_value());
    ExpectClose(*want.mtp_loss, Number(got, "mtp_loss"), "mtp_loss");
    ExpectClose(want.grad_norm, Number(got, "grad_norm"), "grad_norm");
    EXPECT_EQ(want.expert_tokens, got["expert_tokens"].get<std::vector<int64_t>>());
  }
}

// Two micro-batches a step: rank r's share of micro-batch m is not the single process's
// micro-batch m, which changes only the aux loss's token counts. The first step's cross-entropy
// and z-loss are still the single process's.
TEST(ParallelTrainingTest, SeveralMicroBatchesDifferOnlyInTheAuxLoss) {
  TempDir dir;
  std::unique_ptr<Reference> reference = RunReference(dir.path(), /*micro_batch_size=*/4);
  ASSERT_NE(reference, nullptr);
  const std::vector<std::vector<Json>> ranks = RunJob(2, 2, dir.path(), {"--micro", "4"});
  const std::map<int64_t, Json> steps = Steps(ranks[0]);
  ASSERT_EQ(steps.size(), 10u);
  const StepReport& want = reference->recorder.steps.at(1);
  ExpectClose(want.loss, Number(steps.at(1), "loss"), "loss");
  ExpectClose(want.z_loss, Number(steps.at(1), "z_loss"), "z_loss");
  // The aux loss is close (the same tokens, counted in other groups), and training goes on.
  EXPECT_NEAR(Number(steps.at(1), "aux_loss"), want.aux_loss, 0.1 * want.aux_loss);
  EXPECT_LT(Number(steps.at(10), "loss"), Number(steps.at(1), "loss"));
}

// The step lines of the straight run and of the resumed one, for steps 6–10, are the same bits,
// and so are the final checkpoints' tensors.
TEST(ParallelTrainingTest, KilledAfterACheckpointResumesBitIdentically) {
  TempDir straight_dir, resumed_dir;
  const std::vector<std::vector<Json>> straight = RunJob(2, 2, straight_dir.path());
  {
    Ranks ranks(2, 2);
    ranks.Start(resumed_dir.path(), {"--hang-after-checkpoint", "5"});
    ranks.KillAfter("\"checkpoint\":5");
  }
  const std::vector<std::vector<Json>> resumed = RunJob(2, 2, resumed_dir.path(), {"--resume"});
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t rank = 0; rank < resumed.size(); ++rank) {
    bool told = false;
    for (const Json& line : resumed[rank]) {
      told |= line.value("message", "").find("(step 5)") != std::string::npos;
    }
    EXPECT_TRUE(told) << "rank " << rank << " did not resume from step 5";
  }
  const std::map<int64_t, Json> want = Steps(straight[0]), got = Steps(resumed[0]);
  ASSERT_EQ(got.size(), 5u);
  for (const auto& [step, line] : got) EXPECT_EQ(line, want.at(step)) << "step " << step;

  const auto tensors = [](const fs::path& dir) {
    CheckpointReadOptions all{.ranks = {0, 1}};
    absl::StatusOr<LoadedCheckpoint> loaded =
        LoadCheckpoint((dir / "checkpoints/parallel/step-00000010").string(), all);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : LoadedCheckpoint();
  };
  const LoadedCheckpoint a = tensors(straight_dir.path()), b = tensors(resumed_dir.path());
  ASSERT_EQ(a.model_tensors.size(), b.model_tensors.size());
  for (const auto& [name, tensor] : a.model_tensors) {
    const Tensor& other = b.model_tensors.at(name);
    EXPECT_EQ(std::memcmp(tensor.view().raw(), other.view().raw(), tensor.numel() * 4), 0) << name;
  }
}

// Only ranks with ep_rank 1 read model-rank00001; the others learn of its damage from them.
TEST(ParallelTrainingTest, DamageInOneShardMakesEveryRankFallBack) {
  TempDir dir;
  RunJob(2, 2, dir.path());
  const fs::path damaged =
      dir.path() / "checkpoints/parallel/step-00000010/model-rank00001.safetensors";
  {
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const std::vector<std::vector<Json>> ranks =
      RunJob(2, 2, dir.path(), {"--resume", "--steps", "5"});
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    bool warned = false, resumed = false;
    for (const Json& line : ranks[rank]) {
      const std::string message = line.value("message", "");
      warned |= message.find("step-00000010:") != std::string::npos;
      resumed |= message.find("step-00000005 (step 5)") != std::string::npos;
    }
    EXPECT_TRUE(warned) << "rank " << rank;
    EXPECT_TRUE(resumed) << "rank " << rank;
  }
}

// Training on past the step of a damaged shard: rank 0 (which never reads rank 1's file) finds
// the step damaged when it is written again, moves it aside, and every rank writes it anew
// (keep_last is 0 here: the damaged copy stays aside, unpruned).
TEST(ParallelTrainingTest, ADamagedShardsStepIsWrittenAgainByEveryRank) {
  TempDir dir;
  RunJob(2, 2, dir.path());
  const fs::path root = dir.path() / "checkpoints/parallel";
  {
    std::fstream f(root / "step-00000010/model-rank00001.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  RunJob(2, 2, dir.path(), {"--resume"});  // exit 1 before issue 13 item 7: step 10 existed
  absl::StatusOr<LoadedCheckpoint> rewritten =
      LoadCheckpoint((root / "step-00000010").string(), CheckpointReadOptions{.ranks = {0, 1}});
  EXPECT_TRUE(rewritten.ok()) << rewritten.status();
  int aside = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    aside += entry.path().filename().string().rfind(".damaged-step-00000010-", 0) == 0;
  }
  EXPECT_EQ(aside, 1);
}

// NaN weights: every rank stops at step 1 with the same error, none hangs in a collective.
TEST(ParallelTrainingTest, ANonFiniteStepStopsEveryRank) {
  TempDir dir;
  const std::vector<std::vector<Json>> ranks =
      RunJob(2, 2, dir.path(), {"--poison"}, /*exit_code=*/1);
  for (const std::vector<Json>& lines : ranks) {
    ASSERT_FALSE(lines.empty());
    EXPECT_NE(lines.back().value("error", "").find("step 1: the loss is not finite"),
              std::string::npos)
        << lines.back();
  }
  EXPECT_FALSE(fs::exists(dir.path() / "checkpoints/parallel/step-00000001"));
}

TEST(ParallelTrainingTest, TheWorldMustMatchTheLayout) {
  const absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(parallel_test::JobConfig("", 2, 1));
  EXPECT_EQ(trainer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trainer.status().message().find(
                "the world communicator has 1 ranks, but parallel.data_parallel × "
                "parallel.expert_parallel = 2 × 1 = 2"),
            std::string::npos)
      << trainer.status();
}

}  // namespace
}  // namespace moetrain
