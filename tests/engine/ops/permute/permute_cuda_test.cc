// The permutation ops on a GPU against the CPU backend, on fresh random inputs: BuildPermutation
// (dropless, capacity with both drop policies, an expert order; maps and offsets identical),
// GatherRows (identical bytes, vector and scalar paths, and a gather past 2^31 elements),
// CombineRows, CombineRowsBackward and SumPairRows (f32 and bf16, within the tolerances below),
// edges included: an expert with no tokens, one token, k = E, an expert holding every token. Each
// CUDA result is also bit-identical from run to run. Skips, naming why, where there is no GPU;
// NeedsWeightRankingTest (host logic) runs everywhere.
#include "engine/ops/permute/permute_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/device_query.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/permute/permute.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using test_util::MakeTensor;
using test_util::SameBytes;
using test_util::ToDevice;
using test_util::ToDoubles;
using test_util::ToHost;

ExecContext Cpu() { return ExecContext::Cpu(); }

std::vector<float> Uniform(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// --- BuildPermutation ---------------------------------------------------------------------------

struct Case {
  std::string name;
  int64_t tokens, top_k, num_experts;
  int64_t used_experts;  // the pairs go to experts [0, used): the rest get none
  float capacity_factor = 0.0f;
  DropPolicy policy = DropPolicy::kProbability;
  bool with_order = false;
  bool tied_weights = false;  // weights from {0.25, 0.5}: kProbability breaks many ties
};

struct Routing {
  MoeConfig config;
  Tensor experts;                // (T, k) i32, distinct per token
  Tensor weights;                // (T, k) f32
  Tensor order;                  // (E) i32 or empty
  std::vector<int64_t> offsets;  // (E + 1), planned as the MoE layer plans them
};

Routing MakeRouting(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Routing r;
  r.config.num_experts = c.num_experts;
  r.config.top_k = c.top_k;
  r.config.capacity_factor = c.capacity_factor;
  r.config.drop_policy = c.policy;
  r.experts = Tensor::Empty(DType::kI32, {c.tokens, c.top_k});
  std::vector<int32_t> used(c.used_experts);
  std::iota(used.begin(), used.end(), 0);
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::shuffle(used.begin(), used.end(), rng);
    for (int64_t j = 0; j < c.top_k; ++j) r.experts.data<int32_t>()[t * c.top_k + j] = used[j];
  }
  std::vector<float> w = Uniform(c.tokens * c.top_k, 0.0f, 1.0f, rng);
  if (c.tied_weights) {
    for (float& x : w) x = x < 0.5f ? 0.25f : 0.5f;
  }
  r.weights = MakeTensor(DType::kF32, {c.tokens, c.top_k}, w);
  std::vector<int64_t> counts(c.num_experts, 0);
  if (c.with_order) {
    std::vector<int32_t> order(c.num_experts);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    r.order = Tensor::Empty(DType::kI32, {c.num_experts});
    std::copy(order.begin(), order.end(), r.order.data<int32_t>());
  }
  for (int64_t p = 0; p < c.tokens * c.top_k; ++p) {
    const int32_t e = r.experts.data<int32_t>()[p];
    ++counts[c.with_order ? r.order.data<int32_t>()[e] : e];
  }
  r.offsets = ops::PermutedExpertOffsets(r.config, c.tokens, counts);
  return r;
}

// The op on `ctx`, from host inputs; the three outputs as host tensors.
struct Built {
  absl::Status status;
  Tensor expert_offsets, row_token, pair_row;
};

Built Build(const ExecContext& ctx, const Routing& r, const TensorView& experts,
            std::vector<int64_t> offsets) {
  const bool cpu = ctx.device().is_cpu();
  Tensor d_experts, d_weights, d_order;
  if (!cpu) {
    d_experts = ToDevice(ctx, experts);
    d_weights = ToDevice(ctx, r.weights);
    if (!r.order.empty()) d_order = ToDevice(ctx, r.order);
  }
  ops::Permutation perm;
  Built built;
  built.status =
      ops::BuildPermutation(ctx, r.config,
                            {.topk_experts = cpu ? experts : TensorView(d_experts),
                             .topk_weights = cpu ? TensorView(r.weights) : TensorView(d_weights),
                             .expert_offsets = offsets,
                             .expert_order = cpu ? TensorView(r.order) : TensorView(d_order)},
                            &perm);
  if (!built.status.ok()) return built;
  built.expert_offsets = ToHost(ctx, perm.expert_offsets);
  if (perm.row_token.numel() > 0) built.row_token = ToHost(ctx, perm.row_token);
  built.pair_row = ToHost(ctx, perm.pair_row);
  return built;
}

