// The fused LM-head cross-entropy against a float64 reference.
#include "engine/ops/loss/lm_head_loss.h"

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
// LM head and cross-entropy

struct LossReference {
  double loss = 0.0;
  std::vector<double> d_hidden, d_weight;
};

// loss = mean_t (logsumexp z_t − z_{t, y_t}), z = h·Wᵀ; gradients scaled by d_loss.
LossReference CrossEntropyReference(const std::vector<float>& h, const std::vector<float>& w,
                                    const std::vector<int32_t>& y, int64_t t, int64_t d, int64_t v,
                                    double d_loss) {
  LossReference ref;
  ref.d_hidden.assign(t * d, 0.0);
  ref.d_weight.assign(v * d, 0.0);
  std::vector<double> z(v);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t c = 0; c < v; ++c) {
      double dot = 0.0;
      for (int64_t i = 0; i < d; ++i) dot += double{h[r * d + i]} * w[c * d + i];
      z[c] = dot;
    }
    const double max = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (int64_t c = 0; c < v; ++c) sum += std::exp(z[c] - max);
    const double lse = max + std::log(sum);
    ref.loss += (lse - z[y[r]]) / t;
    for (int64_t c = 0; c < v; ++c) {
      const double dz = (std::exp(z[c] - lse) - (c == y[r] ? 1.0 : 0.0)) * d_loss / t;
      for (int64_t i = 0; i < d; ++i) {
        ref.d_hidden[r * d + i] += dz * w[c * d + i];
        ref.d_weight[c * d + i] += dz * h[r * d + i];
      }
    }
  }
  return ref;
}

struct LossCase {
  int64_t tokens, hidden, vocab, chunk;
};

void PrintTo(const LossCase& c, std::ostream* os) {
  *os << "T=" << c.tokens << " D=" << c.hidden << " V=" << c.vocab << " chunk=" << c.chunk;
}

class LmHeadLossTest : public ::testing::TestWithParam<LossCase> {};

TEST_P(LmHeadLossTest, MatchesFloat64Reference) {
  const auto [t, d, v, chunk] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(t * 7 + v * 3 + chunk));
  std::vector<float> h = Normal(rng, t * d, 0.0f, 1.0f);
  std::vector<float> w = Normal(rng, v * d, 0.0f, 0.7f);
  std::vector<int32_t> y(t);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(v - 1));
  for (int32_t& id : y) id = token(rng);
  y[0] = 0;
  y[t - 1] = static_cast<int32_t>(v - 1);
  const double d_loss = 0.25;
  const LossReference ref = CrossEntropyReference(h, w, y, t, d, v, d_loss);

  Tensor h_t = MakeTensor(DType::kF32, {t, d}, h), w_t = MakeTensor(DType::kF32, {v, d}, w);
  Tensor y_t = FromInts(y);
  const ops::LmHeadLossArgs args = {
      .hidden = h_t, .weight = w_t, .targets = y_t, .chunk_tokens = chunk};
  ops::LmHeadLossWorkspace workspace(Cpu());
  absl::StatusOr<float> loss = ops::LmHeadLossForward(Cpu(), args, &workspace);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_LT(std::abs(*loss - ref.loss) / ref.loss, 1e-6);

  std::vector<float> d_w0 = Normal(rng, v * d, 0.0f, 0.01f);
  Tensor d_h = Tensor::Empty(DType::kF32, {t, d}), d_w = MakeTensor(DType::kF32, {v, d}, d_w0);
  loss = ops::LmHeadLossForwardBackward(
      Cpu(), args, {.d_loss = static_cast<float>(d_loss), .d_hidden = d_h, .d_weight = d_w},
      &workspace);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_LT(std::abs(*loss - ref.loss) / ref.loss, 1e-6);
  EXPECT_LT(RelError(ToDoubles(d_h), ref.d_hidden), 1e-5);
  std::vector<double> want_dw = ref.d_weight;
  for (int64_t i = 0; i < v * d; ++i) want_dw[i] += d_w0[i];
  EXPECT_LT(RelError(ToDoubles(d_w), want_dw), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Chunks, LmHeadLossTest,
                         ::testing::Values(LossCase{1, 8, 2, 0},
                                           // Automatic chunk: all tokens at once.
                                           LossCase{37, 16, 29, 0},
                                           // One token per chunk, ragged last chunks, V not a
                                           // multiple of anything, one chunk exactly, and a
                                           // chunk larger than T.
                                           LossCase{37, 16, 29, 1}, LossCase{37, 16, 29, 5},
                                           LossCase{37, 16, 29, 8}, LossCase{37, 16, 29, 37},
                                           LossCase{37, 16, 29, 100}, LossCase{64, 33, 301, 17}));

