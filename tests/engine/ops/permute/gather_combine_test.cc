#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/permute/permute.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/act_test_util.h"

namespace moetrain::ops_test {
namespace {

// ---------------------------------------------------------------------------------------------
// GatherRows.
// ---------------------------------------------------------------------------------------------

class GatherRowsTest : public ::testing::TestWithParam<ActSizeParam> {};

TEST_P(GatherRowsTest, CopiesIndexedRowsIncludingRepeats) {
  const auto [dtype, size] = GetParam();
  const int64_t tokens = size.rows, cols = size.cols, rows = 2 * tokens + 3;
  std::mt19937 rng(static_cast<uint32_t>(tokens + cols));
  std::vector<float> src_values = Uniform(tokens * cols, -1.0f, 1.0f, rng);
  Tensor src = MakeAct(dtype, {tokens, cols}, src_values);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(tokens) - 1);
  std::vector<int32_t> index(rows);
  for (int32_t& i : index) i = pick(rng);
  // The first and last token, and one token three times in a row.
  index[0] = 0;
  index[rows - 1] = static_cast<int32_t>(tokens) - 1;
  index[1] = index[2] = index[3] = static_cast<int32_t>(tokens / 2);
  Tensor dst = NaNAct(dtype, {rows, cols});
  const absl::Status status = ops::GatherRows(Cpu(), src, MakeI32({rows}, index), dst);
  ASSERT_TRUE(status.ok()) << status;

  const size_t row_bytes = cols * DTypeSize(dtype);
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_EQ(
        std::memcmp(static_cast<const char*>(dst.view().raw()) + r * row_bytes,
                    static_cast<const char*>(src.view().raw()) + index[r] * row_bytes, row_bytes),
        0)
        << "row " << r << " should be token " << index[r];
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GatherRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Size{1, 1}, kSmall, kLarge)),
                         ActSizeName);

TEST(GatherRowsErrorTest, RejectsBadIndexAndShapes) {
  std::mt19937 rng(9);
  std::vector<float> values = Uniform(5 * 3, -1.0f, 1.0f, rng);
  Tensor src = MakeAct(DType::kF32, {5, 3}, values);
  Tensor dst = NaNAct(DType::kF32, {4, 3});
  const Tensor dst_before = NaNAct(DType::kF32, {4, 3});
  for (int32_t bad : {-1, 5, 1 << 30}) {
    SCOPED_TRACE(bad);
    // The bad entry is last: nothing may be copied before it is found.
    EXPECT_TRUE(
        IsInvalidArgument(ops::GatherRows(Cpu(), src, MakeI32({4}, {0, 1, 2, bad}), dst), "index"));
    EXPECT_TRUE(SameBytes(dst, dst_before)) << "dst was written despite the error";
  }
  Tensor index = MakeI32({4}, {0, 1, 2, 3});
  Tensor index_i64 = Tensor::Zeros(DType::kI64, {4});
  Tensor dst_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor dst_wrong = Tensor::Zeros(DType::kF32, {3, 3});
  EXPECT_TRUE(IsInvalidArgument(ops::GatherRows(Cpu(), src, index_i64, dst), "gather index"));
  EXPECT_TRUE(IsInvalidArgument(ops::GatherRows(Cpu(), src, index, dst_bf16), "gather dst"));
  EXPECT_TRUE(IsInvalidArgument(ops::GatherRows(Cpu(), src, index, dst_wrong), "gather dst"));
  EXPECT_TRUE(IsInvalidArgument(ops::GatherRows(Cpu(), TensorView(), index, dst), "gather src"));
}

// ---------------------------------------------------------------------------------------------
// CombineRows, its backward and SumPairRows, over the layout the MoE layer produces: pair
// (t, j) owns one row of `rows`, or none (-1) when the token was dropped by that expert.
// ---------------------------------------------------------------------------------------------

struct Routing {
  int64_t tokens = 0, k = 0, rows = 0, d = 0;
  std::vector<int32_t> pair_row;  // (T, k): a permutation of [0, R) with -1 for dropped pairs
  std::vector<float> weights;     // (T, k), nonzero also for dropped pairs
};

