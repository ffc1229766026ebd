// The sharded optimizer (parallel.sharding = OPTIMIZER, ZeRO-1) and bf16 moments across processes,
// against the unsharded run of parallel_test_config.h's job, and checkpoints that resume on
// another layout or sharding (parallel_train_rank processes, as parallel_training_test runs them).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

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

struct ShardingCase {
  int dp, ep;
  bool deepseek, bf16, bf16_moments = false;
};

class OptimizerShardingTest : public ::testing::TestWithParam<ShardingCase> {};

// ZeRO-1 against no sharding, 20 steps: on Gloo the reduce-scatter adds in the all-reduce's
// order, so every step's numbers are the same bits (the gradient norm sums its squares in
// another grouping: within 1e-12), and the final checkpoints (weights and the moments gathered
// from the ranks' pieces) are the same bytes.
TEST_P(OptimizerShardingTest, TrainsBitIdenticallyToNoSharding) {
  const ShardingCase c = GetParam();
  TempDir none_dir, sharded_dir;
  std::vector<std::string> flags = {"--steps", "20"};
  if (c.deepseek) flags.push_back("--deepseek");
  if (c.bf16) flags.push_back("--bf16");
  if (c.bf16_moments) flags.push_back("--bf16-moments");
  std::vector<std::string> sharded_flags = flags;
  sharded_flags.insert(sharded_flags.end(), {"--sharding", "optimizer"});
  const std::vector<std::vector<Json>> none = RunJob(c.dp, c.ep, none_dir.path(), flags);
  const std::vector<std::vector<Json>> sharded =
      RunJob(c.dp, c.ep, sharded_dir.path(), sharded_flags);
  ASSERT_EQ(none.size(), sharded.size());
  const std::map<int64_t, Json> want = Steps(none[0]);
  ASSERT_EQ(want.size(), 20u) << none[0].size() << " lines";
  for (size_t rank = 0; rank < sharded.size(); ++rank) {
    const std::map<int64_t, Json> got = Steps(sharded[rank]);
    ASSERT_EQ(got.size(), 20u) << "rank " << rank;
    for (const auto& [step, line] : want) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " step ", step));
      Json same = got.at(step), expected = line;
      const double norm = Number(same, "grad_norm"), expected_norm = Number(expected, "grad_norm");
      EXPECT_LE(std::abs(norm - expected_norm), 1e-12 * expected_norm);
      same.erase("grad_norm");
      expected.erase("grad_norm");
      EXPECT_EQ(same, expected);
    }
  }
  const LoadedCheckpoint a = CheckpointTensors(none_dir.path(), c.ep, 20);
  const LoadedCheckpoint b = CheckpointTensors(sharded_dir.path(), c.ep, 20);
  ExpectSameBits(a.model_tensors, b.model_tensors);
  ExpectSameBits(a.optim_tensors, b.optim_tensors);
  std::ifstream manifest_file(sharded_dir.path() /
                              "checkpoints/parallel/step-00000020/manifest.json");
  EXPECT_EQ(Json::parse(manifest_file)["world_layout"]["sharding"], "OPTIMIZER");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OptimizerShardingTest,
    ::testing::Values(ShardingCase{2, 1, false, false}, ShardingCase{4, 1, false, true},
                      ShardingCase{2, 2, true, true}, ShardingCase{4, 1, true, false},
                      ShardingCase{2, 1, false, true, /*bf16_moments=*/true}),
    [](const auto& info) {
      const ShardingCase& c = info.param;
      return absl::StrCat("dp", c.dp, "ep", c.ep, c.deepseek ? "Deepseek" : "Tiny",
                          c.bf16 ? "Bf16" : "F32", c.bf16_moments ? "Bf16Moments" : "");
    });

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
