// BuildPermutation and ExpertCapacity: every kept (token, slot) pair gets exactly one row, rows
// grouped by expert and stable in (token, slot) order, the two maps inverse to each other, and
// capacity dropping exactly the pairs its policy names.
#include "engine/ops/permute/permute.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

// The permutation as the host reads it: the op's tensors, its offsets as numbers, and the rows
// it kept (R) and dropped.
struct Permutation {
  ops::Permutation built;
  std::vector<int64_t> expert_offsets;  // (E + 1)
  int64_t num_rows = 0;                 // R
  int64_t dropped = 0;
  TensorView row_token;  // (R) i32
  TensorView pair_row;   // (T, k) i32
};

// The pairs per expert (or per place in `expert_order`) of a valid (T, k) routing.
std::vector<int64_t> CountsOf(const MoeConfig& config, TensorView experts,
                              TensorView expert_order) {
  std::vector<int64_t> counts(config.num_experts, 0);
  for (int64_t i = 0; i < experts.numel(); ++i) {
    const int32_t e = experts.data<int32_t>()[i];
    if (e < 0 || e >= config.num_experts) continue;  // the op refuses these
    ++counts[expert_order.empty() ? e : expert_order.data<int32_t>()[e]];
  }
  return counts;
}

// BuildPermutation as the MoE layer calls it: with the offsets the host plans from the counts.
absl::Status BuildPermutation(const MoeConfig& config, TensorView experts, TensorView weights,
                              Permutation* out, TensorView expert_order = TensorView()) {
  const int64_t tokens = experts.rank() == 2 ? experts.dim(0) : 0;
  const std::vector<int64_t> planned =
      ops::PermutedExpertOffsets(config, tokens, CountsOf(config, experts, expert_order));
  MOETRAIN_RETURN_IF_ERROR(ops::BuildPermutation(ExecContext::Cpu(), config,
                                                 {.topk_experts = experts,
                                                  .topk_weights = weights,
                                                  .expert_offsets = planned,
                                                  .expert_order = expert_order},
                                                 &out->built));
  const int64_t* offsets = out->built.expert_offsets.data<int64_t>();
  out->expert_offsets.assign(offsets, offsets + config.num_experts + 1);
  out->num_rows = out->expert_offsets.back();
  out->dropped = experts.numel() - out->num_rows;
  out->row_token = out->built.row_token;
  out->pair_row = out->built.pair_row;
  return absl::OkStatus();
}

struct Routing {
  int64_t tokens = 0;
  int64_t top_k = 0;
  Tensor experts;  // (T, k) i32
  Tensor weights;  // (T, k) f32
};

// Each token picks k distinct experts among the first `used_experts` (the rest get no token),
// with distinct random weights in (0, 1).
Routing RandomRouting(int64_t tokens, int64_t top_k, int64_t used_experts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  r.experts = Tensor::Empty(DType::kI32, {tokens, top_k});
  r.weights = Tensor::Empty(DType::kF32, {tokens, top_k});
  std::vector<int32_t> pool(used_experts);
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < top_k; ++j) {
      r.experts.data<int32_t>()[t * top_k + j] = pool[j];
      r.weights.data<float>()[t * top_k + j] = uniform(rng);
    }
  }
  return r;
}

MoeConfig Config(int64_t num_experts, int64_t top_k, float capacity_factor = 0.0f,
                 DropPolicy policy = DropPolicy::kProbability) {
  MoeConfig c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.capacity_factor = capacity_factor;
  c.drop_policy = policy;
  return c;
}

// What the header promises, computed naively: per expert its pairs in (token, slot) order; keep
// the first C, or the C largest weights (ties to the earlier token), then lay the kept pairs out
// expert by expert in (token, slot) order.
struct ExpectedPermutation {
  std::vector<int64_t> expert_offsets;
  std::vector<int32_t> row_token;
  std::vector<int32_t> pair_row;
  int64_t dropped = 0;
};

