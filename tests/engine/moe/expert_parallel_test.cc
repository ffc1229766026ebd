// Dispatch and combine over real Gloo ranks (threads of the test process on TCP loopback; they
// compute nothing, so nothing but the exchange runs concurrently): the plan's layout for known
// counts, dispatch of rows that name their origin (each must land exactly where the layout says)
// and combine back (exactly the rows sent), for ep = 2 and 4, one to three chunks, blocking and
// pipelined, f32 and bf16, and uneven loads: a rank that receives nothing, one that sends
// nothing, nothing at all. The same with FP8 on the wire, for widths that are and are not
// multiples of 128. Invalid arguments last.
#include "engine/moe/expert_parallel.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/fp8_math.h"
#include "engine/core/tensor.h"
#include "engine/ops/fp8/fp8.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/expert_parallel_test_util.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

// Plans `counts[rank]` on every rank of a world of counts.size() ranks; the handles by rank.
std::vector<DispatchHandle> PlanAll(const std::vector<std::vector<int64_t>>& counts, int chunks) {
  TempDir dir;
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

// Runs check(rank, load, dtype, handle) on every rank of an ep-rank world (3 experts per rank)
// for every load and dtype in turn, the handle planning `chunks` chunks of that rank's
// MakeCounts (seeds 1, 2, … in that order). A fatal failure ends the rank's loop.
template <typename Check>
void ForEveryLoadOnEveryRank(int ep, int chunks, const Check& check) {
  const int64_t local = 3, experts = local * ep;
  TempDir dir;
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
        check(rank, load, dtype, *h);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  });
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

using RowFn = std::vector<float> (*)(int source, int64_t expert, int64_t i, int64_t cols);

// This rank's rows in send order.
Tensor SendRows(const DispatchHandle& h, int rank, DType dtype, int64_t cols,
                RowFn row_values = RowValues) {
  std::vector<int64_t> by_slot(h.num_experts);
  for (int64_t e = 0; e < h.num_experts; ++e) by_slot[h.expert_send_slot[e]] = e;
  std::vector<float> values;
  for (int64_t e : by_slot) {
    for (int64_t i = 0; i < h.rows_sent[rank * h.num_experts + e]; ++i) {
      const std::vector<float> row = row_values(rank, e, i, cols);
      values.insert(values.end(), row.begin(), row.end());
    }
  }
  return MakeTensor(dtype, {h.num_send_rows(), cols}, values);
}

// What rank `rank` must receive: by chunk, then source, then local expert, in the sender's order.
Tensor ExpectedReceived(const DispatchHandle& h, int rank, DType dtype, int64_t cols,
                        RowFn row_values = RowValues) {
  std::vector<float> values;
  for (int c = 0; c < h.num_chunks; ++c) {
    for (int s = 0; s < h.group_size; ++s) {
      for (int64_t l = h.chunk_first_expert(c); l < h.chunk_last_expert(c); ++l) {
        const int64_t e = rank * h.num_local_experts + l;
        for (int64_t i = 0; i < h.rows_sent[s * h.num_experts + e]; ++i) {
          const std::vector<float> row = row_values(s, e, i, cols);
          values.insert(values.end(), row.begin(), row.end());
        }
      }
    }
  }
  return MakeTensor(dtype, {h.num_received_rows(), cols}, values);
}

