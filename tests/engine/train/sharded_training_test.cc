// The sharded optimizer and gradients (parallel.sharding = OPTIMIZER, ZeRO-1; GRADIENTS, ZeRO-2),
// bf16 moments and activation recompute across processes, against the plain run of
// parallel_test_config.h's job, and checkpoints that resume on another layout or sharding
// (parallel_train_rank processes, as parallel_training_test runs them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/train/parallel_ranks.h"
#include "tests/engine/train/parallel_test_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using parallel_test::CheckpointTensors;
using parallel_test::ExpectSameBits;
using parallel_test::Number;
using parallel_test::Ranks;
using parallel_test::RunJob;
using parallel_test::Steps;
using testutil::TempDir;

// Trains the job twice at dp × ep for 20 steps, with `flags` and with `flags` + `changed`, and
// expects the same bits: every step's numbers on every rank (the gradient norm within
// `norm_tolerance` relative) and the final checkpoints, weights and moments. The second run's
// directory, for more checks.
void ExpectTrainsBitIdentically(int dp, int ep, const std::vector<std::string>& flags,
                                const std::vector<std::string>& changed, double norm_tolerance,
                                const TempDir& changed_dir) {
  TempDir base_dir;
  std::vector<std::string> with_steps = {"--steps", "20"};
  with_steps.insert(with_steps.end(), flags.begin(), flags.end());
  std::vector<std::string> changed_flags = with_steps;
  changed_flags.insert(changed_flags.end(), changed.begin(), changed.end());
  const std::vector<std::vector<Json>> base = RunJob(dp, ep, base_dir.path(), with_steps);
  const std::vector<std::vector<Json>> other = RunJob(dp, ep, changed_dir.path(), changed_flags);
  ASSERT_EQ(base.size(), other.size());
  const std::map<int64_t, Json> want = Steps(base[0]);
  ASSERT_EQ(want.size(), 20u) << base[0].size() << " lines";
  for (size_t rank = 0; rank < other.size(); ++rank) {
    const std::map<int64_t, Json> got = Steps(other[rank]);
    ASSERT_EQ(got.size(), 20u) << "rank " << rank;
    for (const auto& [step, line] : want) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", step));
      Json same = got.at(step), expected = line;
      const double norm = Number(same, "grad_norm"), expected_norm = Number(expected, "grad_norm");
      EXPECT_LE(std::abs(norm - expected_norm), norm_tolerance * expected_norm);
      same.erase("grad_norm");
      expected.erase("grad_norm");
      EXPECT_EQ(same, expected);
    }
  }
  const LoadedCheckpoint a = CheckpointTensors(base_dir.path(), ep, 20);
  const LoadedCheckpoint b = CheckpointTensors(changed_dir.path(), ep, 20);
  ExpectSameBits(a.model_tensors, b.model_tensors);
  ExpectSameBits(a.optim_tensors, b.optim_tensors);
}

struct ShardingCase {
  int dp, ep;
  bool deepseek, bf16, bf16_moments = false;
  std::string stage = "optimizer";  // --sharding
};

void PrintTo(const ShardingCase& c, std::ostream* os) {
  *os << c.stage << " dp " << c.dp << " ep " << c.ep << (c.deepseek ? " deepseek" : " tiny")
      << (c.bf16 ? " bf16" : " f32") << (c.bf16_moments ? " bf16 moments" : "");
}

class ShardingTest : public ::testing::TestWithParam<ShardingCase> {};