class BuildPermutationCudaTest : public ::testing::TestWithParam<Case> {};

TEST_P(BuildPermutationCudaTest, SameMapsAsTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const Case& c = GetParam();
  const Routing r = MakeRouting(c, 101);
  const Built want = Build(Cpu(), r, r.experts, r.offsets);
  ASSERT_OK(want.status);
  const Built got = Build(gpu, r, r.experts, r.offsets);
  ASSERT_OK(got.status);
  EXPECT_TRUE(SameBytes(got.expert_offsets, want.expert_offsets));
  EXPECT_TRUE(SameBytes(got.pair_row, want.pair_row));
  if (!want.row_token.empty()) {
    EXPECT_TRUE(SameBytes(got.row_token, want.row_token));
  }
  const Built again = Build(gpu, r, r.experts, r.offsets);
  ASSERT_OK(again.status);
  EXPECT_TRUE(SameBytes(again.pair_row, got.pair_row));
  if (!want.row_token.empty()) {
    EXPECT_TRUE(SameBytes(again.row_token, got.row_token));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BuildPermutationCudaTest,
    ::testing::Values(
        Case{"Dropless_IdleExperts", 37, 2, 8, 6}, Case{"OneToken", 1, 2, 8, 8},
        Case{"KEqualsE", 33, 4, 4, 4}, Case{"OneExpertHoldsEveryToken", 50, 1, 8, 1},
        Case{"ManyChunks", 3000, 8, 64, 60},  // 24000 pairs: 47 chunks of the rank block
        Case{"CapacityByPosition", 100, 2, 8, 8, 1.0f, DropPolicy::kPosition},
        Case{"CapacityByPosition_Order", 100, 2, 8, 8, 0.75f, DropPolicy::kPosition, true},
        Case{"CapacityByProbability", 100, 2, 8, 8, 1.0f, DropPolicy::kProbability},
        Case{"CapacityByProbability_Ties", 100, 2, 8, 8, 0.5f, DropPolicy::kProbability, false,
             true},
        Case{"CapacityByProbability_Order", 100, 2, 8, 5, 1.0f, DropPolicy::kProbability, true},
        Case{"CapacityThatDropsNothing", 40, 2, 8, 8, 8.0f, DropPolicy::kProbability},
        Case{"Dropless_Order", 29, 2, 6, 6, 0.0f, DropPolicy::kProbability, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The GPU refuses what the CPU refuses, with the same message.
TEST(BuildPermutationCudaErrorTest, SameErrorsAsTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (const bool capacity : {false, true}) {
    Case c{"", 37, 2, 8, 7};
    if (capacity) {
      c.capacity_factor = 1.0f;
      c.policy = DropPolicy::kPosition;
    }
    const Routing r = MakeRouting(c, 202);
    // Offsets that move one row from the first used expert to an idle one.
    std::vector<int64_t> shifted = r.offsets;
    for (int64_t e = 1; e < c.num_experts; ++e) shifted[e] -= 1;
    const Built want = Build(Cpu(), r, r.experts, shifted);
    const Built got = Build(gpu, r, r.experts, shifted);
    ASSERT_FALSE(want.status.ok());
    EXPECT_EQ(got.status, want.status);
  }
  {
    const Routing r = MakeRouting(Case{"", 9, 2, 8, 8}, 203);
    Tensor bad = Tensor::Empty(DType::kI32, {9, 2});
    std::copy_n(r.experts.data<int32_t>(), 18, bad.data<int32_t>());
    bad.data<int32_t>()[7] = 8;
    bad.data<int32_t>()[11] = -1;
    const Built want = Build(Cpu(), r, bad, r.offsets);
    const Built got = Build(gpu, r, bad, r.offsets);
    ASSERT_FALSE(want.status.ok());
    EXPECT_EQ(got.status, want.status);
  }
  {
    Routing r = MakeRouting(Case{"", 9, 2, 6, 6, 0.0f, DropPolicy::kProbability, true}, 204);
    r.order.data<int32_t>()[4] = r.order.data<int32_t>()[1];  // a repeated position
    const Built want = Build(Cpu(), r, r.experts, r.offsets);
    const Built got = Build(gpu, r, r.experts, r.offsets);
    ASSERT_FALSE(want.status.ok());
    EXPECT_EQ(got.status, want.status);
  }
}

// Host logic, run everywhere: when the device must fall back to ranking pairs by weight.
TEST(NeedsWeightRankingTest, OnlyProbabilityCapacityWithAFullExpert) {
  MoeConfig config;
  config.num_experts = 4;
  config.top_k = 2;
  // 10 tokens, 20 pairs: capacity ⌈cf·20/4⌉ = 5 at cf = 1.
  const std::vector<int64_t> full = {0, 5, 9, 12, 12};   // position 0 at capacity
  const std::vector<int64_t> roomy = {0, 4, 8, 12, 12};  // none at capacity
  const std::vector<int64_t> dropless = {0, 8, 12, 20, 20};
  EXPECT_FALSE(ops::cuda::NeedsWeightRanking(config, 10, dropless));  // dropless
  config.capacity_factor = 1.0f;
  config.drop_policy = DropPolicy::kPosition;
  EXPECT_FALSE(ops::cuda::NeedsWeightRanking(config, 10, full));
  config.drop_policy = DropPolicy::kProbability;
  EXPECT_TRUE(ops::cuda::NeedsWeightRanking(config, 10, full));
  EXPECT_FALSE(ops::cuda::NeedsWeightRanking(config, 10, roomy));
  EXPECT_TRUE(ops::cuda::NeedsWeightRanking(config, 10, std::vector<int64_t>{0, 0, 0, 0, 5}));
  EXPECT_FALSE(ops::cuda::NeedsWeightRanking(config, 0, std::vector<int64_t>{0, 0, 0, 0, 0}));
}

// --- GatherRows ---------------------------------------------------------------------------------

struct GatherCase {
  DType dtype;
  int64_t tokens, rows, cols;
};

class GatherRowsCudaTest : public ::testing::TestWithParam<GatherCase> {};

TEST_P(GatherRowsCudaTest, SameBytesAsTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const GatherCase& c = GetParam();
  std::mt19937 rng(301);
  const Tensor src =
      MakeTensor(c.dtype, {c.tokens, c.cols}, Uniform(c.tokens * c.cols, -2, 2, rng));
  Tensor index = Tensor::Empty(DType::kI32, {c.rows});
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.tokens - 1));
  for (int64_t r = 0; r < c.rows; ++r) index.data<int32_t>()[r] = pick(rng);
  Tensor want = Tensor::Empty(c.dtype, {c.rows, c.cols});
  ASSERT_OK(ops::GatherRows(Cpu(), src, index, want));

  const Tensor d_src = ToDevice(gpu, src), d_index = ToDevice(gpu, index);
  const Tensor d_dst = ToDevice(gpu, Tensor::Zeros(c.dtype, {c.rows, c.cols}));
  ASSERT_OK(ops::GatherRows(gpu, d_src, d_index, d_dst));
  EXPECT_TRUE(SameBytes(ToHost(gpu, d_dst), want));
}

// Vector path: rows of a multiple of 16 bytes; scalar path otherwise.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GatherRowsCudaTest,
    ::testing::Values(GatherCase{DType::kF32, 7, 20, 5}, GatherCase{DType::kBF16, 7, 20, 5},
                      GatherCase{DType::kF32, 13, 40, 64}, GatherCase{DType::kBF16, 13, 40, 64},
                      GatherCase{DType::kBF16, 13, 40, 12},  // 24 B rows
                      GatherCase{DType::kF32, 1, 3, 130}, GatherCase{DType::kBF16, 50, 333, 1000}));

// A gathered batch of more than 2^31 elements (bf16, 4.3 GB): rows past the 2^31-element mark
// hold their source rows. Rows of 4100 bf16 (8200 bytes, not a multiple of 16) take the
// element-wise path, whose element index itself passes 2^31, so 32-bit index math would fail
// here. Needs ~4.3 GB free on the GPU.
TEST(GatherRowsCudaLargeTest, PastTwoToTheThirtyOneElements) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  constexpr int64_t kCols = 4100, kTokens = 256;
  constexpr int64_t kMark = (int64_t{1} << 31) / kCols;  // the row holding element 2^31
  constexpr int64_t kRows = kMark + 64;
  const DeviceReport report = QueryDevices();
  if (report.gpus.empty() || report.gpus[0].memory_bytes < (int64_t{16} << 30)) {
    GTEST_SKIP() << "needs a GPU with 16 GiB";
  }
  absl::StatusOr<Tensor> dst = Tensor::Allocate(gpu.allocator(), DType::kBF16, {kRows, kCols});
  if (!dst.ok()) GTEST_SKIP() << "no room for the 4.3 GB batch: " << dst.status();
  std::mt19937 rng(302);
  const Tensor src =
      MakeTensor(DType::kBF16, {kTokens, kCols}, Uniform(kTokens * kCols, -2, 2, rng));
  Tensor index = Tensor::Empty(DType::kI32, {kRows});
  std::uniform_int_distribution<int32_t> pick(0, kTokens - 1);
  for (int64_t r = 0; r < kRows; ++r) index.data<int32_t>()[r] = pick(rng);
  const Tensor d_src = ToDevice(gpu, src), d_index = ToDevice(gpu, index);
  ASSERT_OK(ops::GatherRows(gpu, d_src, d_index, *dst));
  std::vector<int64_t> sample = {0, 1, kMark / 2, kMark - 1, kMark, kMark + 1, kRows - 1};
  std::uniform_int_distribution<int64_t> any(0, kRows - 1);
  for (int i = 0; i < 8; ++i) sample.push_back(any(rng));
  for (const int64_t r : sample) {
    const Tensor row = ToHost(gpu, dst->view().Slice(r, r + 1));
    const TensorView want =
        src.view().Slice(index.data<int32_t>()[r], index.data<int32_t>()[r] + 1);
    EXPECT_EQ(std::memcmp(row.view().raw(), want.raw(), kCols * 2), 0) << "row " << r;
  }
}