Routing MakeRouting(int64_t tokens, int64_t k, int64_t d, std::mt19937& rng) {
  Routing routing{tokens, k, 0, d, std::vector<int32_t>(tokens * k), {}};
  std::bernoulli_distribution drop(0.2);
  std::vector<bool> dropped(tokens * k);
  for (int64_t i = 0; i < tokens * k; ++i) dropped[i] = drop(rng);
  // Token 0 loses every pair; token 1 keeps every pair.
  for (int64_t j = 0; j < k; ++j) {
    dropped[j] = true;
    if (tokens > 1) dropped[k + j] = false;
  }
  const int64_t kept = std::count(dropped.begin(), dropped.end(), false);
  std::vector<int32_t> perm(kept);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int64_t i = 0; i < tokens * k; ++i) routing.pair_row[i] = dropped[i] ? -1 : perm[next++];
  routing.rows = kept;
  routing.weights = Uniform(tokens * k, 0.05f, 1.0f, rng);
  return routing;
}

// out_t = [extra_t +] Σ_j w[t, j] · rows[pair_row[t, j]].
std::vector<double> RefCombine(const Routing& r, const std::vector<float>& rows,
                               const std::vector<float>* extra) {
  std::vector<double> out(r.tokens * r.d, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t i = 0; i < r.d; ++i) {
      double sum = extra != nullptr ? (*extra)[t * r.d + i] : 0.0;
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t row = r.pair_row[t * r.k + j];
        if (row >= 0) sum += static_cast<double>(r.weights[t * r.k + j]) * rows[row * r.d + i];
      }
      out[t * r.d + i] = sum;
    }
  }
  return out;
}

using CombineParam = std::tuple<DType, bool, Size>;  // out dtype, with extra, (tokens, d)

std::string CombineName(const ::testing::TestParamInfo<CombineParam>& info) {
  const auto& [dtype, with_extra, size] = info.param;
  return std::string(Name(dtype)) + (with_extra ? "_Extra_" : "_") + std::to_string(size.rows) +
         "x" + std::to_string(size.cols);
}

class CombineRowsTest : public ::testing::TestWithParam<CombineParam> {};

TEST_P(CombineRowsTest, MatchesReference) {
  const auto [dtype, with_extra, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 3 + size.cols + with_extra));
  const Routing r = MakeRouting(size.rows, /*k=*/3, size.cols, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  std::vector<float> extra_values = Uniform(r.tokens * r.d, -1.0f, 1.0f, rng);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  Tensor extra = MakeAct(DType::kF32, {r.tokens, r.d}, extra_values);
  std::vector<float> weights_values = r.weights;
  Tensor weights = MakeAct(DType::kF32, {r.tokens, r.k}, weights_values);
  Tensor out = NaNAct(dtype, {r.tokens, r.d});
  const absl::Status status =
      ops::CombineRows(Cpu(), rows, MakeI32({r.tokens, r.k}, r.pair_row), weights,
                       with_extra ? extra.view() : TensorView(), out);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(RelError(out, RefCombine(r, rows_values, with_extra ? &extra_values : nullptr)),
            Tolerance(dtype));
  // Token 0 lost all its pairs: it is exactly extra_0 (rounded to out) or zero.
  for (int64_t i = 0; i < r.d; ++i) {
    const float want = with_extra ? extra_values[i] : 0.0f;
    EXPECT_EQ(At(out, i), dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(want)) : want) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Values(kSmall, kLarge)),
                         CombineName);

using CombineBackwardParam = std::tuple<DType, DType, Size>;  // d_out, d_rows dtypes

std::string CombineBackwardName(const ::testing::TestParamInfo<CombineBackwardParam>& info) {
  const auto& [d_out_dtype, d_rows_dtype, size] = info.param;
  return std::string("DOut") + Name(d_out_dtype) + "_DRows" + Name(d_rows_dtype) + "_" +
         std::to_string(size.rows) + "x" + std::to_string(size.cols);
}

class CombineRowsBackwardTest : public ::testing::TestWithParam<CombineBackwardParam> {};