// ZeRO-1 and ZeRO-2 against no sharding, 20 steps of one micro-batch: on Gloo the reduce-scatter
// adds in the all-reduce's order, so every step's numbers are the same bits (the gradient norm
// sums its squares in another grouping: within 1e-12), and the final checkpoints (weights and the
// moments gathered from the ranks' pieces) are the same bytes.
TEST_P(ShardingTest, TrainsBitIdenticallyToNoSharding) {
  const ShardingCase c = GetParam();
  std::vector<std::string> flags;
  if (c.deepseek) flags.push_back("--deepseek");
  if (c.bf16) flags.push_back("--bf16");
  if (c.bf16_moments) flags.push_back("--bf16-moments");
  TempDir sharded_dir;
  ExpectTrainsBitIdentically(c.dp, c.ep, flags, {"--sharding", c.stage}, 1e-12, sharded_dir);
  if (HasFatalFailure()) return;
  std::ifstream manifest_file(sharded_dir.path() /
                              "checkpoints/parallel/step-00000020/manifest.json");
  EXPECT_EQ(Json::parse(manifest_file)["world_layout"]["sharding"], absl::AsciiStrToUpper(c.stage));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardingTest,
    ::testing::Values(ShardingCase{2, 1, false, false}, ShardingCase{4, 1, false, true},
                      ShardingCase{2, 2, true, true}, ShardingCase{4, 1, true, false},
                      ShardingCase{2, 1, false, true, /*bf16_moments=*/true},
                      ShardingCase{2, 1, false, false, false, "gradients"},
                      ShardingCase{4, 1, false, true, false, "gradients"},
                      ShardingCase{2, 2, true, true, false, "gradients"},
                      ShardingCase{4, 1, true, false, false, "gradients"}),
    [](const auto& info) {
      const ShardingCase& c = info.param;
      return absl::StrCat(c.stage == "gradients" ? "Gradients" : "", "dp", c.dp, "ep", c.ep,
                          c.deepseek ? "Deepseek" : "Tiny", c.bf16 ? "Bf16" : "F32",
                          c.bf16_moments ? "Bf16Moments" : "");
    });

// ZeRO-2 over several micro-batches a step (4 at dp 2, 2 at dp 2 × ep 2) sums each micro-batch
// over the ranks before adding the micro-batches up (ZeRO-1 and no sharding add each rank's
// micro-batches first): another rounding, held within 1e-6 relative on every loss of 20 steps,
// and not the same bits throughout, or the per-micro-batch reduction did not run.
TEST(ShardedTrainingTest, ShardedGradientsOverMicroBatchesStayWithin1e6OfNoSharding) {
  constexpr double kLossTolerance = 1e-6;
  for (const auto& [dp, ep, deepseek, micro] :
       {std::tuple(2, 1, false, "2"), std::tuple(2, 2, true, "4")}) {
    SCOPED_TRACE(absl::StrCat("dp ", dp, " ep ", ep));
    std::vector<std::string> flags = {"--steps", "20", "--micro", micro};
    if (deepseek) flags.push_back("--deepseek");
    std::vector<std::string> sharded = flags;
    sharded.insert(sharded.end(), {"--sharding", "gradients"});
    TempDir plain_dir, sharded_dir;
    const std::map<int64_t, Json> want = Steps(RunJob(dp, ep, plain_dir.path(), flags)[0]);
    const std::map<int64_t, Json> got = Steps(RunJob(dp, ep, sharded_dir.path(), sharded)[0]);
    ASSERT_EQ(want.size(), 20u);
    ASSERT_EQ(got.size(), 20u);
    double worst = 0;
    for (const auto& [step, line] : want) {
      for (const char* key : {"loss", "aux_loss", "z_loss"}) {
        const double reference = Number(line, key), value = Number(got.at(step), key);
        worst = std::max(worst, std::abs(value - reference) / std::abs(reference));
      }
    }
    std::printf("sharded gradients over micro-batches: largest relative loss difference %.3g\n",
                worst);
    EXPECT_LE(worst, kLossTolerance);
    EXPECT_GT(worst, 0);
  }
}

struct RecomputeCase {
  int dp, ep;
  bool deepseek, bf16;
  std::string name = "";               // of the flags below
  std::vector<std::string> more = {};  // flags of both runs
  std::string mode = "full";           // --recompute
};

void PrintTo(const RecomputeCase& c, std::ostream* os) {
  *os << c.mode << " dp " << c.dp << " ep " << c.ep << (c.deepseek ? " deepseek" : " tiny")
      << (c.bf16 ? " bf16 " : " f32 ") << c.name;
}

class RecomputeTrainingTest : public ::testing::TestWithParam<RecomputeCase> {};