// --- CombineRows, CombineRowsBackward, SumPairRows ----------------------------------------------
//
// Tolerance: both backends sum in the same order with the same operations (permute_math.h); the
// GPU fuses each w·y + acc into an FMA, as do the CPU's x86-64-v3/v4 clones, so the results are
// expected to be bit-identical there. The CPU's default clone rounds the product separately,
// which the tolerance covers: f32 1e-5 × Σ|terms|; bf16 outputs one bf16 ulp (2^-7 relative)
// more, for an f32 sum that lands on the other side of a rounding tie.

// The layout of a real permutation (capacity drops included), with f32 rows.
struct Combine {
  int64_t tokens, k, rows, d;
  Tensor pair_row;  // (T, k) i32
  Tensor weights;   // (T, k) f32
};

Combine MakeCombine(const Case& c, int64_t d, uint32_t seed) {
  const Routing r = MakeRouting(c, seed);
  const Built built = Build(Cpu(), r, r.experts, r.offsets);
  EXPECT_TRUE(built.status.ok()) << built.status;
  return Combine{c.tokens,
                 c.top_k,
                 r.offsets.back(),
                 d,
                 ToHost(Cpu(), built.pair_row),
                 ToHost(Cpu(), r.weights)};
}

void ExpectClose(const TensorView& got, const TensorView& want, double scale,
                 const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = ToDoubles(got), w = ToDoubles(want);
  const double bf16 = got.dtype() == DType::kBF16 ? 1.0 / 128 : 0.0;
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = 1e-5 * scale + bf16 * std::abs(w[i]);
    if (!(std::abs(g[i] - w[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " vs " << w[i];
    }
  }
}

struct CombineCase {
  Case routing;
  int64_t d;
};

std::string CombineName(const ::testing::TestParamInfo<CombineCase>& info) {
  return info.param.routing.name + "_D" + std::to_string(info.param.d);
}

class CombineCudaTest : public ::testing::TestWithParam<CombineCase> {};

TEST_P(CombineCudaTest, CombineRowsMatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const Combine c = MakeCombine(GetParam().routing, GetParam().d, 401);
  std::mt19937 rng(402);
  const Tensor rows = MakeTensor(DType::kF32, {c.rows, c.d}, Uniform(c.rows * c.d, -1, 1, rng));
  const Tensor extra =
      MakeTensor(DType::kF32, {c.tokens, c.d}, Uniform(c.tokens * c.d, -1, 1, rng));
  const Tensor d_rows = ToDevice(gpu, rows), d_pair_row = ToDevice(gpu, c.pair_row);
  const Tensor d_weights = ToDevice(gpu, c.weights), d_extra = ToDevice(gpu, extra);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const bool with_extra : {false, true}) {
      const std::string what =
          std::string(with_extra ? "extra " : "") + std::string(DTypeName(dtype));
      Tensor want = Tensor::Empty(dtype, {c.tokens, c.d});
      ASSERT_OK(ops::CombineRows(Cpu(), rows, c.pair_row, c.weights,
                                 with_extra ? TensorView(extra) : TensorView(), want));
      const Tensor out = ToDevice(gpu, Tensor::Zeros(dtype, {c.tokens, c.d}));
      ASSERT_OK(ops::CombineRows(gpu, d_rows, d_pair_row, d_weights,
                                 with_extra ? TensorView(d_extra) : TensorView(), out));
      const Tensor got = ToHost(gpu, out);
      ExpectClose(got, want, c.k + 1.0, what);
      ASSERT_OK(ops::CombineRows(gpu, d_rows, d_pair_row, d_weights,
                                 with_extra ? TensorView(d_extra) : TensorView(), out));
      EXPECT_TRUE(SameBytes(ToHost(gpu, out), got)) << what << ": run to run";
    }
  }
}