ExpectedPermutation Expected(const MoeConfig& config, const Routing& r) {
  const int64_t pairs = r.tokens * r.top_k;
  int64_t capacity = pairs;
  if (config.capacity_factor > 0.0f) {
    capacity = static_cast<int64_t>(std::ceil(static_cast<double>(config.capacity_factor) * pairs /
                                              static_cast<double>(config.num_experts)));
  }
  const int32_t* experts = r.experts.data<int32_t>();
  const float* weights = r.weights.data<float>();
  ExpectedPermutation ex;
  ex.pair_row.assign(pairs, -1);
  ex.expert_offsets.push_back(0);
  for (int64_t e = 0; e < config.num_experts; ++e) {
    std::vector<int64_t> mine;
    for (int64_t i = 0; i < pairs; ++i) {
      if (experts[i] == e) mine.push_back(i);
    }
    if (static_cast<int64_t>(mine.size()) > capacity) {
      if (config.drop_policy == DropPolicy::kProbability) {
        std::stable_sort(mine.begin(), mine.end(),
                         [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
      }
      ex.dropped += static_cast<int64_t>(mine.size()) - capacity;
      mine.resize(capacity);
      std::sort(mine.begin(), mine.end());
    }
    for (int64_t i : mine) {
      ex.pair_row[i] = static_cast<int32_t>(ex.row_token.size());
      ex.row_token.push_back(static_cast<int32_t>(i / r.top_k));
    }
    ex.expert_offsets.push_back(static_cast<int64_t>(ex.row_token.size()));
  }
  return ex;
}

// The invariants that hold for any permutation, independent of the expected layout.
void CheckInvariants(const MoeConfig& config, const Routing& r, const Permutation& perm) {
  const int64_t pairs = r.tokens * r.top_k, E = config.num_experts;
  const int32_t* experts = r.experts.data<int32_t>();
  ASSERT_EQ(perm.expert_offsets.size(), static_cast<size_t>(E + 1));
  EXPECT_EQ(perm.expert_offsets[0], 0);
  for (int64_t e = 0; e < E; ++e) EXPECT_LE(perm.expert_offsets[e], perm.expert_offsets[e + 1]);
  EXPECT_EQ(perm.expert_offsets[E], perm.num_rows);
  EXPECT_EQ(perm.num_rows + perm.dropped, pairs);
  ASSERT_EQ(perm.row_token.dtype(), DType::kI32);
  ASSERT_EQ(perm.pair_row.dtype(), DType::kI32);
  ASSERT_EQ(perm.row_token.rank(), 1);
  ASSERT_EQ(perm.row_token.dim(0), perm.num_rows);
  ASSERT_EQ(perm.pair_row.rank(), 2);
  ASSERT_EQ(perm.pair_row.dim(0), r.tokens);
  ASSERT_EQ(perm.pair_row.dim(1), r.top_k);
  const int32_t* row_token = perm.row_token.data<int32_t>();
  const int32_t* pair_row = perm.pair_row.data<int32_t>();

  // pair_row is injective onto [0, R), row_token is its inverse (as a token), and each row lies
  // in its pair's expert block.
  std::vector<int64_t> pair_of_row(perm.num_rows, -1);
  int64_t dropped = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t row = pair_row[i];
    if (row < 0) {
      EXPECT_EQ(row, -1);
      ++dropped;
      continue;
    }
    ASSERT_LT(row, perm.num_rows);
    EXPECT_EQ(pair_of_row[row], -1) << "row " << row << " taken twice";
    pair_of_row[row] = i;
    EXPECT_EQ(row_token[row], i / r.top_k) << "row " << row;
    EXPECT_GE(row, perm.expert_offsets[experts[i]]) << "pair " << i;
    EXPECT_LT(row, perm.expert_offsets[experts[i] + 1]) << "pair " << i;
  }
  EXPECT_EQ(dropped, perm.dropped);
  for (int64_t row = 0; row < perm.num_rows; ++row) {
    EXPECT_NE(pair_of_row[row], -1) << "row " << row << " belongs to no pair";
  }
  // Stable: within an expert's block the rows follow (token, slot) order.
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t row = perm.expert_offsets[e] + 1; row < perm.expert_offsets[e + 1]; ++row) {
      EXPECT_LT(pair_of_row[row - 1], pair_of_row[row]) << "expert " << e << " row " << row;
    }
  }
}

void CheckExpected(const MoeConfig& config, const Routing& r, const Permutation& perm) {
  const ExpectedPermutation ex = Expected(config, r);
  EXPECT_EQ(perm.expert_offsets, ex.expert_offsets);
  EXPECT_EQ(perm.dropped, ex.dropped);
  ASSERT_EQ(perm.num_rows, static_cast<int64_t>(ex.row_token.size()));
  EXPECT_EQ(std::vector<int32_t>(perm.row_token.data<int32_t>(),
                                 perm.row_token.data<int32_t>() + perm.num_rows),
            ex.row_token);
  EXPECT_EQ(std::vector<int32_t>(perm.pair_row.data<int32_t>(),
                                 perm.pair_row.data<int32_t>() + r.tokens * r.top_k),
            ex.pair_row);
}