TEST_P(CombineRowsBackwardTest, MatchesReference) {
  const auto [d_out_dtype, d_rows_dtype, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 5 + size.cols));
  const Routing r = MakeRouting(size.rows, /*k=*/2, size.cols, rng);
  std::vector<float> d_out_values = Uniform(r.tokens * r.d, -1.0f, 1.0f, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  std::vector<float> weights_values = r.weights;
  Tensor d_out = MakeAct(d_out_dtype, {r.tokens, r.d}, d_out_values);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  Tensor weights = MakeAct(DType::kF32, {r.tokens, r.k}, weights_values);
  Tensor d_rows = NaNAct(d_rows_dtype, {r.rows, r.d});
  Tensor d_weights = NaNAct(DType::kF32, {r.tokens, r.k});
  const absl::Status status = ops::CombineRowsBackward(
      Cpu(), d_out, rows, MakeI32({r.tokens, r.k}, r.pair_row), weights, d_rows, d_weights);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want_d_rows(r.rows * r.d, 0.0), want_d_weights(r.tokens * r.k, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t j = 0; j < r.k; ++j) {
      const int32_t row = r.pair_row[t * r.k + j];
      if (row < 0) continue;
      double dot = 0.0;
      for (int64_t i = 0; i < r.d; ++i) {
        want_d_rows[row * r.d + i] =
            static_cast<double>(r.weights[t * r.k + j]) * d_out_values[t * r.d + i];
        dot += static_cast<double>(d_out_values[t * r.d + i]) * rows_values[row * r.d + i];
      }
      want_d_weights[t * r.k + j] = dot;
    }
  }
  EXPECT_LT(RelError(d_rows, want_d_rows), Tolerance(d_rows_dtype));
  // Dot products of exact inputs accumulated in f32, whatever d_out is stored in.
  EXPECT_LT(RelError(d_weights, want_d_weights), 1e-5);
  for (int64_t i = 0; i < r.tokens * r.k; ++i) {
    if (r.pair_row[i] < 0) {
      ASSERT_EQ(d_weights.data<float>()[i], 0.0f) << "dropped pair " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CombineRowsBackwardTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(kSmall, kLarge)),
                         CombineBackwardName);

using SumParam = std::tuple<DType, int, Size>;  // out dtype, number of addends

std::string SumName(const ::testing::TestParamInfo<SumParam>& info) {
  const auto& [dtype, addends, size] = info.param;
  return std::string(Name(dtype)) + "_" + std::to_string(addends) + "Addends_" +
         std::to_string(size.rows) + "x" + std::to_string(size.cols);
}

class SumPairRowsTest : public ::testing::TestWithParam<SumParam> {};

TEST_P(SumPairRowsTest, MatchesReference) {
  const auto [dtype, num_addends, size] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 7 + size.cols + num_addends));
  const Routing r = MakeRouting(size.rows, /*k=*/4, size.cols, rng);
  std::vector<float> rows_values = Uniform(r.rows * r.d, -1.0f, 1.0f, rng);
  Tensor rows = MakeAct(DType::kF32, {r.rows, r.d}, rows_values);
  std::vector<std::vector<float>> addend_values;
  std::vector<Tensor> addends;
  std::vector<TensorView> addend_views;
  for (int a = 0; a < num_addends; ++a) {
    addend_values.push_back(Uniform(r.tokens * r.d, -1.0f, 1.0f, rng));
    addends.push_back(MakeAct(DType::kF32, {r.tokens, r.d}, addend_values.back()));
    addend_views.push_back(addends.back());
  }
  Tensor out = NaNAct(dtype, {r.tokens, r.d});
  const absl::Status status =
      ops::SumPairRows(Cpu(), rows, MakeI32({r.tokens, r.k}, r.pair_row), addend_views, out);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(r.tokens * r.d, 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t i = 0; i < r.d; ++i) {
      double sum = 0.0;
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t row = r.pair_row[t * r.k + j];
        if (row >= 0) sum += rows_values[row * r.d + i];
      }
      for (const std::vector<float>& a : addend_values) sum += a[t * r.d + i];
      want[t * r.d + i] = sum;
    }
  }
  EXPECT_LT(RelError(out, want), Tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SumPairRowsTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(0, 1, 2),
                                            ::testing::Values(kSmall, kLarge)),
                         SumName);