TEST_P(CombineCudaTest, CombineRowsBackwardMatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const Combine c = MakeCombine(GetParam().routing, GetParam().d, 411);
  std::mt19937 rng(412);
  const Tensor rows = MakeTensor(DType::kF32, {c.rows, c.d}, Uniform(c.rows * c.d, -1, 1, rng));
  const Tensor d_rows_in = ToDevice(gpu, rows), d_pair_row = ToDevice(gpu, c.pair_row);
  const Tensor d_weights_in = ToDevice(gpu, c.weights);
  // d_out and d_rows in each pair of dtypes: the op's contract lets them differ.
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kF32, DType::kBF16},
                                            {DType::kBF16, DType::kF32}};
  for (const auto& [dtype, rows_dtype] : dtypes) {
    const std::string what =
        std::string(DTypeName(dtype)) + " → " + std::string(DTypeName(rows_dtype));
    const Tensor d_out = MakeTensor(dtype, {c.tokens, c.d}, Uniform(c.tokens * c.d, -1, 1, rng));
    Tensor want_rows = Tensor::Zeros(rows_dtype, {c.rows, c.d});
    Tensor want_weights = Tensor::Empty(DType::kF32, {c.tokens, c.k});
    ASSERT_OK(ops::CombineRowsBackward(Cpu(), d_out, rows, c.pair_row, c.weights, want_rows,
                                       want_weights));
    const Tensor g = ToDevice(gpu, d_out);
    const Tensor got_rows_d = ToDevice(gpu, Tensor::Zeros(rows_dtype, {c.rows, c.d}));
    // NaN first: every d_weights element must be written (dropped pairs get 0).
    const Tensor got_weights_d = ToDevice(
        gpu, MakeTensor(DType::kF32, {c.tokens, c.k}, std::vector<float>(c.tokens * c.k, NAN)));
    ASSERT_OK(ops::CombineRowsBackward(gpu, g, d_rows_in, d_pair_row, d_weights_in, got_rows_d,
                                       got_weights_d));
    const Tensor got_rows = ToHost(gpu, got_rows_d), got_weights = ToHost(gpu, got_weights_d);
    // d_rows = w·g is one rounded product on both backends: the same bits.
    EXPECT_TRUE(SameBytes(got_rows, want_rows)) << what;
    // Each dot sums d products of magnitude ≤ 1.
    ExpectClose(got_weights, want_weights, static_cast<double>(c.d), what + " d_weights");
    for (int64_t p = 0; p < c.tokens * c.k; ++p) {
      if (c.pair_row.data<int32_t>()[p] < 0) {
        EXPECT_EQ(got_weights.data<float>()[p], 0.0f) << what << " dropped pair " << p;
      }
    }
    ASSERT_OK(ops::CombineRowsBackward(gpu, g, d_rows_in, d_pair_row, d_weights_in, got_rows_d,
                                       got_weights_d));
    EXPECT_TRUE(SameBytes(ToHost(gpu, got_rows_d), got_rows)) << what << ": run to run";
    EXPECT_TRUE(SameBytes(ToHost(gpu, got_weights_d), got_weights)) << what << ": run to run";
  }
}

