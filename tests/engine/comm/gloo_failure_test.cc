// How a Gloo group fails: a rank that never joins, a rank that stalls, a communicator destroyed
// with collectives in flight. Every case must end in a Status within the timeout, never a hang
// (RunRanks aborts the test binary if one does).
#include <memory>
#include <vector>

#include "comm_test_util.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::Gloo;
using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using testutil::TempDir;

constexpr absl::Duration kShortTimeout = absl::Seconds(1);

TEST(GlooFailureTest, RankThatNeverJoinsFailsTheOthersWithDeadlineExceeded) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path() / "kv");
  ASSERT_TRUE(store.ok()) << store.status();
  // Ranks 0 and 1 of 3 join; rank 2 never does.
  RunRanks(2, [&](int rank) {
    auto comm = GlooCommunicator::Create(Gloo(*store, rank, 3, kShortTimeout));
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr("rank 2 did not join"));
    EXPECT_THAT(comm.status().message(), HasSubstr("rendezvous on rank " + std::to_string(rank)));
  });
}

TEST(GlooFailureTest, StalledPeerTimesOutThenEveryCallFailsFast) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), 2, kShortTimeout);
  ASSERT_EQ(world.size(), size_t{2});
  RunRanks(1, [&](int) {
    // Rank 1 never starts the all-reduce.
    float x = 1;
    const absl::Status status = world[0]->AllReduceSum(&x, 1, DType::kF32);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(), HasSubstr("gloo all_reduce_sum on rank 0 of 2"));
    // Broken now: later calls fail with the first failure's code, without waiting again.
    auto barrier = world[0]->StartBarrier();
    ASSERT_FALSE(barrier.ok());
    EXPECT_EQ(barrier.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(barrier.status().message(), HasSubstr("failed earlier"));
    EXPECT_FALSE(world[0]->Subgroup({0, 1}).ok());
  });
  // The stalled rank finds its group gone when it finally calls.
  RunRanks(1, [&](int) {
    const absl::Status status = world[1]->Barrier();
    EXPECT_THAT(status.code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
        << status;
  });
}

TEST(GlooFailureTest, DestroyedWithCollectivesInFlight) {
  TempDir dir;
  auto world = MakeGlooWorld(dir.path(), 2, kShortTimeout);
  ASSERT_EQ(world.size(), size_t{2});
  std::unique_ptr<CommRequest> running, queued;
  RunRanks(1, [&](int) {
    float x = 1;
    auto first = world[0]->StartAllReduceSum(&x, 1, DType::kF32);  // rank 1 never joins it
    auto second = world[0]->StartBarrier();
    ASSERT_TRUE(first.ok() && second.ok());
    running = *std::move(first);
    queued = *std::move(second);
    // Most likely the all-reduce is under way by now; if not, it is cancelled too.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    world[0].reset();  // waits for the running one (its timeout), cancels what has not started
  });
  // The requests outlive their communicator.
  EXPECT_THAT(running->Wait().code(),
              AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kCancelled));
  EXPECT_EQ(queued->Wait().code(), absl::StatusCode::kCancelled);
}

TEST(GlooFailureTest, BadOptionsAreInvalidArguments) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path() / "kv");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(GlooCommunicator::Create(Gloo(*store, 2, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Create(Gloo(nullptr, 0, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooCommunicator::Create(Gloo(*store, 0, 1, absl::ZeroDuration())).status().code(),
            absl::StatusCode::kInvalidArgument);
  GlooOptions unresolvable = Gloo(*store, 0, 1);
  unresolvable.listen_host = "no-such-host.invalid";
  const absl::Status status = GlooCommunicator::Create(unresolvable).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("no-such-host.invalid"));
  // An address of no interface here (TEST-NET-1) resolves but cannot be listened on.
  GlooOptions foreign = Gloo(*store, 0, 1);
  foreign.listen_host = "192.0.2.1";
  const absl::Status bind = GlooCommunicator::Create(foreign).status();
  EXPECT_EQ(bind.code(), absl::StatusCode::kInvalidArgument) << bind;
  EXPECT_THAT(bind.message(), HasSubstr("192.0.2.1"));
}

}  // namespace
}  // namespace moetrain