TEST(CombineErrorTest, RejectsBadPairRowsAndShapes) {
  const int64_t tokens = 4, k = 2, rows = 6, d = 3;
  Tensor rows_t = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, d});
  Tensor d_rows = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor d_weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor good = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, 5});
  for (int32_t bad : {-2, 6, 1000}) {
    SCOPED_TRACE(bad);
    Tensor pair_row = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, bad});
    EXPECT_TRUE(IsInvalidArgument(
        ops::CombineRows(Cpu(), rows_t, pair_row, weights, TensorView(), out), "pair_row"));
    EXPECT_TRUE(IsInvalidArgument(
        ops::CombineRowsBackward(Cpu(), out, rows_t, pair_row, weights, d_rows, d_weights),
        "pair_row"));
    EXPECT_TRUE(IsInvalidArgument(ops::SumPairRows(Cpu(), rows_t, pair_row, {}, out), "pair_row"));
  }
  Tensor weights_wrong = Tensor::Zeros(DType::kF32, {tokens, k + 1});
  Tensor extra_wrong = Tensor::Zeros(DType::kF32, {tokens, d + 1});
  Tensor out_wrong = Tensor::Zeros(DType::kF32, {tokens + 1, d});
  Tensor out_i32 = Tensor::Zeros(DType::kI32, {tokens, d});
  Tensor d_rows_wrong = Tensor::Zeros(DType::kF32, {rows - 1, d});
  Tensor d_weights_bf16 = Tensor::Zeros(DType::kBF16, {tokens, k});
  Tensor pair_row_i64 = Tensor::Zeros(DType::kI64, {tokens, k});
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), rows_t, good, weights_wrong, TensorView(), out), "combine weights"));
  EXPECT_TRUE(IsInvalidArgument(ops::CombineRows(Cpu(), rows_t, good, weights, extra_wrong, out),
                                "combine extra"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), rows_t, good, weights, TensorView(), out_wrong), "combine out"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), rows_t, good, weights, TensorView(), out_i32), "combine out"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), rows_t, pair_row_i64, weights, TensorView(), out), "pair_row"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRowsBackward(Cpu(), out_wrong, rows_t, good, weights, d_rows, d_weights),
      "combine d_out"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRowsBackward(Cpu(), out, rows_t, good, weights, d_rows_wrong, d_weights),
      "combine d_rows"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRowsBackward(Cpu(), out, rows_t, good, weights, d_rows, d_weights_bf16),
      "combine d_weights"));
  Tensor addend_wrong = Tensor::Zeros(DType::kF32, {tokens, d + 1});
  const std::vector<TensorView> addends = {out, addend_wrong};
  EXPECT_TRUE(IsInvalidArgument(ops::SumPairRows(Cpu(), rows_t, good, addends, out), "sum addend"));
  EXPECT_TRUE(IsInvalidArgument(ops::SumPairRows(Cpu(), rows_t, good, {}, out_i32), "sum out"));
}

// Strided views. The kernels index their tensors as dense row-major arrays, so a view with
// other strides must be refused (CheckAct does so for act tensors) instead of being read or
// written in the wrong places.
TensorView EveryOtherRow(const Tensor& buffer) {
  return TensorView(buffer.view().raw(), buffer.dtype(), {buffer.dim(0) / 2, buffer.dim(1)},
                    {2 * buffer.dim(1), 1});
}

TEST(StridedViewTest, NonContiguousGatherAndCombineTensorsAreRejected) {
  const int64_t tokens = 4, k = 2, rows = 6, d = 3;
  Tensor d_out_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, d});
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, d});
  Tensor src = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor index = MakeI32({tokens}, {0, 1, 2, 3});
  Tensor dst_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, d});
  EXPECT_TRUE(IsInvalidArgument(ops::GatherRows(Cpu(), src, index, EveryOtherRow(dst_buffer)),
                                "gather dst"));

  Tensor pair_row = MakeI32({tokens, k}, {0, 1, 2, -1, 3, 4, -1, 5});
  Tensor weights = Tensor::Zeros(DType::kF32, {tokens, k});
  Tensor rows_buffer = Tensor::Zeros(DType::kF32, {2 * rows, d});
  Tensor weights_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, k});
  Tensor d_rows = Tensor::Zeros(DType::kF32, {rows, d});
  Tensor rows_t = Tensor::Zeros(DType::kF32, {rows, d});
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), EveryOtherRow(rows_buffer), pair_row, weights, TensorView(), out),
      "rows"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::CombineRows(Cpu(), rows_t, pair_row, weights, EveryOtherRow(d_out_buffer), out),
      "extra"));
  EXPECT_TRUE(IsInvalidArgument(ops::CombineRowsBackward(Cpu(), out, rows_t, pair_row, weights,
                                                         d_rows, EveryOtherRow(weights_buffer)),
                                "d_weights"));
  const std::vector<TensorView> addends = {EveryOtherRow(d_out_buffer)};
  EXPECT_TRUE(IsInvalidArgument(ops::SumPairRows(Cpu(), rows_t, pair_row, addends, out), "addend"));
}

}  // namespace
}  // namespace moetrain::ops_test
