// MeteredCommunicator over real communicators: a 3-rank Gloo world (ranks as threads over TCP
// loopback) and a world of one. Each collective's payload bytes are checked against the formulas
// of metered_communicator.h, on every rank, subgroups included, and the wrapped collectives still
// compute what the bare ones do.
#include "engine/comm/metered_communicator.h"

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm_test_util.h"
#include "engine/comm/local_communicator.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using testutil::TempDir;

// What a meter was told, per op.
class RecordingMeter final : public CommMeter {
 public:
  struct Totals {
    int64_t sent = 0, received = 0, calls = 0;
    double seconds = 0;
  };
  void Add(CommOp op, int64_t bytes_sent, int64_t bytes_received, double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    Totals& totals = totals_[static_cast<int>(op)];
    totals.sent += bytes_sent;
    totals.received += bytes_received;
    totals.seconds += seconds;
    ++totals.calls;
  }
  Totals Of(CommOp op) {
    std::lock_guard<std::mutex> lock(mu_);
    return totals_[static_cast<int>(op)];
  }

 private:
  std::mutex mu_;
  std::array<Totals, kNumCommOps> totals_;
};

TEST(MeteredCommunicatorTest, CountsEachCollectivesPayloadOnEveryRank) {
  constexpr int kWorld = 3;
  TempDir dir;
  auto gloo = MakeGlooWorld(dir.path(), kWorld);
  ASSERT_EQ(gloo.size(), size_t{kWorld});
  std::vector<std::shared_ptr<RecordingMeter>> meters;
  std::vector<std::unique_ptr<MeteredCommunicator>> world;
  for (int rank = 0; rank < kWorld; ++rank) {
    meters.push_back(std::make_shared<RecordingMeter>());
    world.push_back(std::make_unique<MeteredCommunicator>(std::move(gloo[rank]), meters[rank]));
  }
  RunRanks(kWorld, [&](int rank) {
    MeteredCommunicator& comm = *world[rank];
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), kWorld);
    EXPECT_EQ(comm.backend(), "gloo");
    // All-reduce of 10 f32: 40 bytes each way.
    std::vector<float> sum(10, static_cast<float>(rank + 1));
    ASSERT_OK(comm.AllReduceSum(sum.data(), 10, DType::kF32));
    for (float v : sum) EXPECT_EQ(v, 6.0f);
    // All-gather of 4 i64: 32 bytes out, 2 · 32 in.
    std::vector<int64_t> mine(4, rank), all(4 * kWorld, -1);
    ASSERT_OK(comm.AllGather(mine.data(), all.data(), 4, DType::kI64));
    EXPECT_EQ(all[4 * 2], 2);
    // Broadcast of 5 i32 from rank 1: the root sends 20 bytes, the others receive them.
    std::vector<int32_t> value(5, rank == 1 ? 7 : 0);
    ASSERT_OK(comm.Broadcast(value.data(), 5, DType::kI32, 1));
    EXPECT_EQ(value[4], 7);
    // All-to-all: rank r sends r + 1 + j f32 to rank j (its own share stays home).
    AllToAllVArgs args;
    args.dtype = DType::kF32;
    for (int j = 0; j < kWorld; ++j) {
      args.send_counts.push_back(rank + 1 + j);
      args.recv_counts.push_back(j + 1 + rank);
    }
    std::vector<float> send(rank * 3 + 6, static_cast<float>(rank)), recv(3 + 3 * rank + 3);
    args.send = send.data();
    args.recv = recv.data();
    ASSERT_OK(comm.AllToAllV(args));
    // Reduce-scatter of blocks of 2, 3, 4 f32: the others' blocks out, this rank's in; the
    // all-gather back: this rank's block out, the others' in.
    const std::vector<int64_t> blocks = {2, 3, 4};
    std::vector<float> sharded(9, 1.0f);
    ASSERT_OK(comm.ReduceScatterSum(sharded.data(), blocks, DType::kF32));
    ASSERT_OK(comm.AllGatherV(sharded.data(), blocks, DType::kF32));
    for (float v : sharded) EXPECT_EQ(v, 3.0f);
    ASSERT_OK(comm.Barrier());
    // A subgroup of ranks {0, 2} meters into the same meter; rank 1 is not in it.
    if (rank != 1) {
      absl::StatusOr<std::unique_ptr<Communicator>> pair = comm.Subgroup({0, 2});
      ASSERT_TRUE(pair.ok()) << pair.status();
      std::vector<int32_t> counts(3, 1);
      absl::StatusOr<std::unique_ptr<CommRequest>> started =
          (*pair)->StartAllReduceSum(counts.data(), 3, DType::kI32);
      ASSERT_TRUE(started.ok()) << started.status();
      ASSERT_OK((*started)->Wait());
      EXPECT_EQ(counts[0], 2);
    } else {
      ASSERT_TRUE(comm.Subgroup({1}).ok());
    }
    // A broadcast refused at its start (a root outside the world) moves nothing.
    EXPECT_FALSE(comm.Broadcast(value.data(), 5, DType::kI32, kWorld).ok());
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE(rank);
    RecordingMeter& meter = *meters[rank];
    const int64_t pair_bytes = rank == 1 ? 0 : 12;
    EXPECT_EQ(meter.Of(CommOp::kAllReduce).sent, 40 + pair_bytes);
    EXPECT_EQ(meter.Of(CommOp::kAllReduce).received, 40 + pair_bytes);
    const int64_t own = 4 * (2 + rank), others = 4 * 9 - own;
    EXPECT_EQ(meter.Of(CommOp::kAllGather).sent, 32 + own);
    EXPECT_EQ(meter.Of(CommOp::kAllGather).received, 64 + others);
    EXPECT_EQ(meter.Of(CommOp::kReduceScatter).sent, others);
    EXPECT_EQ(meter.Of(CommOp::kReduceScatter).received, own);
    EXPECT_EQ(meter.Of(CommOp::kBroadcast).sent, rank == 1 ? 20 : 0);
    EXPECT_EQ(meter.Of(CommOp::kBroadcast).received, rank == 1 ? 0 : 20);
    int64_t sent = 0, received = 0;
    for (int j = 0; j < kWorld; ++j) {
      if (j == rank) continue;
      sent += 4 * (rank + 1 + j);
      received += 4 * (j + 1 + rank);
    }
    EXPECT_EQ(meter.Of(CommOp::kAllToAll).sent, sent);
    EXPECT_EQ(meter.Of(CommOp::kAllToAll).received, received);
    EXPECT_EQ(meter.Of(CommOp::kBarrier).sent + meter.Of(CommOp::kBarrier).received, 0);
    // Every op is told once at its start and once at its Wait.
    EXPECT_EQ(meter.Of(CommOp::kAllReduce).calls, rank == 1 ? 2 : 4);
    EXPECT_EQ(meter.Of(CommOp::kBarrier).calls, 2);
    EXPECT_EQ(meter.Of(CommOp::kBroadcast).calls, 3);
    for (int op = 0; op < kNumCommOps; ++op) {
      EXPECT_GE(meter.Of(static_cast<CommOp>(op)).seconds, 0.0)
          << CommOpName(static_cast<CommOp>(op));
    }
    EXPECT_GT(meter.Of(CommOp::kAllReduce).seconds, 0.0);
  }
}