struct Shape {
  int64_t tokens, num_experts, top_k, used_experts;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "T=" << s.tokens << " E=" << s.num_experts << " k=" << s.top_k
      << " used=" << s.used_experts;
}

class DroplessPermutationTest : public ::testing::TestWithParam<Shape> {};

TEST_P(DroplessPermutationTest, RoutesEveryPairExactlyOnce) {
  const Shape s = GetParam();
  const MoeConfig config = Config(s.num_experts, s.top_k);
  const Routing r = RandomRouting(s.tokens, s.top_k, s.used_experts, 7);
  Permutation perm;
  ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
  EXPECT_EQ(perm.num_rows, s.tokens * s.top_k);
  EXPECT_EQ(perm.dropped, 0);
  CheckInvariants(config, r, perm);
  CheckExpected(config, r, perm);
  for (int64_t e = s.used_experts; e < s.num_experts; ++e) {
    EXPECT_EQ(perm.expert_offsets[e], perm.expert_offsets[e + 1]) << "expert " << e;
  }
}

TEST_P(DroplessPermutationTest, UnpermuteOfPermuteIsIdentity) {
  const Shape s = GetParam();
  const MoeConfig config = Config(s.num_experts, s.top_k);
  const Routing r = RandomRouting(s.tokens, s.top_k, s.used_experts, 8);
  Permutation perm;
  ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
  constexpr int64_t kWidth = 13;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> rows(s.tokens * kWidth);
  for (float& v : rows) v = normal(rng);

  // Permute: each row gathers its token. Unpermute: each pair reads its row back.
  std::vector<float> permuted(perm.num_rows * kWidth);
  for (int64_t row = 0; row < perm.num_rows; ++row) {
    const int32_t t = perm.row_token.data<int32_t>()[row];
    ASSERT_GE(t, 0);
    ASSERT_LT(t, s.tokens);
    std::copy_n(&rows[t * kWidth], kWidth, &permuted[row * kWidth]);
  }
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t j = 0; j < s.top_k; ++j) {
      const int32_t row = perm.pair_row.data<int32_t>()[t * s.top_k + j];
      ASSERT_GE(row, 0);
      ASSERT_LT(row, perm.num_rows);
      for (int64_t d = 0; d < kWidth; ++d) {
        ASSERT_EQ(permuted[row * kWidth + d], rows[t * kWidth + d]) << t << "," << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DroplessPermutationTest,
    ::testing::Values(Shape{37, 8, 2, 8}, Shape{1, 8, 2, 8}, Shape{37, 4, 4, 4}, Shape{37, 1, 1, 1},
                      Shape{101, 16, 3, 13}, Shape{5, 32, 8, 32}, Shape{512, 16, 4, 16}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return absl::StrCat("T", s.tokens, "E", s.num_experts, "K", s.top_k, "Used", s.used_experts);
    });

TEST(CapacityPermutationTest, ByProbabilityKeepsTheLargestWeights) {
  // C = ⌈0.5·37·2/8⌉ = 5 of ~9 pairs per expert.
  const MoeConfig config = Config(8, 2, 0.5f, DropPolicy::kProbability);
  const Routing r = RandomRouting(37, 2, 8, 11);
  Permutation perm;
  ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
  EXPECT_GT(perm.dropped, 0);
  for (int64_t e = 0; e < 8; ++e) {
    EXPECT_LE(perm.expert_offsets[e + 1] - perm.expert_offsets[e], 5) << "expert " << e;
  }
  CheckInvariants(config, r, perm);
  CheckExpected(config, r, perm);
}

TEST(CapacityPermutationTest, ByProbabilityTiesGoToTheEarlierToken) {
  const MoeConfig config = Config(8, 2, 0.5f, DropPolicy::kProbability);
  Routing r = RandomRouting(37, 2, 8, 12);
  std::fill_n(r.weights.data<float>(), r.weights.numel(), 0.25f);
  Permutation perm;
  ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
  EXPECT_GT(perm.dropped, 0);
  CheckInvariants(config, r, perm);
  CheckExpected(config, r, perm);
  // All equal: the same pairs as by position.
  Permutation by_position;
  ASSERT_OK(BuildPermutation(Config(8, 2, 0.5f, DropPolicy::kPosition), r.experts, r.weights,
                             &by_position));
  EXPECT_EQ(std::vector<int32_t>(perm.pair_row.data<int32_t>(),
                                 perm.pair_row.data<int32_t>() + perm.pair_row.numel()),
            std::vector<int32_t>(by_position.pair_row.data<int32_t>(),
                                 by_position.pair_row.data<int32_t>() + perm.pair_row.numel()));
}

TEST(CapacityPermutationTest, ByPositionKeepsTheFirstPairs) {
  const MoeConfig config = Config(8, 2, 0.5f, DropPolicy::kPosition);
  const Routing r = RandomRouting(37, 2, 8, 13);
  Permutation perm;
  ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
  EXPECT_GT(perm.dropped, 0);
  CheckInvariants(config, r, perm);
  CheckExpected(config, r, perm);
}

TEST(CapacityPermutationTest, LargeCapacityDropsNothing) {
  // C = ⌈4·37·2/8⌉ = 37 ≥ the at most 37 pairs an expert can get.
  for (DropPolicy policy : {DropPolicy::kProbability, DropPolicy::kPosition}) {
    const MoeConfig config = Config(8, 2, 4.0f, policy);
    const Routing r = RandomRouting(37, 2, 3, 14);
    Permutation perm;
    ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &perm));
    EXPECT_EQ(perm.dropped, 0);
    EXPECT_EQ(perm.num_rows, 74);
    CheckInvariants(config, r, perm);
    CheckExpected(config, r, perm);
  }
}

