// The token embedding against a float64 reference.
#include "engine/ops/embedding/embedding.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/layer_test_util.h"

namespace moetrain::ops_test::layer_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Embedding

TEST(EmbeddingTest, ForwardGathersAndBackwardSumsRepeatedTokens) {
  std::mt19937 rng(5);
  const int64_t v = 13, d = 20;
  // Token 3 four times, 0 and 12 (the edges) twice, most rows never.
  const std::vector<int32_t> ids = {3, 0, 3, 12, 7, 3, 0, 12, 3, 5};
  const int64_t t = static_cast<int64_t>(ids.size());
  std::vector<float> table = Normal(rng, v * d, 0.0f, 1.0f);
  std::vector<float> dy = Normal(rng, t * d, 0.0f, 1.0f);
  std::vector<float> d_table0 = Normal(rng, v * d, 0.0f, 1.0f);
  Tensor table_t = MakeTensor(DType::kF32, {v, d}, table), tokens = FromInts(ids);
  Tensor out = Tensor::Empty(DType::kF32, {t, d});
  ASSERT_OK(ops::EmbeddingForward(Cpu(), table_t, tokens, out));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(out.data<float>()[r * d + i], table[ids[r] * d + i]);
  }

  Tensor dy_t = MakeTensor(DType::kF32, {t, d}, dy);
  Tensor d_table = MakeTensor(DType::kF32, {v, d}, d_table0);
  ASSERT_OK(ops::EmbeddingBackward(Cpu(), tokens, dy_t, d_table));
  std::vector<double> want(d_table0.begin(), d_table0.end());
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < d; ++i) want[ids[r] * d + i] += dy[r * d + i];
  }
  EXPECT_LT(RelError(ToDoubles(d_table), want), 1e-6);
}

// Windows of S + 1 + D tokens: inputs and targets from column `offset` on (multi-token
// prediction), and a window too short for the offset refused.
TEST(EmbeddingTest, SplitTokensFromAnOffset) {
  Tensor windows = Tensor::Empty(DType::kI32, {2, 6});
  for (int32_t i = 0; i < 12; ++i) windows.data<int32_t>()[i] = i;
  Tensor inputs = Tensor::Empty(DType::kI32, {6}), targets = Tensor::Empty(DType::kI32, {6});
  ASSERT_TRUE(ops::SplitTokens(ExecContext::Cpu(), windows, 12, 2, inputs, targets).ok());
  EXPECT_EQ(std::vector<int32_t>(inputs.data<int32_t>(), inputs.data<int32_t>() + 6),
            (std::vector<int32_t>{2, 3, 4, 8, 9, 10}));
  EXPECT_EQ(std::vector<int32_t>(targets.data<int32_t>(), targets.data<int32_t>() + 6),
            (std::vector<int32_t>{3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(ops::SplitTokens(ExecContext::Cpu(), windows, 12, 3, inputs, targets).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EmbeddingTest, RejectsTokensOutsideTheVocabulary) {
  Tensor table = Tensor::Zeros(DType::kF32, {5, 4}), out = Tensor::Empty(DType::kF32, {3, 4});
  for (int32_t bad : {-1, 5}) {
    Tensor tokens = FromInts({1, bad, 2});
    const absl::Status status = ops::EmbeddingForward(Cpu(), table, tokens, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("tokens[1]"), std::string::npos) << status;
    EXPECT_EQ(ops::EmbeddingBackward(Cpu(), tokens, out, table).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace moetrain::ops_test::layer_test