TEST(MeteredCommunicatorTest, AWorldOfOneMovesNoBytes) {
  auto meter = std::make_shared<RecordingMeter>();
  MeteredCommunicator comm(std::make_unique<LocalCommunicator>(), meter);
  std::vector<float> data(8, 2.0f);
  ASSERT_OK(comm.AllReduceSum(data.data(), 8, DType::kF32));
  EXPECT_EQ(data[0], 2.0f);
  std::vector<float> out(8);
  AllToAllVArgs args{.send = data.data(),
                     .send_counts = {8},
                     .recv = out.data(),
                     .recv_counts = {8},
                     .dtype = DType::kF32};
  ASSERT_OK(comm.AllToAllV(args));
  EXPECT_EQ(out[7], 2.0f);
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllToAll}) {
    EXPECT_EQ(meter->Of(op).sent + meter->Of(op).received, 0) << CommOpName(op);
    EXPECT_EQ(meter->Of(op).calls, 2) << CommOpName(op);
  }
}

TEST(MeteredCommunicatorTest, NamesEveryOp) {
  EXPECT_STREQ(CommOpName(CommOp::kAllToAll), "all_to_all");
  EXPECT_STREQ(CommOpName(CommOp::kAllReduce), "all_reduce");
  EXPECT_STREQ(CommOpName(CommOp::kAllGather), "all_gather");
  EXPECT_STREQ(CommOpName(CommOp::kBroadcast), "broadcast");
  EXPECT_STREQ(CommOpName(CommOp::kBarrier), "barrier");
  EXPECT_STREQ(CommOpName(CommOp::kReduceScatter), "reduce_scatter");
}

}  // namespace
}  // namespace moetrain
