// The Gloo communicator's collectives against references computed here, for worlds of 1 to 4
// ranks (threads of this process, each with its own communicator over TCP loopback).
#include "engine/comm/gloo_communicator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "comm_test_util.h"
#include "engine/core/dtype_math.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using testutil::TempDir;

// The bytes rank `src` sends rank `dst`: count elements of `element` bytes, distinct per pair.
std::vector<uint8_t> Chunk(int src, int dst, int64_t count, size_t element) {
  std::vector<uint8_t> bytes(count * element);
  for (size_t k = 0; k < bytes.size(); ++k)
    bytes[k] = (src * 131 + dst * 31 + k * 7 + k / 251) & 0xff;
  return bytes;
}

// counts[src][dst]: elements src sends dst.
using CountMatrix = std::vector<std::vector<int64_t>>;

// Runs all-to-all-v with `counts` on every rank and checks every byte received.
void CheckAllToAllV(std::vector<std::unique_ptr<GlooCommunicator>>& world,
                    const CountMatrix& counts, DType dtype) {
  const int size = static_cast<int>(world.size());
  const size_t element = DTypeSize(dtype);
  RunRanks(size, [&](int rank) {
    AllToAllVArgs args;
    args.dtype = dtype;
    std::vector<uint8_t> send, expected;
    for (int peer = 0; peer < size; ++peer) {
      args.send_counts.push_back(counts[rank][peer]);
      args.recv_counts.push_back(counts[peer][rank]);
      const std::vector<uint8_t> out = Chunk(rank, peer, counts[rank][peer], element);
      const std::vector<uint8_t> in = Chunk(peer, rank, counts[peer][rank], element);
      send.insert(send.end(), out.begin(), out.end());
      expected.insert(expected.end(), in.begin(), in.end());
    }
    std::vector<uint8_t> recv(expected.size(), 0xEE);
    args.send = send.empty() ? nullptr : send.data();
    args.recv = recv.empty() ? nullptr : recv.data();
    ASSERT_OK(world[rank]->AllToAllV(args));
    EXPECT_EQ(recv, expected) << "rank " << rank;
  });
}

class GlooCommunicatorTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    world_ = MakeGlooWorld(dir_.path(), GetParam());
    ASSERT_EQ(world_.size(), static_cast<size_t>(GetParam()));
  }
  int size() const { return GetParam(); }

  TempDir dir_;
  std::vector<std::unique_ptr<GlooCommunicator>> world_;
};

TEST_P(GlooCommunicatorTest, ReportsItsPlace) {
  for (int rank = 0; rank < size(); ++rank) {
    EXPECT_EQ(world_[rank]->rank(), rank);
    EXPECT_EQ(world_[rank]->size(), size());
    EXPECT_EQ(world_[rank]->backend(), "gloo");
  }
}

TEST_P(GlooCommunicatorTest, AllToAllVRandomCountsWithZeros) {
  std::mt19937 rng(17 + size());
  std::uniform_int_distribution<int64_t> count(-10, 40);  // about a fifth of the pairs get none
  CountMatrix counts(size(), std::vector<int64_t>(size()));
  for (auto& row : counts) {
    for (int64_t& c : row) c = std::max<int64_t>(0, count(rng));
  }
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kI64}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    CheckAllToAllV(world_, counts, dtype);
  }
}

TEST_P(GlooCommunicatorTest, AllToAllVAllZeroWithNullBuffers) {
  CheckAllToAllV(world_, CountMatrix(size(), std::vector<int64_t>(size(), 0)), DType::kF32);
}

// Rank 0 sends a megabyte to the last rank and a little to the rest; rank 1 sends nothing at all.
TEST_P(GlooCommunicatorTest, AllToAllVVeryUneven) {
  CountMatrix counts(size(), std::vector<int64_t>(size(), 0));
  for (int dst = 0; dst < size(); ++dst) counts[0][dst] = dst == size() - 1 ? (1 << 18) : 3;
  for (int src = 2; src < size(); ++src) counts[src][0] = 1;
  CheckAllToAllV(world_, counts, DType::kF32);
}

TEST_P(GlooCommunicatorTest, AllReduceSumF32MatchesFloat64Reference) {
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    std::vector<std::vector<float>> data(size(), std::vector<float>(count));
    std::vector<double> reference(count, 0.0);
    std::mt19937 rng(count);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (int rank = 0; rank < size(); ++rank) {
      for (int64_t i = 0; i < count; ++i) {
        data[rank][i] = value(rng);
        reference[i] += data[rank][i];
      }
    }
    RunRanks(size(), [&](int rank) {
      ASSERT_OK(world_[rank]->AllReduceSum(data[rank].data(), count, DType::kF32));
    });
    for (int rank = 0; rank < size(); ++rank) {
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_NEAR(data[rank][i], reference[i], 1e-6 * size()) << "rank " << rank << " i " << i;
      }
      // Every rank holds the same bits, whatever order the ring added them in.
      EXPECT_EQ(std::memcmp(data[rank].data(), data[0].data(), count * sizeof(float)), 0);
    }
  }
}

