// SplitTokens, EmbeddingForward and EmbeddingBackward on CUDA against the CPU backend, on fresh
// random inputs (the seed is printed with any failure). Tolerance: none. The splits and the
// gather move bits; the backward adds each row's gradients in position order from d_table's
// value, as the CPU does, with plain f32 adds (no multiply to fuse), so it must give the CPU's
// bits too. Errors: the CPU's message exactly, outputs untouched. Every result repeats bit for bit.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/embedding/embedding.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

std::vector<int32_t> RandomIds(int64_t n, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

Tensor FilledI32(std::vector<int64_t> shape, int32_t value) {
  Tensor t = Tensor::Empty(DType::kI32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = value;
  return t;
}

TEST(EmbeddingCudaTest, SplitTokensMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  // (B, S, V): the smallest window, one id, uneven shapes, a long batch.
  const int64_t cases[][3] = {{1, 1, 1}, {1, 1, 7}, {3, 17, 50}, {8, 513, 32000}, {64, 129, 5}};
  for (const auto& c : cases) {
    const int64_t b = c[0], s = c[1], v = c[2];
    SCOPED_TRACE(::testing::Message() << "B=" << b << " S=" << s << " V=" << v);
    const Tensor windows = MakeI32({b, s + 1}, RandomIds(b * (s + 1), v, rng));
    Tensor want_in = FilledI32({b * s}, -7), want_tg = FilledI32({b * s}, -7);
    ASSERT_OK(ops::SplitTokens(Cpu(), windows, v, want_in, want_tg));
    const Tensor windows_gpu = test_util::ToDevice(gpu, windows);
    for (int run = 0; run < 2; ++run) {
      const Tensor in_gpu = test_util::ToDevice(gpu, FilledI32({b * s}, -7));
      const Tensor tg_gpu = test_util::ToDevice(gpu, FilledI32({b * s}, -7));
      ASSERT_OK(ops::SplitTokens(gpu, windows_gpu, v, in_gpu, tg_gpu));
      EXPECT_TRUE(test_util::SameBytes(want_in, test_util::ToHost(gpu, in_gpu))) << "run " << run;
      EXPECT_TRUE(test_util::SameBytes(want_tg, test_util::ToHost(gpu, tg_gpu))) << "run " << run;
    }
  }
}

// Multi-token prediction reads windows of S + 1 + D tokens from column k on.
TEST(EmbeddingCudaTest, SplitTokensFromAnOffsetMatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const int64_t b = 3, s = 17, extra = 2, v = 50;
  const Tensor windows = MakeI32({b, s + 1 + extra}, RandomIds(b * (s + 1 + extra), v, rng));
  const Tensor windows_gpu = test_util::ToDevice(gpu, windows);
  for (int64_t offset = 0; offset <= extra; ++offset) {
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    Tensor want_in = FilledI32({b * s}, -7), want_tg = FilledI32({b * s}, -7);
    ASSERT_OK(ops::SplitTokens(Cpu(), windows, v, offset, want_in, want_tg));
    const Tensor in_gpu = test_util::ToDevice(gpu, FilledI32({b * s}, -7));
    const Tensor tg_gpu = test_util::ToDevice(gpu, FilledI32({b * s}, -7));
    ASSERT_OK(ops::SplitTokens(gpu, windows_gpu, v, offset, in_gpu, tg_gpu));
    EXPECT_TRUE(test_util::SameBytes(want_in, test_util::ToHost(gpu, in_gpu)));
    EXPECT_TRUE(test_util::SameBytes(want_tg, test_util::ToHost(gpu, tg_gpu)));
  }
}

TEST(EmbeddingCudaTest, SplitTokensNamesTheFirstBadIdLikeTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const int64_t b = 6, s = 300, v = 1000;
  // Bad ids planted at flat positions: the first in row-major order must be named, whichever
  // of them a thread finds first.
  const std::vector<std::vector<std::pair<int64_t, int32_t>>> plants = {
      {{0, -1}},
      {{b * (s + 1) - 1, 1000}},
      {{5 * (s + 1) + 7, 123456}, {2 * (s + 1) + 300, -5}, {4 * (s + 1), 1000}},
      {{301, 1000}, {302, -2147483647 - 1}}};
  for (const auto& plant : plants) {
    std::vector<int32_t> ids = RandomIds(b * (s + 1), v, rng);
    for (const auto& [at, id] : plant) ids[at] = id;
    const Tensor windows = MakeI32({b, s + 1}, ids);
    Tensor in = FilledI32({b * s}, -7), tg = FilledI32({b * s}, -7);
    const absl::Status want = ops::SplitTokens(Cpu(), windows, v, in, tg);
    ASSERT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
    const Tensor in_gpu = test_util::ToDevice(gpu, in), tg_gpu = test_util::ToDevice(gpu, tg);
    const absl::Status got =
        ops::SplitTokens(gpu, test_util::ToDevice(gpu, windows), v, in_gpu, tg_gpu);
    EXPECT_EQ(got, want);
    EXPECT_TRUE(test_util::SameBytes(in, test_util::ToHost(gpu, in_gpu))) << "inputs written";
    EXPECT_TRUE(test_util::SameBytes(tg, test_util::ToHost(gpu, tg_gpu))) << "targets written";
  }
}

TEST(EmbeddingCudaTest, ForwardMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  // (V, D, T): one of each, rows of 7 (no 16-byte vectors), of 64 (vectors), a wide table.
  const int64_t cases[][3] = {{1, 1, 1}, {1, 8, 100}, {13, 7, 10}, {500, 64, 3000}, {37, 2049, 40}};
  for (const auto& c : cases) {
    const int64_t v = c[0], d = c[1], t = c[2];
    SCOPED_TRACE(::testing::Message() << "V=" << v << " D=" << d << " T=" << t);
    std::vector<float> values = Uniform(v * d, -2.0f, 2.0f, rng);
    const Tensor table = MakeAct(DType::kF32, {v, d}, values);
    const Tensor tokens = MakeI32({t}, RandomIds(t, v, rng));
    Tensor want = NaNAct(DType::kF32, {t, d});
    ASSERT_OK(ops::EmbeddingForward(Cpu(), table, tokens, want));
    const Tensor table_gpu = test_util::ToDevice(gpu, table);
    const Tensor tokens_gpu = test_util::ToDevice(gpu, tokens);
    for (int run = 0; run < 2; ++run) {
      const Tensor out_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {t, d}));
      ASSERT_OK(ops::EmbeddingForward(gpu, table_gpu, tokens_gpu, out_gpu));
      EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, out_gpu))) << "run " << run;
    }
  }
}