// Chunk by chunk as the MoE layer runs them: dispatch c + 1 in flight while c is used.
absl::Status Pipelined(const DispatchHandle& h, TensorView rows, TensorView received,
                       TensorView back, bool fp8 = false) {
  const ExecContext ctx = ExecContext::Cpu();
  std::vector<ExchangeRequest> dispatched(h.num_chunks), combined(h.num_chunks);
  auto start_dispatch = [&](int c) -> absl::Status {
    absl::StatusOr<ExchangeRequest> started = StartDispatch(
        {.handle = &h, .rows = rows, .received = received, .chunk = c, .fp8 = fp8, .ctx = &ctx});
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
  const int64_t cols = 7;
  ForEveryLoadOnEveryRank(ep, chunks, [&](int rank, Load load, DType dtype, DispatchHandle& h) {
    const Tensor rows = SendRows(h, rank, dtype, cols);
    const Tensor expected = ExpectedReceived(h, rank, dtype, cols);
    if (load == Load::kAllToRankZero && rank > 0) {
      EXPECT_EQ(h.num_received_rows(), 0);
    }
    if (load == Load::kRankZeroSendsNothing && rank == 0) {
      EXPECT_EQ(h.num_send_rows(), 0);
    }

    // Blocking, every chunk.
    Tensor received = NanTensor(dtype, {h.num_received_rows(), cols});
    Tensor back = NanTensor(dtype, {h.num_send_rows(), cols});
    ASSERT_TRUE(Dispatch({.handle = &h, .rows = rows, .received = received}).ok());
    EXPECT_TRUE(BitIdentical(received, expected));
    ASSERT_TRUE(Combine({.handle = &h, .rows = received, .out = back}).ok());
    EXPECT_TRUE(BitIdentical(back, rows));

    // Pipelined, chunk by chunk, into fresh buffers.
    Tensor received2 = NanTensor(dtype, {h.num_received_rows(), cols});
    Tensor back2 = NanTensor(dtype, {h.num_send_rows(), cols});
    const absl::Status status = Pipelined(h, rows, received2, back2);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(BitIdentical(received2, expected));
    EXPECT_TRUE(BitIdentical(back2, rows));
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertDispatcherRoundTripTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2, 3)),
                         [](const ::testing::TestParamInfo<RoundTripParam>& info) {
                           return "Ep" + std::to_string(std::get<0>(info.param)) + "Chunks" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// FP8 on the wire: every received row must be exactly Dequantize(Quantize(row)) with E4M3, 1×128
// blocks and power-of-two scales, whatever chunk, source and width it has.

// Row i of the rows `source` sends to `expert`, exact in bf16, with a magnitude that varies by
// row so that the blocks' scales differ: some rows all zero, some tiny, some large, and each
// 128-block of a row its own magnitude too.
std::vector<float> Fp8RowValues(int source, int64_t expert, int64_t i, int64_t cols) {
  std::mt19937 rng(static_cast<uint32_t>(source * 1000003 + expert * 1009 + i));
  constexpr float kMagnitudes[] = {0.0f, 1e-4f, 0.37f, 1.0f, 300.0f, 7e4f};
  const float row_magnitude = kMagnitudes[rng() % 6];
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> v(cols);
  float block_magnitude = row_magnitude;
  for (int64_t c = 0; c < cols; ++c) {
    if (c % 128 == 0 && c > 0) block_magnitude = row_magnitude * (1 + rng() % 5);
    v[c] = RoundToBF16(block_magnitude * unit(rng));
  }
  return v;
}

// The reference round trip of `rows` (f32 or bf16, host) from engine/core/fp8_math.h's formulas:
// per row and 128-block, amax → pow2 scale → E4M3 → value × 1/scale, in rows' dtype.
Tensor ReferenceRoundTrip(const TensorView& rows) {
  const int64_t n = rows.dim(0), cols = rows.dim(1);
  const std::vector<double> x = ToDoubles(rows);
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t begin = 0; begin < cols; begin += 128) {
      const int64_t end = std::min(cols, begin + 128);
      float amax = 0.0f;
      for (int64_t c = begin; c < end; ++c) {
        amax = Fp8AmaxFold(amax, static_cast<float>(x[r * cols + c]));
      }
      const float scale = ScaleFromAmax(amax, Fp8Max(Fp8Format::kE4M3), /*pow2=*/true,
                                        /*epsilon=*/0.0f, std::numeric_limits<float>::max());
      for (int64_t c = begin; c < end; ++c) {
        const uint8_t q =
            QuantizeFp8(static_cast<float>(x[r * cols + c]) * scale, Fp8Format::kE4M3);
        out[r * cols + c] = Fp8ToFloat(q, Fp8Format::kE4M3) * (1.0f / scale);
      }
    }
  }
  return MakeTensor(rows.dtype(), {n, cols}, out);
}

// The same round trip through the FP8 ops on the CPU.
Tensor OpsRoundTrip(const TensorView& rows) {
  const ExecContext ctx = ExecContext::Cpu();
  const int64_t n = rows.dim(0), cols = rows.dim(1);
  Tensor out = NanTensor(rows.dtype(), {n, cols});
  if (n == 0) return out;
  absl::StatusOr<ops::OwnedFp8Tensor> q =
      ops::AllocateFp8Tensor(ctx, Fp8Format::kE4M3, ops::Fp8Scaling::kBlock1x128, n, cols);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return out;
  ops::Fp8QuantizeArgs args;
  args.src = rows;
  args.pow2_scales = true;
  args.out = q->view;
  const absl::Status quantized = ops::Fp8Quantize(ctx, args);
  EXPECT_TRUE(quantized.ok()) << quantized;
  const absl::Status dequantized = ops::Fp8Dequantize(ctx, q->view, out);
  EXPECT_TRUE(dequantized.ok()) << dequantized;
  return out;
}

TEST(ExpertDispatcherFp8Test, RowBytes) {
  EXPECT_EQ(DispatchRowBytes(7168, DType::kBF16, false), 2 * 7168);
  EXPECT_EQ(DispatchRowBytes(7168, DType::kF32, false), 4 * 7168);
  // 7168 E4M3 bytes and 56 scales: 0.516 of bf16.
  EXPECT_EQ(DispatchRowBytes(7168, DType::kBF16, true), 7168 + 4 * 56);
  // 300 → 304 bytes (rows padded to 16) and ceil(300/128) = 3 scales.
  EXPECT_EQ(DispatchRowBytes(300, DType::kBF16, true), 304 + 12);
}

using Fp8Param = std::tuple<int /*ep*/, int /*chunks*/, int64_t /*cols*/>;

class ExpertDispatcherFp8Test : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(ExpertDispatcherFp8Test, EveryRowArrivesQuantizedAndDequantized) {
  const auto [ep, chunks, cols] = GetParam();
  const ExecContext ctx = ExecContext::Cpu();
  ForEveryLoadOnEveryRank(ep, chunks, [&](int rank, Load /*load*/, DType dtype, DispatchHandle& h) {
    const Tensor rows = SendRows(h, rank, dtype, cols, Fp8RowValues);
    const Tensor plain = ExpectedReceived(h, rank, dtype, cols, Fp8RowValues);
    const Tensor expected = ReferenceRoundTrip(plain);
    // The ops' round trip agrees with the formulas (rows are independent, so quantising all
    // received rows at once gives each row what its sender computed).
    EXPECT_TRUE(BitIdentical(OpsRoundTrip(plain), expected));

    Tensor received = NanTensor(dtype, {h.num_received_rows(), cols});
    const absl::Status dispatched =
        Dispatch({.handle = &h, .rows = rows, .received = received, .fp8 = true, .ctx = &ctx});
    ASSERT_TRUE(dispatched.ok()) << dispatched;
    EXPECT_TRUE(BitIdentical(received, expected));
    // Combine stays in the compute dtype: the senders get the round-tripped rows back.
    Tensor back = NanTensor(dtype, {h.num_send_rows(), cols});
    ASSERT_TRUE(Combine({.handle = &h, .rows = received, .out = back}).ok());
    EXPECT_TRUE(BitIdentical(back, ReferenceRoundTrip(rows)));

    // Chunk by chunk, into fresh buffers.
    Tensor received2 = NanTensor(dtype, {h.num_received_rows(), cols});
    Tensor back2 = NanTensor(dtype, {h.num_send_rows(), cols});
    const absl::Status status = Pipelined(h, rows, received2, back2, /*fp8=*/true);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(BitIdentical(received2, expected));
    EXPECT_TRUE(BitIdentical(back2, back));
  });
}

// Widths: under one block, exactly one, ragged over three (and not a multiple of 16, so the FP8
// rows carry padding), several whole blocks.
INSTANTIATE_TEST_SUITE_P(Layouts, ExpertDispatcherFp8Test,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2),
                                            ::testing::Values<int64_t>(7, 128, 300, 512)),
                         [](const ::testing::TestParamInfo<Fp8Param>& info) {
                           return "Ep" + std::to_string(std::get<0>(info.param)) + "Chunks" +
                                  std::to_string(std::get<1>(info.param)) + "Cols" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Why the wire uses power-of-two scales: the blockwise recipe's expert GEMM quantises the
// received rows again with the same 1×128 blocks, and a dequantised row re-quantises to the same
// values. (A block's largest element goes from a·s ∈ (224, 448] to RN(a·s); when that is 224 the
// second scale is 2s and each stored value exactly doubles, so the bits may differ but the values
// the GEMM multiplies, stored value × scale_inv, do not.) Non-pow2 scales give no such guarantee.
TEST(ExpertDispatcherFp8Test, WireRowsRequantizeToTheSameValues) {
  const ExecContext ctx = ExecContext::Cpu();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const int64_t n = 64, cols = 300, blocks = 3;
    std::vector<float> values;
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> row = Fp8RowValues(7, 3, i, cols);
      values.insert(values.end(), row.begin(), row.end());
    }
    // Row 5's first block: largest value 226, scale 1, RN to E4M3 gives 224 (the doubling case).
    for (int64_t c = 0; c < 128; ++c) values[5 * cols + c] = c == 1 ? 226.0f : 1.0f;
    const Tensor x = MakeTensor(dtype, {n, cols}, values);
    auto quantize = [&](const TensorView& src, ops::OwnedFp8Tensor* q) {
      absl::StatusOr<ops::OwnedFp8Tensor> made =
          ops::AllocateFp8Tensor(ctx, Fp8Format::kE4M3, ops::Fp8Scaling::kBlock1x128, n, cols);
      ASSERT_TRUE(made.ok()) << made.status();
      *q = *std::move(made);
      ops::Fp8QuantizeArgs args;
      args.src = src;
      args.pow2_scales = true;
      args.out = q->view;
      ASSERT_OK(ops::Fp8Quantize(ctx, args));
    };
    ops::OwnedFp8Tensor q1, q2;
    ASSERT_NO_FATAL_FAILURE(quantize(x, &q1));
    const Tensor v1 = NanTensor(dtype, {n, cols});
    ASSERT_OK(ops::Fp8Dequantize(ctx, q1.view, v1));
    ASSERT_NO_FATAL_FAILURE(quantize(v1, &q2));
    const Tensor v2 = NanTensor(dtype, {n, cols});
    ASSERT_OK(ops::Fp8Dequantize(ctx, q2.view, v2));
    EXPECT_TRUE(BitIdentical(v2, v1));

    // Block by block: the same bits and scale, or every value doubled and the scale halved.
    const int64_t padded_cols = q1.view.data.dim(1), padded_rows = q1.view.scale_inv.dim(1);
    int doubled = 0;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float s1 = q1.view.scale_inv.data<float>()[b * padded_rows + r];
        const float s2 = q2.view.scale_inv.data<float>()[b * padded_rows + r];
        const bool same = s1 == s2;
        EXPECT_TRUE(same || s2 == s1 / 2) << "row " << r << " block " << b;
        doubled += same ? 0 : 1;
        for (int64_t c = b * 128; c < std::min(cols, (b + 1) * 128); ++c) {
          const float a =
              Fp8ToFloat(q1.view.data.data<uint8_t>()[r * padded_cols + c], Fp8Format::kE4M3);
          const float z =
              Fp8ToFloat(q2.view.data.data<uint8_t>()[r * padded_cols + c], Fp8Format::kE4M3);
          ASSERT_EQ(z, same ? a : 2 * a) << "row " << r << " column " << c;
        }
      }
    }
    EXPECT_GE(doubled, 1);  // the planted case
  }
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments: each is refused before any collective, so one rank alone sees the error.

TEST(ExpertDispatcherErrorsTest, RefusesBadPlansAndExchanges) {
  TempDir dir;
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
  expect_invalid(Dispatch({.handle = &h, .rows = rows, .received = received, .fp8 = true}),
                 "fp8 needs the rows' ExecContext");
  expect_invalid(Combine({.handle = &h, .rows = received, .out = short_rows}), "combine out");
  const Tensor long_received = Tensor::Zeros(DType::kF32, {h.num_received_rows() + 1, 4});
  expect_invalid(Combine({.handle = &h, .rows = long_received, .out = rows}), "combine rows");
}

}  // namespace
}  // namespace moetrain::moe_test