TEST(PermutationTest, ReusesTheOutputAcrossBatchSizes) {
  const MoeConfig config = Config(8, 2);
  Permutation perm;
  const Routing big = RandomRouting(64, 2, 8, 15);
  ASSERT_OK(BuildPermutation(config, big.experts, big.weights, &perm));
  const Routing small = RandomRouting(5, 2, 8, 16);
  ASSERT_OK(BuildPermutation(config, small.experts, small.weights, &perm));
  CheckInvariants(config, small, perm);
  CheckExpected(config, small, perm);
  const MoeConfig capped = Config(8, 2, 0.5f, DropPolicy::kProbability);
  ASSERT_OK(BuildPermutation(capped, big.experts, big.weights, &perm));
  CheckInvariants(capped, big, perm);
  CheckExpected(capped, big, perm);
}

TEST(ExpertCapacityTest, IsTheCeilingOfFactorTimesAveragePairs) {
  EXPECT_EQ(ops::ExpertCapacity(Config(8, 2), 37), 74);  // dropless: T·k
  EXPECT_EQ(ops::ExpertCapacity(Config(8, 2, 1.0f), 32), 8);
  EXPECT_EQ(ops::ExpertCapacity(Config(8, 2, 1.25f), 16), 5);  // exactly 5, not 6
  EXPECT_EQ(ops::ExpertCapacity(Config(8, 2, 0.5f), 37), 5);   // ⌈4.625⌉
  EXPECT_EQ(ops::ExpertCapacity(Config(8, 2, 0.75f), 37), 7);  // ⌈6.9375⌉
  EXPECT_EQ(ops::ExpertCapacity(Config(16, 1, 2.0f), 1), 1);   // ⌈0.125⌉
  EXPECT_EQ(ops::ExpertCapacity(Config(4, 4, 1.0f), 10), 10);  // k = E
  EXPECT_EQ(ops::ExpertCapacity(Config(1, 1, 0.5f), 7), 4);    // ⌈3.5⌉
}

