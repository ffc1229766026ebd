// Dispatch and combine over real Gloo ranks (threads of the test process on TCP loopback; they
// compute nothing, so nothing but the exchange runs concurrently): the plan's layout for known
// counts, dispatch of rows that name their origin (each must land exactly where the layout says)
// and combine back (exactly the rows sent), for ep = 2 and 4, one to three chunks, blocking and
// pipelined, f32 and bf16, and uneven loads: a rank that receives nothing, one that sends
// nothing, nothing at all. Invalid arguments last.
#include "engine/moe/expert_parallel.h"

#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/expert_parallel_test_util.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

// Plans `counts[rank]` on every rank of a world of counts.size() ranks; the handles by rank.
std::vector<DispatchHandle> PlanAll(const std::vector<std::vector<int64_t>>& counts, int chunks) {
  ScratchDir dir;
  const int ep = static_cast<int>(counts.size());
  RankGroups groups = MakeRankGroups(dir.path(), 1, ep);
  std::vector<DispatchHandle> handles(ep);
  if (groups.expert.empty()) return handles;
  RunRanks(ep, [&](int rank) {
    absl::StatusOr<DispatchHandle> handle = PlanDispatch({.group = groups.expert[rank].get(),
                                                          .rows_per_expert = counts[rank],
                                                          .num_chunks = chunks});
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (handle.ok()) handles[rank] = *std::move(handle);
  });
  return handles;
}

