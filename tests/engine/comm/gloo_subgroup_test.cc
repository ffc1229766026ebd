// Subgroups of a 4-rank Gloo world: disjoint groups running different collectives at the same
// time, interleaved groups, repeated calls, groups of one, and the parent still working after.
#include <cstdint>
#include <memory>
#include <vector>

#include "comm_test_util.h"
#include "engine/comm/gloo_communicator.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using testutil::TempDir;

constexpr int kWorld = 4;

TEST(GlooSubgroupTest, DisjointGroupsRunDifferentCollectivesConcurrently) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), kWorld);
  ASSERT_EQ(world.size(), size_t{kWorld});
  RunRanks(kWorld, [&](int rank) {
    const bool low = rank < 2;
    absl::StatusOr<std::unique_ptr<Communicator>> group =
        world[rank]->Subgroup(low ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    ASSERT_TRUE(group.ok()) << group.status();
    Communicator& g = **group;
    EXPECT_EQ(g.rank(), rank % 2);
    EXPECT_EQ(g.size(), 2);
    EXPECT_EQ(g.backend(), "gloo");
    if (low) {
      // {0, 1}: all-reduce, several times, while {2, 3} gathers.
      for (int round = 0; round < 5; ++round) {
        std::vector<int64_t> data(1000, rank + 1 + round);
        ASSERT_OK(g.AllReduceSum(data.data(), 1000, DType::kI64));
        for (int64_t v : data) ASSERT_EQ(v, 3 + 2 * round);
      }
    } else {
      for (int round = 0; round < 5; ++round) {
        const int32_t mine = rank * 100 + round;
        std::vector<int32_t> all(2, -1);
        ASSERT_OK(g.AllGather(&mine, all.data(), 1, DType::kI32));
        EXPECT_EQ(all, (std::vector<int32_t>{200 + round, 300 + round}));
      }
    }
    // The world still works beside its groups.
    ASSERT_OK(world[rank]->Barrier());
  });
}

TEST(GlooSubgroupTest, InterleavedAndRepeatedGroupsMeetTheRightPeers) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), kWorld);
  ASSERT_EQ(world.size(), size_t{kWorld});
  RunRanks(kWorld, [&](int rank) {
    // Even ranks with even, odd with odd; then the halves; then the even/odd split again, which
    // must be a new group (its own prefix), not a second join of the first.
    const std::vector<std::vector<int>> splits[] = {
        {{0, 2}, {1, 3}}, {{0, 1}, {2, 3}}, {{0, 2}, {1, 3}}};
    std::vector<std::unique_ptr<Communicator>> groups;
    for (const auto& split : splits) {
      const std::vector<int>& mine =
          split[0][0] == rank || split[0][1] == rank ? split[0] : split[1];
      absl::StatusOr<std::unique_ptr<Communicator>> group = world[rank]->Subgroup(mine);
      ASSERT_TRUE(group.ok()) << group.status();
      groups.push_back(*std::move(group));
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::vector<int>& members =
          splits[i][0][0] == rank || splits[i][0][1] == rank ? splits[i][0] : splits[i][1];
      // The sum of the members' world ranks proves who is in the group.
      int64_t value = rank;
      ASSERT_OK(groups[i]->AllReduceSum(&value, 1, DType::kI64));
      EXPECT_EQ(value, members[0] + members[1]) << "rank " << rank << " split " << i;
    }
  });
}

TEST(GlooSubgroupTest, GroupOfOneIsLocal) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), 2);
  ASSERT_EQ(world.size(), size_t{2});
  RunRanks(2, [&](int rank) {
    absl::StatusOr<std::unique_ptr<Communicator>> alone = world[rank]->Subgroup({rank});
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ((*alone)->backend(), "local");
    EXPECT_EQ((*alone)->size(), 1);
    float x = 2.5f;
    ASSERT_OK((*alone)->AllReduceSum(&x, 1, DType::kF32));
    EXPECT_EQ(x, 2.5f);
    // Then a real group: the call counter advanced the same way on both ranks.
    absl::StatusOr<std::unique_ptr<Communicator>> both = world[rank]->Subgroup({0, 1});
    ASSERT_TRUE(both.ok()) << both.status();
    ASSERT_OK((*both)->Barrier());
  });
}

TEST(GlooSubgroupTest, RanksOutsideTheWorldOrWithoutThisRankAreRejected) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), 2);
  ASSERT_EQ(world.size(), size_t{2});
  RunRanks(2, [&](int rank) {
    EXPECT_EQ(world[rank]->Subgroup({0, 1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(world[rank]->Subgroup({1 - rank}).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(world[rank]->Subgroup({}).status().code(), absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace moetrain
