// What the expert-parallel tests share: ranks as threads of the test process, each with its own
// Gloo communicator over TCP loopback (rendezvous in a FileKeyValueStore in a scratch directory),
// and each rank's expert group in the world layout of engine/train/parallel.h.
#ifndef MOETRAIN_TESTS_ENGINE_MOE_EXPERT_PARALLEL_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_MOE_EXPERT_PARALLEL_TEST_UTIL_H_

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/comm/gloo_communicator.h"
#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"

namespace moetrain::moe_test {

using comm_test::RunRanks;
using testutil::TempDir;

// W = dp·ep ranks: rank r has ep_rank = r % ep and dp_rank = r / ep, and its expert group is the
// ep consecutive ranks {dp_rank·ep + i}.
struct RankGroups {
  std::vector<std::unique_ptr<GlooCommunicator>> world;  // (W)
  std::vector<std::unique_ptr<Communicator>> expert;     // (W) each rank's expert group
};

// Fails the test (and returns empty groups) when a rank cannot join.
inline RankGroups MakeRankGroups(const std::filesystem::path& dir, int dp, int ep) {
  RankGroups groups;
  const int world_size = dp * ep;
  groups.world = comm_test::MakeGlooWorld(dir, world_size);
  if (groups.world.empty()) return groups;
  groups.expert.resize(world_size);
  std::vector<absl::Status> statuses(world_size);
  RunRanks(world_size, [&](int rank) {
    std::vector<int> members;
    for (int i = 0; i < ep; ++i) members.push_back(rank / ep * ep + i);
    absl::StatusOr<std::unique_ptr<Communicator>> group = groups.world[rank]->Subgroup(members);
    statuses[rank] = group.status();
    if (group.ok()) groups.expert[rank] = *std::move(group);
  });
  for (int rank = 0; rank < world_size; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
    if (!statuses[rank].ok()) return {};
  }
  return groups;
}

}  // namespace moetrain::moe_test

#endif  // MOETRAIN_TESTS_ENGINE_MOE_EXPERT_PARALLEL_TEST_UTIL_H_