TEST(ExpertDispatcherPlanTest, OneChunkReceivesBySourceThenExpert) {
  // E = 4 over 2 ranks: rank 0 owns experts 0 and 1, rank 1 experts 2 and 3.
  const std::vector<std::vector<int64_t>> counts = {{3, 2, 1, 2}, {1, 4, 0, 5}};
  const std::vector<DispatchHandle> h = PlanAll(counts, 1);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(h[rank].rows_sent, (std::vector<int64_t>{3, 2, 1, 2, 1, 4, 0, 5}));
    EXPECT_EQ(h[rank].num_local_experts, 2);
    EXPECT_EQ(h[rank].expert_send_slot, (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(h[rank].chunk_experts, (std::vector<int64_t>{0, 2, 0, 2}));
  }
  EXPECT_EQ(h[0].send_counts, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(h[0].recv_counts, (std::vector<int64_t>{5, 5}));
  // Rank 0 receives 0's three rows for expert 0 and two for expert 1, then 1's one and four.
  EXPECT_EQ(h[0].ExpertOffsets(0, 0), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(h[0].ExpertOffsets(0, 1), (std::vector<int64_t>{5, 6, 10}));
  EXPECT_EQ(h[1].send_counts, (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(h[1].recv_counts, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(h[1].ExpertOffsets(0, 0), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(h[1].ExpertOffsets(0, 1), (std::vector<int64_t>{3, 3, 8}));
  EXPECT_EQ(h[1].num_send_rows(), 10);
  EXPECT_EQ(h[1].num_received_rows(), 8);
}

TEST(ExpertDispatcherPlanTest, ChunksSplitEachRanksRowsEvenlyAndOrderTheSends) {
  // E = 8 over 2 ranks, L = 4. Rank 0's experts receive 10, 1, 1, 8 rows: half the rows are
  // expert 0's, so chunk 0 is expert 0 alone. Rank 1's receive 2 each: two experts per chunk.
  const std::vector<std::vector<int64_t>> counts = {{6, 1, 0, 5, 1, 1, 1, 1},
                                                    {4, 0, 1, 3, 1, 1, 1, 1}};
  const std::vector<DispatchHandle> h = PlanAll(counts, 2);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    EXPECT_EQ(h[rank].chunk_experts, (std::vector<int64_t>{0, 1, 4, 0, 2, 4}));
    // Chunk 0: expert 0 (rank 0), experts 4, 5 (rank 1); chunk 1: experts 1-3, then 6, 7.
    EXPECT_EQ(h[rank].expert_send_slot, (std::vector<int32_t>{0, 3, 4, 5, 1, 2, 6, 7}));
  }
  EXPECT_EQ(h[0].send_counts, (std::vector<int64_t>{6, 2, 6, 2}));
  EXPECT_EQ(h[0].send_offsets, (std::vector<int64_t>{0, 8, 16}));
  EXPECT_EQ(h[0].recv_offsets, (std::vector<int64_t>{0, 10, 20}));
  EXPECT_EQ(h[0].recv_counts, (std::vector<int64_t>{6, 4, 6, 4}));
  EXPECT_EQ(h[1].recv_offsets, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(h[1].chunk_first_expert(1), 2);
  EXPECT_EQ(h[1].chunk_last_expert(1), 4);
  // Rank 0's chunk 1 (experts 1-3): from rank 0 rows 1, 0, 5, then from rank 1 rows 0, 1, 3.
  EXPECT_EQ(h[0].ExpertOffsets(1, 0), (std::vector<int64_t>{10, 11, 11, 16}));
  EXPECT_EQ(h[0].ExpertOffsets(1, 1), (std::vector<int64_t>{16, 16, 17, 20}));
}

// ---------------------------------------------------------------------------------------------
// Round trips

enum class Load { kRandom, kAllToRankZero, kRankZeroSendsNothing, kNothing };

std::vector<int64_t> MakeCounts(Load load, int rank, int64_t experts, int64_t local,
                                uint32_t seed) {
  std::mt19937 rng(seed * 101 + rank);
  std::uniform_int_distribution<int64_t> rows(0, 4);
  std::vector<int64_t> counts(experts, 0);
  for (int64_t e = 0; e < experts; ++e) {
    switch (load) {
      case Load::kRandom:
        counts[e] = rows(rng);
        break;
      case Load::kAllToRankZero:
        counts[e] = e < local ? 1 + rows(rng) : 0;
        break;
      case Load::kRankZeroSendsNothing:
        counts[e] = rank == 0 ? 0 : rows(rng);
        break;
      case Load::kNothing:
        break;
    }
  }
  return counts;
}

// Row i of the rows `source` sends to `expert`: small integers, exact in bf16.
std::vector<float> RowValues(int source, int64_t expert, int64_t i, int64_t cols) {
  std::vector<float> v(cols);
  for (int64_t c = 0; c < cols; ++c)
    v[c] = static_cast<float>((source + 1) * (c + 1) - expert + 3 * i);
  v[0] = static_cast<float>(source);
  v[1] = static_cast<float>(expert);
  v[2] = static_cast<float>(i);
  return v;
}

// This rank's rows in send order.
Tensor SendRows(const DispatchHandle& h, int rank, DType dtype, int64_t cols) {
  std::vector<int64_t> by_slot(h.num_experts);
  for (int64_t e = 0; e < h.num_experts; ++e) by_slot[h.expert_send_slot[e]] = e;
  std::vector<float> values;
  for (int64_t e : by_slot) {
    for (int64_t i = 0; i < h.rows_sent[rank * h.num_experts + e]; ++i) {
      const std::vector<float> row = RowValues(rank, e, i, cols);
      values.insert(values.end(), row.begin(), row.end());
    }
  }
  return MakeTensor(dtype, {h.num_send_rows(), cols}, values);
}

// What rank `rank` must receive: by chunk, then source, then local expert, in the sender's order.
Tensor ExpectedReceived(const DispatchHandle& h, int rank, DType dtype, int64_t cols) {
  std::vector<float> values;
  for (int c = 0; c < h.num_chunks; ++c) {
    for (int s = 0; s < h.group_size; ++s) {
      for (int64_t l = h.chunk_first_expert(c); l < h.chunk_last_expert(c); ++l) {
        const int64_t e = rank * h.num_local_experts + l;
        for (int64_t i = 0; i < h.rows_sent[s * h.num_experts + e]; ++i) {
          const std::vector<float> row = RowValues(s, e, i, cols);
          values.insert(values.end(), row.begin(), row.end());
        }
      }
    }
  }
  return MakeTensor(dtype, {h.num_received_rows(), cols}, values);
}

// Chunk by chunk as the MoE layer runs them: dispatch c + 1 in flight while c is used.
absl::Status Pipelined(const DispatchHandle& h, TensorView rows, TensorView received,
                       TensorView back) {
  std::vector<ExchangeRequest> dispatched(h.num_chunks), combined(h.num_chunks);
  auto start_dispatch = [&](int c) -> absl::Status {
    absl::StatusOr<ExchangeRequest> started =
        StartDispatch({.handle = &h, .rows = rows, .received = received, .chunk = c});
    if (started.ok()) dispatched[c] = *std::move(started);
    return started.status();
  };
  if (absl::Status status = start_dispatch(0); !status.ok()) return status;
  for (int c = 0; c < h.num_chunks; ++c) {
    if (c + 1 < h.num_chunks) {
      if (absl::Status status = start_dispatch(c + 1); !status.ok()) return status;
    }
    if (absl::Status status = dispatched[c].Wait(); !status.ok()) return status;
    absl::StatusOr<ExchangeRequest> started =
        StartCombine({.handle = &h, .rows = received, .out = back, .chunk = c});
    if (!started.ok()) return started.status();
    combined[c] = *std::move(started);
  }
  for (ExchangeRequest& request : combined) {
    if (absl::Status status = request.Wait(); !status.ok()) return status;
  }
  return absl::OkStatus();
}

using RoundTripParam = std::tuple<int /*ep*/, int /*chunks*/>;

class ExpertDispatcherRoundTripTest : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(ExpertDispatcherRoundTripTest, DispatchPlacesEveryRowAndCombineReturnsIt) {
  const auto [ep, chunks] = GetParam();
  const int64_t local = 3, experts = local * ep, cols = 7;
  ScratchDir dir;
  RankGroups groups = MakeRankGroups(dir.path(), 1, ep);
  ASSERT_EQ(static_cast<int>(groups.expert.size()), ep);
  RunRanks(ep, [&](int rank) {
    uint32_t seed = 1;
    for (Load load :
         {Load::kRandom, Load::kAllToRankZero, Load::kRankZeroSendsNothing, Load::kNothing}) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(::testing::Message() << "rank " << rank << " load " << static_cast<int>(load)
                                          << " " << DTypeName(dtype));
        const std::vector<int64_t> counts = MakeCounts(load, rank, experts, local, seed++);
        absl::StatusOr<DispatchHandle> h = PlanDispatch(
            {.group = groups.expert[rank].get(), .rows_per_expert = counts, .num_chunks = chunks});
        ASSERT_TRUE(h.ok()) << h.status();
        const Tensor rows = SendRows(*h, rank, dtype, cols);
        const Tensor expected = ExpectedReceived(*h, rank, dtype, cols);
        if (load == Load::kAllToRankZero && rank > 0) {
          EXPECT_EQ(h->num_received_rows(), 0);
        }
        if (load == Load::kRankZeroSendsNothing && rank == 0) {
          EXPECT_EQ(h->num_send_rows(), 0);
        }

        // Blocking, every chunk.
        Tensor received = NanTensor(dtype, {h->num_received_rows(), cols});
        Tensor back = NanTensor(dtype, {h->num_send_rows(), cols});
        ASSERT_TRUE(Dispatch({.handle = &*h, .rows = rows, .received = received}).ok());
        EXPECT_TRUE(BitIdentical(received, expected));
        ASSERT_TRUE(Combine({.handle = &*h, .rows = received, .out = back}).ok());
        EXPECT_TRUE(BitIdentical(back, rows));

        // Pipelined, chunk by chunk, into fresh buffers.
        Tensor received2 = NanTensor(dtype, {h->num_received_rows(), cols});
        Tensor back2 = NanTensor(dtype, {h->num_send_rows(), cols});
        const absl::Status status = Pipelined(*h, rows, received2, back2);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_TRUE(BitIdentical(received2, expected));
        EXPECT_TRUE(BitIdentical(back2, rows));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertDispatcherRoundTripTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<RoundTripParam>& info) {
                           return "Ep" + std::to_string(std::get<0>(info.param)) + "Chunks" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Invalid arguments: each is refused before any collective, so one rank alone sees the error.

TEST(ExpertDispatcherErrorsTest, RefusesBadPlansAndExchanges) {
  ScratchDir dir;
  RankGroups groups = MakeRankGroups(dir.path(), 1, 2);
  ASSERT_EQ(groups.expert.size(), 2u);
  std::vector<DispatchHandle> handles(2);
  RunRanks(2, [&](int rank) {
    absl::StatusOr<DispatchHandle> h = PlanDispatch(
        {.group = groups.expert[rank].get(), .rows_per_expert = {1, 2, 0, 3}, .num_chunks = 2});
    ASSERT_TRUE(h.ok()) << h.status();
    handles[rank] = *std::move(h);
  });
  Communicator* group = groups.expert[0].get();
  const DispatchHandle& h = handles[0];

  auto expect_invalid = [](const absl::Status& status, const std::string& part) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(part), std::string::npos) << status;
  };
  const std::vector<int64_t> three = {1, 1, 1}, four = {1, 1, 1, 1}, negative = {1, -1, 1, 1};
  expect_invalid(PlanDispatch({.rows_per_expert = four}).status(), "no expert group");
  expect_invalid(PlanDispatch({.group = group, .rows_per_expert = three}).status(),
                 "model.moe.num_experts = 3 is not a positive multiple of "
                 "parallel.expert_parallel = 2");
  expect_invalid(PlanDispatch({.group = group, .rows_per_expert = four, .num_chunks = 3}).status(),
                 "num_chunks = 3 is outside [1, 2]");
  expect_invalid(PlanDispatch({.group = group, .rows_per_expert = four, .num_chunks = 0}).status(),
                 "num_chunks = 0");
  expect_invalid(PlanDispatch({.group = group, .rows_per_expert = negative}).status(),
                 "rows_per_expert[1] = -1 is negative");

  const Tensor rows = Tensor::Zeros(DType::kF32, {h.num_send_rows(), 4});
  const Tensor received = Tensor::Zeros(DType::kF32, {h.num_received_rows(), 4});
  expect_invalid(Dispatch({.rows = rows, .received = received}), "dispatch: no handle");
  const Tensor short_rows = Tensor::Zeros(DType::kF32, {h.num_send_rows() - 1, 4});
  expect_invalid(Dispatch({.handle = &h, .rows = short_rows, .received = received}),
                 "dispatch rows");
  const Tensor ints = Tensor::Zeros(DType::kI32, {h.num_send_rows(), 4});
  expect_invalid(Dispatch({.handle = &h, .rows = ints, .received = received}), "f32 or bf16");
  const Tensor bf16 = Tensor::Zeros(DType::kBF16, {h.num_received_rows(), 4});
  expect_invalid(Dispatch({.handle = &h, .rows = rows, .received = bf16}),
                 "differ in dtype or width");
  const Tensor wide = Tensor::Zeros(DType::kF32, {h.num_received_rows(), 5});
  expect_invalid(Dispatch({.handle = &h, .rows = rows, .received = wide}),
                 "differ in dtype or width");
  expect_invalid(Dispatch({.handle = &h, .rows = rows, .received = received, .chunk = 2}),
                 "chunk = 2 is outside [0, 2)");
  expect_invalid(Combine({.handle = &h, .rows = received, .out = short_rows}), "combine out");
  const Tensor long_received = Tensor::Zeros(DType::kF32, {h.num_received_rows() + 1, 4});
  expect_invalid(Combine({.handle = &h, .rows = long_received, .out = rows}), "combine rows");
}

}  // namespace
}  // namespace moetrain::moe_test
