// RMSNorm, embedding and the fused LM-head cross-entropy against float64 references.
#include "engine/model/layers.h"

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

namespace moetrain {
namespace {

#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

std::vector<float> Normal(std::mt19937& rng, int64_t n, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

float RoundToBF16(float v) { return BF16ToFloat(FloatToBF16(v)); }

Tensor FromFloats(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = Tensor::Empty(dtype, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(values[i]);
    } else {
      t.data<float>()[i] = values[i];
    }
  }
  return t;
}

Tensor FromInts(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Empty(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

std::vector<double> ToDoubles(const TensorView& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = t.dtype() == DType::kBF16 ? BF16ToFloat(t.data<BF16>()[i]) : t.data<float>()[i];
  }
  return v;
}

// max |got − want| / max |want|: the error relative to the tensor's scale.
double RelError(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / std::max(scale, 1e-30);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

struct NormReference {
  std::vector<double> out, rstd, d_x, d_w;
};

NormReference RmsNormReference(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& dy, int64_t t, int64_t d, double eps) {
  NormReference ref;
  ref.out.resize(t * d);
  ref.rstd.resize(t);
  ref.d_x.resize(t * d);
  ref.d_w.assign(d, 0.0);
  for (int64_t r = 0; r < t; ++r) {
    double ms = 0.0;
    for (int64_t i = 0; i < d; ++i) ms += double{x[r * d + i]} * x[r * d + i];
    const double s = 1.0 / std::sqrt(ms / d + eps);
    ref.rstd[r] = s;
    for (int64_t i = 0; i < d; ++i) ref.out[r * d + i] = x[r * d + i] * s * w[i];
    // out_i = x_i·s·w_i with s = (Σx²/D + eps)^(-1/2): ∂s/∂x_j = −s³·x_j/D.
    double dot = 0.0;  // Σ_i dy_i·w_i·x_i
    for (int64_t i = 0; i < d; ++i) dot += double{dy[r * d + i]} * w[i] * x[r * d + i];
    for (int64_t j = 0; j < d; ++j) {
      ref.d_x[r * d + j] = double{dy[r * d + j]} * w[j] * s - dot * s * s * s * x[r * d + j] / d;
      ref.d_w[j] += double{dy[r * d + j]} * x[r * d + j] * s;
    }
  }
  return ref;
}

struct NormCase {
  int64_t tokens;
  int64_t hidden;
  DType act;
};

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << "T=" << c.tokens << " D=" << c.hidden << " " << DTypeName(c.act);
}

class RmsNormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormTest, MatchesFloat64Reference) {
  const auto [t, d, act] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(t * 131 + d));
  const float eps = 1e-5f;
  std::vector<float> x = Normal(rng, t * d, 0.3f, 2.0f);
  std::vector<float> w = Normal(rng, d, 1.0f, 0.3f);
  std::vector<float> dy = Normal(rng, t * d, 0.0f, 1.0f);
  if (act == DType::kBF16) {
    for (float& v : dy) v = RoundToBF16(v);
  }
  const NormReference ref = RmsNormReference(x, w, dy, t, d, eps);

  Tensor x_t = FromFloats(DType::kF32, {t, d}, x), w_t = FromFloats(DType::kF32, {d}, w);
  Tensor out = Tensor::Empty(act, {t, d}), rstd = Tensor::Empty(DType::kF32, {t});
  ASSERT_OK(RmsNormForward(x_t, w_t, eps, out, rstd));
  EXPECT_LT(RelError(ToDoubles(rstd), ref.rstd), 1e-6);
  EXPECT_LT(RelError(ToDoubles(out), ref.out), act == DType::kF32 ? 1e-6 : 8e-3);