// Full or selective recompute against keeping the activations, 20 steps: every number of every
// step and the final checkpoints are the same bits (the recomputed forward, or the rebuilt norm
// and SwiGLU outputs and MLA up-projections, are the same ops on the same inputs; with expert
// parallelism full recompute's exchange sends the kept routing's rows again). tiny-moe's job gets
// a third block, so that an MoE block is recomputed (the last block's forward is not re-run); the
// DeepSeek job's MTP block runs last, so all of its main blocks are.
TEST_P(RecomputeTrainingTest, TrainsBitIdenticallyToKeepingActivations) {
  const RecomputeCase c = GetParam();
  std::vector<std::string> flags = c.more;
  if (c.deepseek) flags.push_back("--deepseek");
  if (c.bf16) flags.push_back("--bf16");
  TempDir recompute_dir;
  ExpectTrainsBitIdentically(c.dp, c.ep, flags, {"--recompute", c.mode}, 0.0, recompute_dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RecomputeTrainingTest,
    ::testing::Values(
        RecomputeCase{2, 1, false, false, "ThreeLayers", {"--layers", "3"}},
        RecomputeCase{1, 4, true, false},
        RecomputeCase{2, 2, true, true, "MicroBatches", {"--micro", "4"}},
        RecomputeCase{
            4, 1, false, true, "ShardedThreeLayers", {"--sharding", "optimizer", "--layers", "3"}},
        RecomputeCase{1, 2, false, true, "Fp8ThreeLayers", {"--fp8", "current", "--layers", "3"}},
        RecomputeCase{2, 1, false, false, "ThreeLayers", {"--layers", "3"}, "selective"},
        RecomputeCase{1, 4, true, false, "", {}, "selective"},
        RecomputeCase{2, 2, true, true, "MicroBatches", {"--micro", "4"}, "selective"},
        RecomputeCase{4, 1, false, true, "ThreeLayers", {"--layers", "3"}, "selective"}),
    [](const auto& info) {
      const RecomputeCase& c = info.param;
      return absl::StrCat(c.mode == "full" ? "" : "Selective", "dp", c.dp, "ep", c.ep,
                          c.deepseek ? "Deepseek" : "Tiny", c.bf16 ? "Bf16" : "F32", c.name);
    });

// Gradients summed in bf16 (parallel.grad_reduce_dtype = BF16) against f32, 20 steps, unsharded
// and sharded: every loss within kBf16ReduceLossTolerance relative of the f32 run's, as bf16
// rounding (3 significant digits) of the gradients allows; and not the same bits, or the bf16
// path did not run.
TEST(ShardedTrainingTest, Bf16GradientReductionStaysCloseToF32) {
  constexpr double kBf16ReduceLossTolerance = 1e-3;  // measured: under 1e-4
  for (const auto& [dp, ep, flags] :
       {std::tuple(2, 1, std::vector<std::string>{"--steps", "20"}),
        std::tuple(2, 2,
                   std::vector<std::string>{"--steps", "20", "--deepseek", "--bf16", "--sharding",
                                            "optimizer"})}) {
    SCOPED_TRACE(absl::StrCat("dp ", dp, " ep ", ep));
    TempDir f32_dir, bf16_dir;
    std::vector<std::string> bf16_flags = flags;
    bf16_flags.push_back("--bf16-grad-reduce");
    const std::map<int64_t, Json> f32 = Steps(RunJob(dp, ep, f32_dir.path(), flags)[0]);
    const std::map<int64_t, Json> bf16 = Steps(RunJob(dp, ep, bf16_dir.path(), bf16_flags)[0]);
    ASSERT_EQ(f32.size(), 20u);
    ASSERT_EQ(bf16.size(), 20u);
    double worst = 0;
    for (const auto& [step, line] : f32) {
      const double want = Number(line, "loss"), got = Number(bf16.at(step), "loss");
      worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
    std::printf("bf16 gradient reduction: largest relative loss difference %.3g\n", worst);
    EXPECT_LE(worst, kBf16ReduceLossTolerance);
    EXPECT_GT(worst, 0);
  }
}

// A checkpoint of a sharded run resumes without sharding (and the other way), continuing as the
// uninterrupted sharded run does: the files do not depend on the sharding. With bf16 moments,
// which the files hold in f32, exactly.
TEST(ShardedTrainingTest, ACheckpointResumesUnderTheOtherSharding) {
  TempDir straight_dir, to_none_dir, to_sharded_dir;
  const std::vector<std::string> sharded = {"--sharding", "optimizer", "--bf16-moments"};
  const std::vector<std::string> unsharded = {"--bf16-moments"};
  const std::vector<std::vector<Json>> straight = RunJob(2, 1, straight_dir.path(), sharded);
  for (const auto& [dir, first, then] : {std::tuple(&to_none_dir, sharded, unsharded),
                                         std::tuple(&to_sharded_dir, unsharded, sharded)}) {
    {
      Ranks ranks(2, 1);
      std::vector<std::string> hang = first;
      hang.insert(hang.end(), {"--hang-after-checkpoint", "5"});
      ranks.Start(dir->path(), hang);
      ranks.KillAfter("\"checkpoint\":5");
    }
    std::vector<std::string> resume = then;
    resume.push_back("--resume");
    const std::vector<std::vector<Json>> resumed = RunJob(2, 1, dir->path(), resume);
    ASSERT_EQ(resumed.size(), 2u);
    const std::map<int64_t, Json> want = Steps(straight[0]), got = Steps(resumed[0]);
    ASSERT_EQ(got.size(), 5u);
    for (const auto& [step, line] : got) {
      Json same = line, expected = want.at(step);
      EXPECT_NEAR(Number(same, "grad_norm"), Number(expected, "grad_norm"),
                  1e-12 * Number(expected, "grad_norm"));
      same.erase("grad_norm");
      expected.erase("grad_norm");
      EXPECT_EQ(same, expected) << "step " << step;
    }
    ExpectSameBits(CheckpointTensors(straight_dir.path(), 1, 10).optim_tensors,
                   CheckpointTensors(dir->path(), 1, 10).optim_tensors);
  }
}

// A checkpoint resumes on another layout and sharding: in one process, what it restores is what
// was saved, bit for bit (every expert file read), and on the new layout the steps after differ
// from the uninterrupted run's by float rounding only.
void ExpectResumesOnAnotherLayout(int dp, int ep, const std::vector<std::string>& written_with,
                                  int new_dp, int new_ep) {
  TempDir straight_dir, dir;
  const std::vector<std::vector<Json>> straight = RunJob(dp, ep, straight_dir.path(), written_with);
  {
    Ranks ranks(dp, ep);
    std::vector<std::string> hang = written_with;
    hang.insert(hang.end(), {"--hang-after-checkpoint", "5"});
    ranks.Start(dir.path(), hang);
    ranks.KillAfter("\"checkpoint\":5");
  }
  // In this process, on one rank: every tensor as saved.
  absl::StatusOr<std::unique_ptr<Trainer>> single =
      Trainer::Create(parallel_test::JobConfig((dir.path() / "checkpoints").string(), 1, 1));
  ASSERT_OK(single.status());
  ASSERT_OK((*single)->Resume(nullptr));
  EXPECT_EQ((*single)->step(), 5);
  const LoadedCheckpoint saved = CheckpointTensors(dir.path(), ep, 5);
  for (const NamedParameter& p : (*single)->model().parameters()) {
    const Tensor& want = saved.model_tensors.at(p.name);
    EXPECT_EQ(std::memcmp(want.view().raw(), p.value.raw(), want.numel() * 4), 0) << p.name;
  }
  const AdamW& optimizer = (*single)->optimizer();
  ASSERT_GT(optimizer.num_params(), 0);
  for (int64_t i = 0; i < optimizer.num_params(); ++i) {
    const std::string& name = optimizer.param(i).name;
    const Tensor& m = saved.optim_tensors.at(name + kExpAvgSuffix);
    const Tensor& v = saved.optim_tensors.at(name + kExpAvgSqSuffix);
    EXPECT_EQ(std::memcmp(m.view().raw(), optimizer.exp_avg(i).raw(), m.numel() * 4), 0) << name;
    EXPECT_EQ(std::memcmp(v.view().raw(), optimizer.exp_avg_sq(i).raw(), v.numel() * 4), 0) << name;
  }
  single->reset();
  // On the new layout, without sharding.
  const std::vector<std::vector<Json>> resumed = RunJob(new_dp, new_ep, dir.path(), {"--resume"});
  ASSERT_EQ(resumed.size(), static_cast<size_t>(new_dp * new_ep));
  const std::map<int64_t, Json> want = Steps(straight[0]), got = Steps(resumed[0]);
  ASSERT_EQ(got.size(), 5u);
  for (const auto& [step, line] : got) {
    for (const char* key : {"loss", "aux_loss", "z_loss"}) {
      const double reference = Number(want.at(step), key);
      EXPECT_LE(std::abs(Number(line, key) - reference), 1e-6 * std::abs(reference))
          << key << " at step " << step;
    }
  }
}

TEST(ShardedTrainingTest, AShardedDp4CheckpointResumesAtDp2WithoutSharding) {
  ExpectResumesOnAnotherLayout(4, 1, {"--sharding", "optimizer"}, 2, 1);
}

TEST(ShardedTrainingTest, AnEp2CheckpointResumesAtEp4) {
  ExpectResumesOnAnotherLayout(1, 2, {}, 1, 4);
}

}  // namespace
}  // namespace moetrain
