// Ranks as real processes (comm_rank_main): one is killed with SIGKILL after the group formed,
// and the survivors' next collective must fail with a Status within the timeout, not hang.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

namespace moetrain {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testutil::Child;
using testutil::Finished;
using testutil::TempDir;

constexpr int kRanks = 3;
constexpr char kTimeoutMs[] = "2000";

TEST(GlooProcessTest, KilledRankFailsTheSurvivorsCollectives) {
  TempDir dir;
  std::vector<std::unique_ptr<Child>> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.push_back(
        std::make_unique<Child>(std::filesystem::path(MOETRAIN_BIN_DIR) / "comm_rank_main"));
    ASSERT_EQ(ranks.back()->Start(
                  {dir.path().string(), std::to_string(rank), std::to_string(kRanks), kTimeoutMs},
                  dir.path()),
              "");
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_TRUE(ranks[rank]->WaitForStdout(
        [](const std::string& out) { return out.find("ready") != std::string::npos; },
        std::chrono::seconds(30)))
        << "rank " << rank << " did not form the group: " << ranks[rank]->out()
        << ranks[rank]->err();
  }
  ranks[kRanks - 1]->Signal(SIGKILL);
  const Finished killed = ranks[kRanks - 1]->Wait(std::chrono::seconds(10));
  EXPECT_EQ(killed.term_signal, SIGKILL);
  std::ofstream(dir.path() / "go").put('1');

  for (int rank = 0; rank < kRanks - 1; ++rank) {
    // Bounded by our own clock: a hang shows as timed_out, not as a ctest timeout.
    const Finished finished = ranks[rank]->Wait(std::chrono::seconds(30));
    ASSERT_FALSE(finished.timed_out) << "rank " << rank << " hung after its peer died";
    EXPECT_EQ(finished.exit_code, 0) << finished.out << finished.err;
    EXPECT_THAT(finished.out,
                AnyOf(HasSubstr("failed: UNAVAILABLE"), HasSubstr("failed: DEADLINE_EXCEEDED")))
        << finished.err;
  }
}

}  // namespace
}  // namespace moetrain