template <typename T>
void CheckIntegerAllReduce(std::vector<std::unique_ptr<GlooCommunicator>>& world, DType dtype,
                           T base) {
  const int size = static_cast<int>(world.size());
  constexpr int64_t kCount = 517;
  RunRanks(size, [&](int rank) {
    std::vector<T> data(kCount);
    for (int64_t i = 0; i < kCount; ++i) data[i] = base * (rank + 1) - static_cast<T>(i * rank);
    ASSERT_OK(world[rank]->AllReduceSum(data.data(), kCount, dtype));
    for (int64_t i = 0; i < kCount; ++i) {
      T expected = 0;
      for (int r = 0; r < size; ++r) expected += base * (r + 1) - static_cast<T>(i * r);
      ASSERT_EQ(data[i], expected) << "rank " << rank << " i " << i;
    }
  });
}

TEST_P(GlooCommunicatorTest, AllReduceSumIntegers) {
  CheckIntegerAllReduce<int32_t>(world_, DType::kI32, -100000);
  CheckIntegerAllReduce<int64_t>(world_, DType::kI64, int64_t{1} << 40);
}

TEST_P(GlooCommunicatorTest, AllReduceSumOfNothingIsANoOp) {
  RunRanks(size(),
           [&](int rank) { ASSERT_OK(world_[rank]->AllReduceSum(nullptr, 0, DType::kF32)); });
}

TEST_P(GlooCommunicatorTest, AllGatherInRankOrder) {
  constexpr int64_t kCount = 7;
  RunRanks(size(), [&](int rank) {
    std::vector<int64_t> send(kCount), recv(kCount * size(), -1);
    for (int64_t i = 0; i < kCount; ++i) send[i] = rank * 1000 + i;
    ASSERT_OK(world_[rank]->AllGather(send.data(), recv.data(), kCount, DType::kI64));
    for (int r = 0; r < size(); ++r) {
      for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[r * kCount + i], r * 1000 + i);
    }
  });
}

// Block sizes with a zero, a one and uneven ones: rank r's block has counts[r] elements.
std::vector<int64_t> UnevenCounts(int size) {
  std::vector<int64_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = r == 1 ? 0 : (r == 2 ? 1 : 257 + 13 * r);
  return counts;
}

TEST_P(GlooCommunicatorTest, ReduceScatterSumAddsEachBlockInRankOrder) {
  const std::vector<int64_t> counts = UnevenCounts(size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::vector<float>> data(size(), std::vector<float>(total));
  std::mt19937 rng(29 + size());
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& values : data) {
    for (float& v : values) v = value(rng);
  }
  const std::vector<std::vector<float>> input = data;
  RunRanks(size(), [&](int rank) {
    ASSERT_OK(world_[rank]->ReduceScatterSum(data[rank].data(), counts, DType::kF32));
  });
  int64_t offset = 0;
  for (int rank = 0; rank < size(); ++rank) {
    for (int64_t i = offset; i < offset + counts[rank]; ++i) {
      float in_rank_order = input[0][i];
      double reference = input[0][i];
      for (int q = 1; q < size(); ++q) {
        in_rank_order += input[q][i];
        reference += input[q][i];
      }
      ASSERT_EQ(data[rank][i], in_rank_order) << "rank " << rank << " i " << i;
      ASSERT_NEAR(data[rank][i], reference, 1e-6 * size());
    }
    offset += counts[rank];
  }
}