// The op lays the pairs out by the caller's offsets, and refuses offsets that the pairs do not
// fill exactly: a host plan that disagrees with the routing is an error, not misaligned rows.
TEST(PermutationTest, OffsetsThatDisagreeWithThePairsAreRefused) {
  const MoeConfig config = Config(8, 2, 0.5f, DropPolicy::kProbability);
  const Routing r = RandomRouting(37, 2, 7, 21);
  std::vector<int64_t> counts(8, 0);
  for (int64_t i = 0; i < r.experts.numel(); ++i) ++counts[r.experts.data<int32_t>()[i]];
  const std::vector<int64_t> planned = ops::PermutedExpertOffsets(config, r.tokens, counts);
  ops::Permutation perm;
  ASSERT_OK(ops::BuildPermutation(
      ExecContext::Cpu(), config,
      {.topk_experts = r.experts, .topk_weights = r.weights, .expert_offsets = planned}, &perm));
  EXPECT_EQ(std::vector<int64_t>(perm.expert_offsets.data<int64_t>(),
                                 perm.expert_offsets.data<int64_t>() + 9),
            planned);
  // Expert 7 gets no pair; moving a row from expert 0 to it must be refused.
  std::vector<int64_t> wrong = planned;
  for (int64_t e = 1; e < 8; ++e) --wrong[e];
  const absl::Status status = ops::BuildPermutation(
      ExecContext::Cpu(), config,
      {.topk_experts = r.experts, .topk_weights = r.weights, .expert_offsets = wrong}, &perm);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("expert_offsets: position 0 keeps"),
            std::string::npos)
      << status;
  // Offsets of the wrong size, or beyond the pairs.
  const std::vector<int64_t> short_offsets(8, 0);
  EXPECT_EQ(
      ops::BuildPermutation(
          ExecContext::Cpu(), config,
          {.topk_experts = r.experts, .topk_weights = r.weights, .expert_offsets = short_offsets},
          &perm)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// With an expert order (the expert-parallel send slots), expert e's rows are block
// expert_order[e], still in (token, slot) order and capped alike.
TEST(PermutationTest, AnExpertOrderReordersTheBlocks) {
  for (const MoeConfig& config : {Config(6, 2), Config(6, 2, 0.5f, DropPolicy::kProbability)}) {
    const Routing r = RandomRouting(29, 2, 6, 22);
    const std::vector<int32_t> order = {3, 0, 5, 1, 4, 2};
    Tensor order_t = Tensor::Empty(DType::kI32, {6});
    std::copy(order.begin(), order.end(), order_t.data<int32_t>());
    Permutation by_expert, reordered;
    ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &by_expert));
    ASSERT_OK(BuildPermutation(config, r.experts, r.weights, &reordered, order_t));
    ASSERT_EQ(reordered.num_rows, by_expert.num_rows);
    for (int64_t e = 0; e < 6; ++e) {
      const int64_t slot = order[e];
      const int64_t rows = by_expert.expert_offsets[e + 1] - by_expert.expert_offsets[e];
      ASSERT_EQ(reordered.expert_offsets[slot + 1] - reordered.expert_offsets[slot], rows);
      for (int64_t i = 0; i < rows; ++i) {
        EXPECT_EQ(reordered.row_token.data<int32_t>()[reordered.expert_offsets[slot] + i],
                  by_expert.row_token.data<int32_t>()[by_expert.expert_offsets[e] + i])
            << "expert " << e << " row " << i;
      }
    }
    // A pair's row moves with its expert's block.
    for (int64_t p = 0; p < r.experts.numel(); ++p) {
      const int32_t e = r.experts.data<int32_t>()[p];
      const int32_t old_row = by_expert.pair_row.data<int32_t>()[p];
      const int32_t new_row = reordered.pair_row.data<int32_t>()[p];
      ASSERT_EQ(old_row < 0, new_row < 0) << "pair " << p;
      if (old_row < 0) continue;
      EXPECT_EQ(new_row - reordered.expert_offsets[order[e]],
                old_row - by_expert.expert_offsets[e]);
    }
  }
  // Not a permutation of [0, E): refused.
  const Routing r = RandomRouting(5, 2, 6, 23);
  Tensor repeated = Tensor::Zeros(DType::kI32, {6});
  Permutation perm;
  const absl::Status status = BuildPermutation(Config(6, 2), r.experts, r.weights, &perm, repeated);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("expert_order[1] = 0"), std::string::npos) << status;
}

TEST(PermutationTest, RejectsInvalidInputs) {
  const MoeConfig config = Config(8, 2, 0.5f, DropPolicy::kProbability);
  const Routing r = RandomRouting(9, 2, 8, 17);
  Permutation perm;
  {
    Tensor as_float = Tensor::Zeros(DType::kF32, {9, 2});
    const absl::Status status = BuildPermutation(config, as_float, r.weights, &perm);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  {
    Tensor wrong_k = Tensor::Zeros(DType::kI32, {9, 3});
    const absl::Status status = BuildPermutation(config, wrong_k, r.weights, &perm);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  {
    Tensor wrong_weights = Tensor::Zeros(DType::kF32, {8, 2});
    const absl::Status status = BuildPermutation(config, r.experts, wrong_weights, &perm);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  // An expert index outside [0, E) would write outside the expert blocks.
  for (int32_t bad : {8, -1}) {
    Routing out_of_range = RandomRouting(9, 2, 8, 18);
    out_of_range.experts.data<int32_t>()[5] = bad;
    const absl::Status status =
        BuildPermutation(config, out_of_range.experts, out_of_range.weights, &perm);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "expert " << bad << status;
  }
}

}  // namespace
}  // namespace moetrain
