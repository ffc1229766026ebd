// ParallelConfig's checks, the groups of each rank, and the sums over ranks: ranks as threads of
// this process, each with a Gloo communicator over TCP loopback.
#include "engine/train/parallel.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"

namespace moetrain {
namespace {

using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using testutil::TempDir;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(ParallelConfigTest, ShardingStagesGoByTheirNamesInAnyCase) {
  for (const Sharding sharding : {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients}) {
    EXPECT_EQ(ShardingFromName(ShardingName(sharding)), sharding);
  }
  EXPECT_EQ(ShardingFromName("gradients"), Sharding::kGradients);
  EXPECT_EQ(ShardingFromName("Optimizer"), Sharding::kOptimizer);
  EXPECT_EQ(ShardingFromName("full"), std::nullopt);  // ZeRO-3 is not built
  EXPECT_EQ(ShardingFromName(""), std::nullopt);
}

TEST(ParallelConfigTest, ErrorsNameTheFieldAndValue) {
  ModelConfig model;
  model.moe.num_experts = 8;
  ParallelConfig config;
  EXPECT_TRUE(config.Validate(model, 8, 0).ok());
  EXPECT_EQ(config.DebugString(), "dp=1 x ep=1 (1 rank)");

  config.expert_parallel = 0;
  EXPECT_EQ(Message(config.Validate(model, 8, 0)),
            "parallel.expert_parallel = 0 must be at least 1");
  config = {.expert_parallel = 1, .data_parallel = -1};
  EXPECT_EQ(Message(config.Validate(model, 8, 0)),
            "parallel.data_parallel = -1 must be at least 1");
  config = {.expert_parallel = 3, .data_parallel = 1};
  EXPECT_EQ(Message(config.Validate(model, 6, 0)),
            "parallel.expert_parallel = 3 does not divide model.moe.num_experts = 8");
  config = {.expert_parallel = 2, .data_parallel = 2};
  EXPECT_EQ(config.DebugString(), "dp=2 x ep=2 (4 ranks)");
  EXPECT_EQ(Message(config.Validate(model, 6, 0)),
            "train.batch_size = 6 is not a multiple of the ranks, parallel.data_parallel × "
            "parallel.expert_parallel = 2 × 2 = 4");
  EXPECT_EQ(Message(config.Validate(model, 8, 2)),
            "train.micro_batch_size = 2 is not a multiple of the ranks, parallel.data_parallel × "
            "parallel.expert_parallel = 2 × 2 = 4");
  EXPECT_TRUE(config.Validate(model, 8, 4).ok());
  config.grad_bucket_bytes = 0;
  EXPECT_EQ(Message(config.Validate(model, 8, 4)),
            "parallel.grad_bucket_bytes = 0 must be at least 1");
}

TEST(ParallelGroupsTest, ASingleRankNeedsNoCommunicator) {
  absl::StatusOr<std::unique_ptr<ParallelGroups>> groups = ParallelGroups::Create({}, nullptr);
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ((*groups)->world_size(), 1);
  EXPECT_EQ((*groups)->world().backend(), "local");
  EXPECT_EQ((*groups)->expert_group(), nullptr);
  EXPECT_EQ((*groups)->expert_data_group(), nullptr);
  EXPECT_EQ((*groups)->moe_parallel().count_group, nullptr);
  const absl::Status mismatch =
      ParallelGroups::Create({.expert_parallel = 2, .data_parallel = 1}, nullptr).status();
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
}

// dp = 2 × ep = 3: rank r's expert group is its row of the 2 × 3 grid, its expert-data group its
// column; sums over each are the same bits on every member.
TEST(ParallelGroupsTest, GroupsAreTheRowsAndColumnsOfTheGrid) {
  TempDir dir;
  std::vector<std::unique_ptr<GlooCommunicator>> world = MakeGlooWorld(dir.path(), 6);
  ASSERT_EQ(world.size(), 6u);
  std::vector<std::unique_ptr<ParallelGroups>> groups(6);
  std::vector<absl::Status> statuses(6);
  RunRanks(6, [&](int rank) {
    absl::StatusOr<std::unique_ptr<ParallelGroups>> made =
        ParallelGroups::Create({.expert_parallel = 3, .data_parallel = 2},
                               std::shared_ptr<Communicator>(std::move(world[rank])));
    statuses[rank] = made.status();
    if (made.ok()) groups[rank] = *std::move(made);
  });
  for (const absl::Status& status : statuses) ASSERT_TRUE(status.ok()) << status;
  std::vector<std::vector<double>> sums(6);
  std::vector<int64_t> counts(6);
  RunRanks(6, [&](int rank) {
    const ParallelGroups& g = *groups[rank];
    // 0.1·rank is inexact in binary: the rank order of the sum shows in its bits.
    std::vector<double> values = {0.1 * rank, 1.0 / (rank + 1)};
    statuses[rank] = SumOverRanks(g.expert_group(), absl::MakeSpan(values));
    int64_t count = rank;
    if (statuses[rank].ok()) {
      statuses[rank] = SumOverRanks(g.expert_data_group(), absl::MakeSpan(&count, 1));
    }
    sums[rank] = values;
    counts[rank] = count;
  });
  for (int rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    const ParallelGroups& g = *groups[rank];
    EXPECT_EQ(g.expert_rank(), rank % 3);
    EXPECT_EQ(g.data_rank(), rank / 3);
    EXPECT_EQ(g.expert_group()->size(), 3);
    EXPECT_EQ(g.expert_group()->rank(), rank % 3);
    EXPECT_EQ(g.expert_data_group()->size(), 2);
    EXPECT_EQ(g.expert_data_group()->rank(), rank / 3);
    EXPECT_EQ(g.moe_parallel().expert_group, g.expert_group());
    EXPECT_EQ(g.moe_parallel().count_group, &g.world());
    const int row = rank / 3 * 3;
    EXPECT_EQ(sums[rank][0], 0.1 * row + 0.1 * (row + 1) + 0.1 * (row + 2));
    EXPECT_EQ(sums[rank][1], 1.0 / (row + 1) + 1.0 / (row + 2) + 1.0 / (row + 3));
    EXPECT_EQ(counts[rank], rank % 3 + (rank % 3 + 3));
  }
}

}  // namespace
}  // namespace moetrain
