// RMSNorm against a float64 reference.
#include "engine/ops/norm/rms_norm.h"

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

  Tensor x_t = MakeTensor(DType::kF32, {t, d}, x), w_t = MakeTensor(DType::kF32, {d}, w);
  Tensor out = Tensor::Empty(act, {t, d}), rstd = Tensor::Empty(DType::kF32, {t});
  ASSERT_OK(ops::RmsNormForward(Cpu(), x_t, w_t, eps, out, rstd));
  EXPECT_LT(RelError(ToDoubles(rstd), ref.rstd), 1e-6);
  EXPECT_LT(RelError(ToDoubles(out), ref.out), act == DType::kF32 ? 1e-6 : 8e-3);

  // Backward adds into d_weight, and into d_x when asked (the residual stream's gradient).
  std::vector<float> d_x0 = Normal(rng, t * d, 0.0f, 1.0f), d_w0 = Normal(rng, d, 0.0f, 1.0f);
  for (bool accumulate : {false, true}) {
    Tensor dy_t = MakeTensor(act, {t, d}, dy);
    Tensor d_x = MakeTensor(DType::kF32, {t, d}, d_x0), d_w = MakeTensor(DType::kF32, {d}, d_w0);
    ASSERT_OK(ops::RmsNormBackward(Cpu(), {.x = x_t,
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
  Tensor x = MakeTensor(DType::kF32, {t, d}, Normal(rng, t * d, 0.0f, 1.0f));
  Tensor w = MakeTensor(DType::kF32, {d}, Normal(rng, d, 1.0f, 0.1f));
  Tensor dy = MakeTensor(DType::kF32, {t, d}, Normal(rng, t * d, 0.0f, 1.0f));
  Tensor out = Tensor::Empty(DType::kF32, {t, d}), rstd = Tensor::Empty(DType::kF32, {t});
  ASSERT_OK(ops::RmsNormForward(Cpu(), x, w, 1e-6f, out, rstd));
  std::vector<double> first_dx, first_dw;
  for (int run = 0; run < 2; ++run) {
    Tensor d_x = Tensor::Empty(DType::kF32, {t, d}), d_w = Tensor::Zeros(DType::kF32, {d});
    ASSERT_OK(ops::RmsNormBackward(
        Cpu(), {.x = x, .weight = w, .rstd = rstd, .d_out = dy, .d_x = d_x, .d_weight = d_w}));
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
  EXPECT_EQ(ops::RmsNormForward(Cpu(), x, w, 1e-6f, out, rstd).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moetrain::ops_test::layer_test