  // Backward adds into d_weight, and into d_x when asked (the residual stream's gradient).
  std::vector<float> d_x0 = Normal(rng, t * d, 0.0f, 1.0f), d_w0 = Normal(rng, d, 0.0f, 1.0f);
  for (bool accumulate : {false, true}) {
    Tensor dy_t = FromFloats(act, {t, d}, dy);
    Tensor d_x = FromFloats(DType::kF32, {t, d}, d_x0), d_w = FromFloats(DType::kF32, {d}, d_w0);
    ASSERT_OK(RmsNormBackward({.x = x_t,
                               .weight = w_t,
                               .rstd = rstd,
                               .d_out = dy_t,
                               .d_x = d_x,
                               .d_weight = d_w,
                               .accumulate_d_x = accumulate}));
    std::vector<double> want_dx = ref.d_x, want_dw = ref.d_w;
    for (int64_t i = 0; i < t * d; ++i) want_dx[i] += accumulate ? d_x0[i] : 0.0;
    for (int64_t i = 0; i < d; ++i) want_dw[i] += d_w0[i];
    EXPECT_LT(RelError(ToDoubles(d_x), want_dx), 1e-5) << "accumulate " << accumulate;
    EXPECT_LT(RelError(ToDoubles(d_w), want_dw), 1e-5) << "accumulate " << accumulate;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormTest,
                         // (D = 1 is degenerate: the output is ±w whatever x, so d_x ≈ 0.)
                         ::testing::Values(NormCase{1, 3, DType::kF32},
                                           NormCase{37, 24, DType::kF32},
                                           NormCase{5, 70, DType::kF32},
                                           // Several blocks of the weight-gradient reduction.
                                           NormCase{1500, 48, DType::kF32},
                                           NormCase{37, 24, DType::kBF16}));

TEST(RmsNormTest, BackwardIsBitReproducible) {
  std::mt19937 rng(3);
  const int64_t t = 777, d = 40;
  Tensor x = FromFloats(DType::kF32, {t, d}, Normal(rng, t * d, 0.0f, 1.0f));
  Tensor w = FromFloats(DType::kF32, {d}, Normal(rng, d, 1.0f, 0.1f));
  Tensor dy = FromFloats(DType::kF32, {t, d}, Normal(rng, t * d, 0.0f, 1.0f));
  Tensor out = Tensor::Empty(DType::kF32, {t, d}), rstd = Tensor::Empty(DType::kF32, {t});
  ASSERT_OK(RmsNormForward(x, w, 1e-6f, out, rstd));
  std::vector<double> first_dx, first_dw;
  for (int run = 0; run < 2; ++run) {
    Tensor d_x = Tensor::Empty(DType::kF32, {t, d}), d_w = Tensor::Zeros(DType::kF32, {d});
    ASSERT_OK(RmsNormBackward(
        {.x = x, .weight = w, .rstd = rstd, .d_out = dy, .d_x = d_x, .d_weight = d_w}));
    if (run == 0) {
      first_dx = ToDoubles(d_x);
      first_dw = ToDoubles(d_w);
    } else {
      EXPECT_EQ(ToDoubles(d_x), first_dx);
      EXPECT_EQ(ToDoubles(d_w), first_dw);
    }
  }
}

TEST(RmsNormTest, RejectsMismatchedShapes) {
  Tensor x = Tensor::Zeros(DType::kF32, {4, 8}), w = Tensor::Zeros(DType::kF32, {7});
  Tensor out = Tensor::Empty(DType::kF32, {4, 8}), rstd = Tensor::Empty(DType::kF32, {4});
  EXPECT_EQ(RmsNormForward(x, w, 1e-6f, out, rstd).code(), absl::StatusCode::kInvalidArgument);
}

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
  Tensor table_t = FromFloats(DType::kF32, {v, d}, table), tokens = FromInts(ids);
  Tensor out = Tensor::Empty(DType::kF32, {t, d});
  ASSERT_OK(EmbeddingForward(table_t, tokens, out));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < d; ++i) ASSERT_EQ(out.data<float>()[r * d + i], table[ids[r] * d + i]);
  }

  Tensor dy_t = FromFloats(DType::kF32, {t, d}, dy);
  Tensor d_table = FromFloats(DType::kF32, {v, d}, d_table0);
  ASSERT_OK(EmbeddingBackward(tokens, dy_t, d_table));
  std::vector<double> want(d_table0.begin(), d_table0.end());
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < d; ++i) want[ids[r] * d + i] += dy[r * d + i];
  }
  EXPECT_LT(RelError(ToDoubles(d_table), want), 1e-6);
}

TEST(EmbeddingTest, RejectsTokensOutsideTheVocabulary) {
  Tensor table = Tensor::Zeros(DType::kF32, {5, 4}), out = Tensor::Empty(DType::kF32, {3, 4});
  for (int32_t bad : {-1, 5}) {
    Tensor tokens = FromInts({1, bad, 2});
    const absl::Status status = EmbeddingForward(table, tokens, out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("tokens[1]"), std::string::npos) << status;
    EXPECT_EQ(EmbeddingBackward(tokens, out, table).code(), absl::StatusCode::kInvalidArgument);
  }
}

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

  Tensor h_t = FromFloats(DType::kF32, {t, d}, h), w_t = FromFloats(DType::kF32, {v, d}, w);
  Tensor y_t = FromInts(y);
  const LmHeadLossArgs args = {.hidden = h_t, .weight = w_t, .targets = y_t, .chunk_tokens = chunk};
  LmHeadLossWorkspace workspace;
  absl::StatusOr<float> loss = LmHeadLossForward(args, &workspace);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_LT(std::abs(*loss - ref.loss) / ref.loss, 1e-6);

  std::vector<float> d_w0 = Normal(rng, v * d, 0.0f, 0.01f);
  Tensor d_h = Tensor::Empty(DType::kF32, {t, d}), d_w = FromFloats(DType::kF32, {v, d}, d_w0);
  loss = LmHeadLossForwardBackward(
      args, {.d_loss = static_cast<float>(d_loss), .d_hidden = d_h, .d_weight = d_w}, &workspace);
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
  Tensor h_t = FromFloats(DType::kBF16, {t, d}, h), w_t = FromFloats(DType::kBF16, {v, d}, w);
  Tensor y_t = FromInts(y);
  Tensor d_h = Tensor::Empty(DType::kF32, {t, d}), d_w = Tensor::Zeros(DType::kF32, {v, d});
  absl::StatusOr<float> loss =
      LmHeadLossForwardBackward({.hidden = h_t, .weight = w_t, .targets = y_t, .chunk_tokens = 16},
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
      LmHeadLossForward({.hidden = h, .weight = w, .targets = bad_target}, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loss.status().message().find("targets[1] = 6"), std::string::npos) << loss.status();

  Tensor w_bf16 = Tensor::Zeros(DType::kBF16, {6, 4}), ok_target = FromInts({0, 5, 1});
  loss = LmHeadLossForward({.hidden = h, .weight = w_bf16, .targets = ok_target}, nullptr);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LmHeadLossTest, UniformLogitsGiveLogV) {
  // All-zero weights: every logit is 0, so the loss is log V exactly (up to rounding).
  const int64_t t = 9, d = 4, v = 37;
  Tensor h = FromFloats(DType::kF32, {t, d}, std::vector<float>(t * d, 1.0f));
  Tensor w = Tensor::Zeros(DType::kF32, {v, d});
  Tensor y = FromInts({0, 1, 2, 3, 4, 5, 6, 7, 36});
  absl::StatusOr<float> loss =
      LmHeadLossForward({.hidden = h, .weight = w, .targets = y, .chunk_tokens = 4}, nullptr);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, std::log(37.0), 1e-6);
}

}  // namespace
}  // namespace moetrain