TEST(EmbeddingCudaTest, ForwardNamesTheFirstBadIdLikeTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const int64_t v = 5, d = 4;
  const Tensor table = Tensor::Zeros(DType::kF32, {v, d});
  for (const std::vector<int32_t>& ids : std::vector<std::vector<int32_t>>{
           {1, -1, 2}, {1, 2, 5}, {7, 0, -3}, {0, 1, 2, 3, 4, 4, 3, 2, 1, 99, -1}}) {
    const int64_t t = static_cast<int64_t>(ids.size());
    const Tensor tokens = MakeI32({t}, ids);
    Tensor out = NaNAct(DType::kF32, {t, d});
    const absl::Status want = ops::EmbeddingForward(Cpu(), table, tokens, out);
    ASSERT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
    const Tensor out_gpu = test_util::ToDevice(gpu, out);
    EXPECT_EQ(ops::EmbeddingForward(gpu, test_util::ToDevice(gpu, table),
                                    test_util::ToDevice(gpu, tokens), out_gpu),
              want);
    EXPECT_TRUE(test_util::SameBytes(out, test_util::ToHost(gpu, out_gpu))) << "out written";
  }
}

// d_table starts from random values (the backward accumulates), and must come out with the
// CPU's bits.
void ExpectBackwardMatches(const ExecContext& gpu, int64_t v, int64_t d,
                           const std::vector<int32_t>& ids, std::mt19937& rng) {
  const int64_t t = static_cast<int64_t>(ids.size());
  SCOPED_TRACE(::testing::Message() << "V=" << v << " D=" << d << " T=" << t);
  std::vector<float> d_out_values = Uniform(t * d, -1.0f, 1.0f, rng);
  std::vector<float> start_values = Uniform(v * d, -1.0f, 1.0f, rng);
  const Tensor tokens = MakeI32({t}, ids);
  const Tensor d_out = MakeAct(DType::kF32, {t, d}, d_out_values);
  const Tensor start = MakeAct(DType::kF32, {v, d}, start_values);
  const Tensor want = MakeAct(DType::kF32, {v, d}, start_values);
  ASSERT_OK(ops::EmbeddingBackward(Cpu(), tokens, d_out, want));
  const Tensor tokens_gpu = test_util::ToDevice(gpu, tokens);
  const Tensor d_out_gpu = test_util::ToDevice(gpu, d_out);
  for (int run = 0; run < 2; ++run) {
    const Tensor d_table_gpu = test_util::ToDevice(gpu, start);
    ASSERT_OK(ops::EmbeddingBackward(gpu, tokens_gpu, d_out_gpu, d_table_gpu));
    const Tensor got = test_util::ToHost(gpu, d_table_gpu);
    if (!test_util::SameBytes(want, got)) {
      for (int64_t i = 0; i < v * d; ++i) {
        ASSERT_EQ(want.data<float>()[i], got.data<float>()[i])
            << "run " << run << ", row " << i / d << ", column " << i % d;
      }
      ADD_FAILURE() << "the bytes differ but no value does (a NaN or a signed zero)";
    }
  }
}

TEST(EmbeddingCudaTest, BackwardGivesTheCpuBitsAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  // Random ids with repeats, narrow and wide rows (D past one column block of 256 threads).
  ExpectBackwardMatches(gpu, 13, 20, RandomIds(200, 13, rng), rng);
  ExpectBackwardMatches(gpu, 1000, 300, RandomIds(4096, 1000, rng), rng);
  ExpectBackwardMatches(gpu, 32000, 64, RandomIds(8192, 32000, rng), rng);
  // Every token the same id: one long run, summed in position order.
  ExpectBackwardMatches(gpu, 50, 513, std::vector<int32_t>(5000, 17), rng);
  // V = 1: every token is id 0.
  ExpectBackwardMatches(gpu, 1, 40, std::vector<int32_t>(777, 0), rng);
  ExpectBackwardMatches(gpu, 1, 1, std::vector<int32_t>(1, 0), rng);
  // Every id once, in a shuffled order (runs of one), and the edges 0 and V − 1 repeated.
  std::vector<int32_t> once(777);
  std::iota(once.begin(), once.end(), 0);
  std::shuffle(once.begin(), once.end(), rng);
  ExpectBackwardMatches(gpu, 777, 33, once, rng);
  std::vector<int32_t> edges = RandomIds(600, 2049, rng);
  for (size_t i = 0; i < edges.size(); i += 3) edges[i] = (i % 2 == 0) ? 0 : 2048;
  ExpectBackwardMatches(gpu, 2049, 128, edges, rng);
}

}  // namespace
}  // namespace moetrain::ops_test