TEST(LmHeadLossTest, Bf16IsCloseToTheReferenceOnRoundedInputs) {
  std::mt19937 rng(11);
  const int64_t t = 40, d = 32, v = 50;
  std::vector<float> h = Normal(rng, t * d, 0.0f, 1.0f), w = Normal(rng, v * d, 0.0f, 0.5f);
  for (float& x : h) x = RoundToBF16(x);
  for (float& x : w) x = RoundToBF16(x);
  std::vector<int32_t> y(t);
  for (int64_t r = 0; r < t; ++r) y[r] = static_cast<int32_t>((r * 7) % v);
  const LossReference ref = CrossEntropyReference(h, w, y, t, d, v, 1.0);
  Tensor h_t = MakeTensor(DType::kBF16, {t, d}, h), w_t = MakeTensor(DType::kBF16, {v, d}, w);
  Tensor y_t = FromInts(y);
  Tensor d_h = Tensor::Empty(DType::kF32, {t, d}), d_w = Tensor::Zeros(DType::kF32, {v, d});
  absl::StatusOr<float> loss = ops::LmHeadLossForwardBackward(
      Cpu(), {.hidden = h_t, .weight = w_t, .targets = y_t, .chunk_tokens = 16},
      {.d_loss = 1.0f, .d_hidden = d_h, .d_weight = d_w}, nullptr);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_LT(std::abs(*loss - ref.loss) / ref.loss, 1e-5);
  // The logits' gradient is rounded to bf16 for the two GEMMs.
  EXPECT_LT(RelError(ToDoubles(d_h), ref.d_hidden), 1e-2);
  EXPECT_LT(RelError(ToDoubles(d_w), ref.d_weight), 1e-2);
}

TEST(LmHeadLossTest, RejectsBadTargetsAndDtypes) {
  Tensor h = Tensor::Zeros(DType::kF32, {3, 4}), w = Tensor::Zeros(DType::kF32, {6, 4});
  Tensor bad_target = FromInts({0, 6, 1});
  absl::StatusOr<float> loss =
      ops::LmHeadLossForward(Cpu(), {.hidden = h, .weight = w, .targets = bad_target}, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loss.status().message().find("targets[1] = 6"), std::string::npos) << loss.status();

  Tensor w_bf16 = Tensor::Zeros(DType::kBF16, {6, 4}), ok_target = FromInts({0, 5, 1});
  loss =
      ops::LmHeadLossForward(Cpu(), {.hidden = h, .weight = w_bf16, .targets = ok_target}, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LmHeadLossTest, CrossEntropyRowsMatchTheReferenceAndCheckArguments) {
  std::mt19937 rng(21);
  const int64_t rows = 4, v = 23;
  const std::vector<float> z = Normal(rng, rows * v, 0.0f, 3.0f);
  const std::vector<int32_t> y = {0, 22, 5, 5};
  const float scale = 0.3f;
  for (DType act : {DType::kF32, DType::kBF16}) {
    Tensor z_t = MakeTensor(DType::kF32, {rows, v}, z), y_t = FromInts(y);
    Tensor loss = Tensor::Empty(DType::kF32, {rows}), d = Tensor::Empty(act, {rows, v});
    ASSERT_OK(ops::CrossEntropyRows(Cpu(), z_t, y_t, loss, d, scale));
    std::vector<double> want_d(rows * v);
    for (int64_t r = 0; r < rows; ++r) {
      const double max = *std::max_element(z.begin() + r * v, z.begin() + (r + 1) * v);
      double sum = 0.0;
      for (int64_t i = 0; i < v; ++i) sum += std::exp(z[r * v + i] - max);
      const double lse = max + std::log(sum);
      EXPECT_NEAR(loss.data<float>()[r], lse - z[r * v + y[r]], 1e-5) << "row " << r;
      for (int64_t i = 0; i < v; ++i) {
        want_d[r * v + i] = scale * (std::exp(z[r * v + i] - lse) - (i == y[r] ? 1.0 : 0.0));
      }
    }
    EXPECT_LT(RelError(ToDoubles(d), want_d), act == DType::kBF16 ? 1e-2 : 1e-5);
    // Without d_logits: the losses only.
    Tensor z2 = MakeTensor(DType::kF32, {rows, v}, z), loss2 = Tensor::Empty(DType::kF32, {rows});
    ASSERT_OK(ops::CrossEntropyRows(Cpu(), z2, y_t, loss2, Tensor(), scale));
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(loss2.data<float>()[r], loss.data<float>()[r]);
  }
  Tensor z_t = MakeTensor(DType::kF32, {rows, v}, z), loss = Tensor::Empty(DType::kF32, {rows});
  const absl::Status bad =
      ops::CrossEntropyRows(Cpu(), z_t, FromInts({0, 1, 23, 2}), loss, Tensor(), scale);
  EXPECT_TRUE(
      test_util::IsInvalidArgument(bad, "targets[2] = 23 is outside the vocabulary [0, 23)"))
      << bad;
  EXPECT_EQ(ops::CrossEntropyRows(Cpu(), z_t, FromInts({0, 1, 2}), loss, Tensor(), scale).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::CrossEntropyRows(Cpu(), z_t, FromInts({0, 1, 2, 3}), loss,
                                  Tensor::Empty(DType::kF32, {rows, v + 1}), scale)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LmHeadLossTest, UniformLogitsGiveLogV) {
  // All-zero weights: every logit is 0, so the loss is log V exactly (up to rounding).
  const int64_t t = 9, d = 4, v = 37;
  Tensor h = MakeTensor(DType::kF32, {t, d}, std::vector<float>(t * d, 1.0f));
  Tensor w = Tensor::Zeros(DType::kF32, {v, d});
  Tensor y = FromInts({0, 1, 2, 3, 4, 5, 6, 7, 36});
  absl::StatusOr<float> loss = ops::LmHeadLossForward(
      Cpu(), {.hidden = h, .weight = w, .targets = y, .chunk_tokens = 4}, nullptr);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(37.0), 1e-6);
}

}  // namespace
}  // namespace moetrain::ops_test::layer_test