TEST_P(GlooCommunicatorTest, ReduceScatterSumIntegers) {
  const std::vector<int64_t> counts = UnevenCounts(size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  RunRanks(size(), [&](int rank) {
    std::vector<int64_t> data(total);
    for (int64_t i = 0; i < total; ++i) data[i] = (int64_t{1} << 40) * (rank + 1) - i * rank;
    ASSERT_OK(world_[rank]->ReduceScatterSum(data.data(), counts, DType::kI64));
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += counts[r];
    for (int64_t i = offset; i < offset + counts[rank]; ++i) {
      int64_t expected = 0;
      for (int q = 0; q < size(); ++q) expected += (int64_t{1} << 40) * (q + 1) - i * q;
      ASSERT_EQ(data[i], expected) << "rank " << rank << " i " << i;
    }
  });
}

// The property a sharded optimizer's exactness rests on: the all-reduce's sums are the
// reduce-scatter's, bit for bit, wherever the blocks are cut.
TEST_P(GlooCommunicatorTest, AllReduceSumIsAReduceScatterBitForBit) {
  const std::vector<int64_t> counts = UnevenCounts(size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::vector<float>> reduced(size(), std::vector<float>(total));
  std::mt19937 rng(31 + size());
  std::uniform_real_distribution<float> value(-100.0f, 100.0f);
  for (auto& values : reduced) {
    for (float& v : values) v = value(rng);
  }
  std::vector<std::vector<float>> scattered = reduced;
  RunRanks(size(), [&](int rank) {
    ASSERT_OK(world_[rank]->AllReduceSum(reduced[rank].data(), total, DType::kF32));
    ASSERT_OK(world_[rank]->ReduceScatterSum(scattered[rank].data(), counts, DType::kF32));
  });
  int64_t offset = 0;
  for (int rank = 0; rank < size(); ++rank) {
    EXPECT_EQ(std::memcmp(scattered[rank].data() + offset, reduced[rank].data() + offset,
                          counts[rank] * sizeof(float)),
              0)
        << "rank " << rank;
    offset += counts[rank];
  }
}

// bf16 sums (gradients reduced in bf16): every rank's values widened to f32, added in rank order,
// the sum rounded once to nearest even; the all-reduce and the reduce-scatter alike.
TEST_P(GlooCommunicatorTest, Bf16SumsAddInF32InRankOrderAndRoundOnce) {
  const std::vector<int64_t> counts = UnevenCounts(size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::vector<uint16_t>> reduced(size(), std::vector<uint16_t>(total));
  std::mt19937 rng(7 + size());
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (auto& values : reduced) {
    for (uint16_t& v : values) v = FloatToBF16Bits(value(rng));
  }
  std::vector<uint16_t> want(total);
  for (int64_t i = 0; i < total; ++i) {
    float sum = BF16BitsToFloat(reduced[0][i]);
    for (int r = 1; r < size(); ++r) sum += BF16BitsToFloat(reduced[r][i]);
    want[i] = FloatToBF16Bits(sum);
  }
  std::vector<std::vector<uint16_t>> scattered = reduced;
  RunRanks(size(), [&](int rank) {
    ASSERT_OK(world_[rank]->AllReduceSum(reduced[rank].data(), total, DType::kBF16));
    ASSERT_OK(world_[rank]->ReduceScatterSum(scattered[rank].data(), counts, DType::kBF16));
  });
  int64_t offset = 0;
  for (int rank = 0; rank < size(); ++rank) {
    EXPECT_EQ(reduced[rank], want) << "rank " << rank;
    EXPECT_TRUE(std::equal(want.begin() + offset, want.begin() + offset + counts[rank],
                           scattered[rank].begin() + offset))
        << "rank " << rank;
    offset += counts[rank];
  }
}

TEST_P(GlooCommunicatorTest, AllGatherVFillsEveryBlockFromItsRank) {
  const std::vector<int64_t> counts = UnevenCounts(size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  RunRanks(size(), [&](int rank) {
    // bf16-sized elements: any dtype gathers.
    std::vector<uint16_t> data(total, 0xDEAD);
    int64_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += counts[r];
    for (int64_t i = offset; i < offset + counts[rank]; ++i) data[i] = rank * 1000 + i % 1000;
    ASSERT_OK(world_[rank]->AllGatherV(data.data(), counts, DType::kBF16));
    int64_t i = 0;
    for (int r = 0; r < size(); ++r) {
      for (int64_t k = 0; k < counts[r]; ++k, ++i) {
        ASSERT_EQ(data[i], r * 1000 + i % 1000) << "rank " << rank << " i " << i;
      }
    }
  });
}

TEST_P(GlooCommunicatorTest, BroadcastFromTheLastRank) {
  const int root = size() - 1;
  constexpr int64_t kCount = 33;
  RunRanks(size(), [&](int rank) {
    std::vector<float> data(kCount);
    for (int64_t i = 0; i < kCount; ++i) data[i] = rank == root ? 0.25f * i - 3.0f : -999.0f;
    ASSERT_OK(world_[rank]->Broadcast(data.data(), kCount, DType::kF32, root));
    for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(data[i], 0.25f * i - 3.0f) << "rank " << rank;
  });
}

TEST_P(GlooCommunicatorTest, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  RunRanks(size(), [&](int rank) {
    // The last rank dawdles: nobody may pass before it has arrived.
    if (rank == size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived.fetch_add(1);
    ASSERT_OK(world_[rank]->Barrier());
    EXPECT_EQ(arrived.load(), size()) << "rank " << rank << " passed the barrier early";
  });
}

// Three collectives in flight at once, waited for in another order than they were started.
TEST_P(GlooCommunicatorTest, AsyncOpsOverlapAndWaitOutOfOrder) {
  RunRanks(size(), [&](int rank) {
    std::vector<int32_t> sum(64, rank + 1);
    std::vector<int32_t> send(size(), rank), recv(size(), -1);
    std::vector<int32_t> gathered(size(), -1);
    AllToAllVArgs args{.send = send.data(),
                       .send_counts = std::vector<int64_t>(size(), 1),
                       .recv = recv.data(),
                       .recv_counts = std::vector<int64_t>(size(), 1),
                       .dtype = DType::kI32};
    auto reduce = world_[rank]->StartAllReduceSum(sum.data(), 64, DType::kI32);
    auto exchange = world_[rank]->StartAllToAllV(args);
    const int32_t mine = rank * 10;
    auto gather = world_[rank]->StartAllGather(&mine, gathered.data(), 1, DType::kI32);
    ASSERT_TRUE(reduce.ok() && exchange.ok() && gather.ok());
    ASSERT_OK((*gather)->Wait());
    ASSERT_OK((*reduce)->Wait());
    ASSERT_OK((*exchange)->Wait());
    ASSERT_OK((*exchange)->Wait());  // a second Wait repeats the status
    for (int32_t v : sum) ASSERT_EQ(v, size() * (size() + 1) / 2);
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ(recv[r], r);
      EXPECT_EQ(gathered[r], r * 10);
    }
  });
}

// A pipeline: several all-to-alls of different sizes in flight on one communicator, their args
// gone out of scope before they run, waited for last to first.
TEST_P(GlooCommunicatorTest, PipelinedAllToAllsKeepTheirOwnBuffers) {
  constexpr int kChunks = 6;
  RunRanks(size(), [&](int rank) {
    std::vector<std::vector<int64_t>> send(kChunks), recv(kChunks);
    std::vector<std::unique_ptr<CommRequest>> requests;
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const int64_t per_peer = 1 + chunk * 300;
      for (int peer = 0; peer < size(); ++peer) {
        for (int64_t i = 0; i < per_peer; ++i)
          send[chunk].push_back((chunk * 10 + rank) * 100000 + peer * 1000 + i);
      }
      recv[chunk].assign(per_peer * size(), -1);
      AllToAllVArgs args{.send = send[chunk].data(),
                         .send_counts = std::vector<int64_t>(size(), per_peer),
                         .recv = recv[chunk].data(),
                         .recv_counts = std::vector<int64_t>(size(), per_peer),
                         .dtype = DType::kI64};
      auto request = world_[rank]->StartAllToAllV(args);
      ASSERT_TRUE(request.ok()) << request.status();
      requests.push_back(*std::move(request));
    }
    for (int chunk = kChunks - 1; chunk >= 0; --chunk) {
      ASSERT_OK(requests[chunk]->Wait());
      const int64_t per_peer = 1 + chunk * 300;
      for (int src = 0; src < size(); ++src) {
        for (int64_t i = 0; i < per_peer; ++i) {
          ASSERT_EQ(recv[chunk][src * per_peer + i], (chunk * 10 + src) * 100000 + rank * 1000 + i)
              << "rank " << rank << " chunk " << chunk << " from " << src;
        }
      }
    }
  });
}

TEST_P(GlooCommunicatorTest, BadArgumentsFailAtOnceWithoutStartingAnything) {
  RunRanks(size(), [&](int rank) {
    GlooCommunicator& comm = *world_[rank];
    AllToAllVArgs args;  // no counts at all
    EXPECT_EQ(comm.StartAllToAllV(args).status().code(), absl::StatusCode::kInvalidArgument);
    float x = 1;
    EXPECT_EQ(comm.StartAllReduceSum(&x, 1, DType::kF8E4M3).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.StartBroadcast(&x, 1, DType::kF32, size()).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.StartAllReduceSum(nullptr, 4, DType::kF32).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(comm.Subgroup({rank, rank}).status().code(), absl::StatusCode::kInvalidArgument);
    std::vector<int64_t> counts(size(), 1);
    EXPECT_EQ(comm.StartReduceScatterSum(&x, counts, DType::kF8E4M3).status().code(),
              absl::StatusCode::kInvalidArgument);
    counts.push_back(1);  // one too many
    EXPECT_EQ(comm.StartAllGatherV(&x, counts, DType::kF32).status().code(),
              absl::StatusCode::kInvalidArgument);
    counts.assign(size(), 0);
    counts[0] = -1;
    EXPECT_EQ(comm.StartReduceScatterSum(&x, counts, DType::kF32).status().code(),
              absl::StatusCode::kInvalidArgument);
    // Still healthy: the group goes on.
    ASSERT_OK(comm.Barrier());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooCommunicatorTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "size" + std::to_string(info.param); });

}  // namespace
}  // namespace moetrain