TEST_P(CombineCudaTest, SumPairRowsMatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const Combine c = MakeCombine(GetParam().routing, GetParam().d, 421);
  std::mt19937 rng(422);
  const Tensor rows = MakeTensor(DType::kF32, {c.rows, c.d}, Uniform(c.rows * c.d, -1, 1, rng));
  std::vector<Tensor> addends, d_addends;
  for (int a = 0; a < 2; ++a) {
    addends.push_back(
        MakeTensor(DType::kF32, {c.tokens, c.d}, Uniform(c.tokens * c.d, -1, 1, rng)));
    d_addends.push_back(ToDevice(gpu, addends.back()));
  }
  const Tensor d_rows = ToDevice(gpu, rows), d_pair_row = ToDevice(gpu, c.pair_row);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (size_t count = 0; count <= 2; ++count) {
      const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(count);
      std::vector<TensorView> host_views(addends.begin(), addends.begin() + count);
      std::vector<TensorView> device_views(d_addends.begin(), d_addends.begin() + count);
      Tensor want = Tensor::Empty(dtype, {c.tokens, c.d});
      ASSERT_OK(ops::SumPairRows(Cpu(), rows, c.pair_row, host_views, want));
      const Tensor out = ToDevice(gpu, Tensor::Zeros(dtype, {c.tokens, c.d}));
      ASSERT_OK(ops::SumPairRows(gpu, d_rows, d_pair_row, device_views, out));
      const Tensor got = ToHost(gpu, out);
      ExpectClose(got, want, c.k + 2.0, what);
      ASSERT_OK(ops::SumPairRows(gpu, d_rows, d_pair_row, device_views, out));
      EXPECT_TRUE(SameBytes(ToHost(gpu, out), got)) << what << ": run to run";
    }
  }
}

// D = 5 and 130: no vector-friendly width, and a tail past the 16 dot lanes; 64: whole lanes.
INSTANTIATE_TEST_SUITE_P(
    Layouts, CombineCudaTest,
    ::testing::Values(
        CombineCase{Case{"Dropless_IdleExperts", 37, 2, 8, 6}, 5},
        CombineCase{Case{"Dropless_IdleExperts", 37, 2, 8, 6}, 64},
        CombineCase{Case{"OneToken", 1, 2, 8, 8}, 130},
        CombineCase{Case{"KEqualsE", 33, 4, 4, 4}, 130},
        CombineCase{Case{"OneExpertHoldsEveryToken", 50, 1, 8, 1}, 64},
        CombineCase{Case{"ManySlots", 40, 20, 32, 32}, 33},
        CombineCase{Case{"CapacityByPosition", 100, 2, 8, 8, 0.5f, DropPolicy::kPosition}, 130},
        CombineCase{Case{"CapacityByProbability", 100, 2, 8, 8, 1.0f, DropPolicy::kProbability},
                    64}),
    CombineName);

}  // namespace
}  // namespace moetrain
