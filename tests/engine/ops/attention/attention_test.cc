// The causal attention core and RoPE (alone and chained as a block runs them) against a float64
// reference.
#include "engine/ops/attention/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/ops/rope/rope.h"

namespace moetrain::ops {
namespace {

ExecContext Cpu() { return ExecContext::Cpu(); }

using Vec = std::vector<double>;

struct Dims {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  AttentionShape shape() const { return {batch, seq_len, heads, kv_heads, head_dim}; }
  int64_t rows() const { return batch * seq_len; }
};

std::string Name(const Dims& d) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "B%ld_S%ld_H%ld_Hkv%ld_Dh%ld", static_cast<long>(d.batch),
                static_cast<long>(d.seq_len), static_cast<long>(d.heads),
                static_cast<long>(d.kv_heads), static_cast<long>(d.head_dim));
  return buf;
}

Vec Random(std::mt19937& rng, int64_t n, double stddev = 1.0) {
  std::normal_distribution<double> normal(0.0, stddev);
  Vec x(n);
  for (double& v : x) v = normal(rng);
  return x;
}

// ‖a − b‖ / ‖b‖; ‖a‖ when b is exactly zero (d_q and d_k with one position: the softmax over a
// single key has no gradient, and inputs are O(1), so rounding leaves ‖a‖ ~ 1e-7).
double RelErr(const Vec& a, const Vec& b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ---- The float64 reference: full S×S scores, a causal mask, a plain softmax. ----

// x (B·S, heads·Dh) rotated at positions 0..S−1 (rotate-half); inverse rotates back.
Vec RefRope(const Vec& x, const Dims& d, int64_t heads, double theta, bool inverse) {
  Vec y = x;
  const int64_t half = d.head_dim / 2;
  for (int64_t row = 0; row < d.rows(); ++row) {
    const double pos = static_cast<double>(row % d.seq_len);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * std::pow(theta, -2.0 * static_cast<double>(i) / d.head_dim);
        const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
        const int64_t at = row * heads * d.head_dim + h * d.head_dim + i;
        y[at] = x[at] * c - x[at + half] * s;
        y[at + half] = x[at + half] * c + x[at] * s;
      }
    }
  }
  return y;
}

struct RefProbs {
  // P[(b, h)][i][j], zero above the diagonal; lse (B, H, S).
  std::vector<Vec> p;
  Vec lse;
};

double QK(const Vec& q, const Vec& k, const Dims& d, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t hk = h / (d.heads / d.kv_heads);
  double s = 0.0;
  for (int64_t e = 0; e < d.head_dim; ++e) {
    s += q[(b * d.seq_len + i) * d.heads * d.head_dim + h * d.head_dim + e] *
         k[(b * d.seq_len + j) * d.kv_heads * d.head_dim + hk * d.head_dim + e];
  }
  return s / std::sqrt(static_cast<double>(d.head_dim));
}

RefProbs RefSoftmax(const Vec& q, const Vec& k, const Dims& d) {
  RefProbs r;
  r.lse.assign(d.batch * d.heads * d.seq_len, 0.0);
  const int64_t S = d.seq_len;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      Vec p(S * S, 0.0);
      for (int64_t i = 0; i < S; ++i) {
        Vec scores(S, -INFINITY);
        for (int64_t j = 0; j <= i; ++j) scores[j] = QK(q, k, d, b, h, i, j);
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[j] - max);
        for (int64_t j = 0; j <= i; ++j) p[i * S + j] = std::exp(scores[j] - max) / sum;
        r.lse[(b * d.heads + h) * S + i] = max + std::log(sum);
      }
      r.p.push_back(std::move(p));
    }
  }
  return r;
}

struct RefOut {
  Vec out, lse;
};

RefOut RefForward(const Vec& q, const Vec& k, const Vec& v, const Dims& d) {
  RefProbs probs = RefSoftmax(q, k, d);
  const int64_t S = d.seq_len, Dh = d.head_dim, group = d.heads / d.kv_heads;
  Vec out(d.rows() * d.heads * Dh, 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const Vec& p = probs.p[b * d.heads + h];
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < Dh; ++e) {
            out[(b * S + i) * d.heads * Dh + h * Dh + e] +=
                p[i * S + j] * v[(b * S + j) * d.kv_heads * Dh + (h / group) * Dh + e];
          }
        }
      }
    }
  }
  return {std::move(out), std::move(probs.lse)};
}

struct RefGrads {
  Vec dq, dk, dv;
};

// Through the softmax Jacobian (D_i = Σ_j P_ij·dP_ij), not the ⟨dO, O⟩ shortcut of the engine.
RefGrads RefBackward(const Vec& q, const Vec& k, const Vec& v, const Vec& d_out, const Dims& d) {
  RefProbs probs = RefSoftmax(q, k, d);
  const int64_t S = d.seq_len, Dh = d.head_dim, group = d.heads / d.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  RefGrads g{Vec(q.size(), 0.0), Vec(k.size(), 0.0), Vec(v.size(), 0.0)};
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return (b * S + i) * d.heads * Dh + h * Dh; };
  auto kj = [&](int64_t b, int64_t j, int64_t hk) {
    return (b * S + j) * d.kv_heads * Dh + hk * Dh;
  };
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const Vec& p = probs.p[b * d.heads + h];
      const int64_t hk = h / group;
      for (int64_t i = 0; i < S; ++i) {
        Vec dp(i + 1, 0.0);
        double dsum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < Dh; ++e) dp[j] += d_out[qi(b, i, h) + e] * v[kj(b, j, hk) + e];
          dsum += p[i * S + j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[i * S + j] * (dp[j] - dsum);
          for (int64_t e = 0; e < Dh; ++e) {
            g.dv[kj(b, j, hk) + e] += p[i * S + j] * d_out[qi(b, i, h) + e];
            g.dq[qi(b, i, h) + e] += ds * k[kj(b, j, hk) + e] * scale;
            g.dk[kj(b, j, hk) + e] += ds * q[qi(b, i, h) + e] * scale;
          }
        }
      }
    }
  }
  return g;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- The engine, on float copies. ----

Tensor ToTensor(const Vec& x, std::initializer_list<int64_t> shape) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  for (size_t i = 0; i < x.size(); ++i) t.data<float>()[i] = static_cast<float>(x[i]);
  return t;
}

Vec ToVec(const Tensor& t) { return Vec(t.data<float>(), t.data<float>() + t.numel()); }

struct EngineRun {
  Tensor q, k, v, out, lse, d_out, d_q, d_k, d_v;
};

EngineRun RunEngine(const Vec& q, const Vec& k, const Vec& v, const Vec& d_out, const Dims& d) {
  const int64_t R = d.rows(), qc = d.heads * d.head_dim, kc = d.kv_heads * d.head_dim;
  EngineRun r{ToTensor(q, {R, qc}),
              ToTensor(k, {R, kc}),
              ToTensor(v, {R, kc}),
              Tensor::Empty(DType::kF32, {R, qc}),
              Tensor::Empty(DType::kF32, {d.batch, d.heads, d.seq_len}),
              ToTensor(d_out, {R, qc}),
              Tensor::Empty(DType::kF32, {R, qc}),
              Tensor::Empty(DType::kF32, {R, kc}),
              Tensor::Empty(DType::kF32, {R, kc})};
  EXPECT_TRUE(CausalAttentionForward(Cpu(), d.shape(), r.q, r.k, r.v, r.out, r.lse).ok());
  EXPECT_TRUE(CausalAttentionBackward(Cpu(), d.shape(), r.q, r.k, r.v, r.out, r.lse, r.d_out, r.d_q,
                                      r.d_k, r.d_v)
                  .ok());
  return r;
}

bool BitEqual(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<float>(), b.data<float>(), sizeof(float) * a.numel()) == 0;
}

struct Inputs {
  Vec q, k, v, d_out;
};

Inputs RandomInputs(const Dims& d, uint32_t seed, double q_stddev = 1.0) {
  std::mt19937 rng(seed);
  return {Random(rng, d.rows() * d.heads * d.head_dim, q_stddev),
          Random(rng, d.rows() * d.kv_heads * d.head_dim),
          Random(rng, d.rows() * d.kv_heads * d.head_dim),
          Random(rng, d.rows() * d.heads * d.head_dim)};
}

// ---- The reference is proven against central differences of its own forward. ----

TEST(AttentionReferenceTest, BackwardMatchesFiniteDifferences) {
  for (const Dims d : {Dims{1, 5, 2, 2, 4}, Dims{2, 4, 4, 2, 2}, Dims{1, 6, 3, 1, 6}}) {
    Inputs in = RandomInputs(d, 7);
    const RefGrads g = RefBackward(in.q, in.k, in.v, in.d_out, d);
    auto loss = [&](const Vec& q, const Vec& k, const Vec& v) {
      return Dot(RefForward(q, k, v, d).out, in.d_out);
    };
    constexpr double kStep = 1e-5;
    for (int which = 0; which < 3; ++which) {
      Vec* x = which == 0 ? &in.q : which == 1 ? &in.k : &in.v;
      const Vec& analytic = which == 0 ? g.dq : which == 1 ? g.dk : g.dv;
      Vec numeric(x->size());
      for (size_t i = 0; i < x->size(); ++i) {
        const double saved = (*x)[i];
        (*x)[i] = saved + kStep;
        const double up = loss(in.q, in.k, in.v);
        (*x)[i] = saved - kStep;
        const double down = loss(in.q, in.k, in.v);
        (*x)[i] = saved;
        numeric[i] = (up - down) / (2 * kStep);
      }
      EXPECT_LT(RelErr(analytic, numeric), 1e-7) << Name(d) << " input " << which;
    }
  }
}

TEST(AttentionReferenceTest, RopeBackwardIsInverseRotation) {
  // d/dx Σ w ⊙ rope(x) = rope⁻¹(w): the rotation is orthogonal.
  const Dims d{2, 5, 2, 2, 6};
  std::mt19937 rng(11);
  Vec x = Random(rng, d.rows() * d.heads * d.head_dim);
  const Vec w = Random(rng, x.size());
  Vec numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + 1e-5;
    const double up = Dot(RefRope(x, d, d.heads, 10000.0, false), w);
    x[i] = saved - 1e-5;
    const double down = Dot(RefRope(x, d, d.heads, 10000.0, false), w);
    x[i] = saved;
    numeric[i] = (up - down) / 2e-5;
  }
  EXPECT_LT(RelErr(RefRope(w, d, d.heads, 10000.0, true), numeric), 1e-8);
}

// ---- The engine against the reference. ----

class AttentionMatchesReference : public ::testing::TestWithParam<Dims> {};

TEST_P(AttentionMatchesReference, ForwardAndGradients) {
  const Dims d = GetParam();
  const Inputs in = RandomInputs(d, 1234);
  const RefOut ref = RefForward(in.q, in.k, in.v, d);
  const RefGrads grads = RefBackward(in.q, in.k, in.v, in.d_out, d);
  const EngineRun run = RunEngine(in.q, in.k, in.v, in.d_out, d);
  const double errs[] = {RelErr(ToVec(run.out), ref.out), RelErr(ToVec(run.lse), ref.lse),
                         RelErr(ToVec(run.d_q), grads.dq), RelErr(ToVec(run.d_k), grads.dk),
                         RelErr(ToVec(run.d_v), grads.dv)};
  const char* names[] = {"out", "lse", "d_q", "d_k", "d_v"};
  for (int i = 0; i < 5; ++i) EXPECT_LT(errs[i], 1e-5) << Name(d) << " " << names[i];
  std::printf("%-24s out %.1e lse %.1e d_q %.1e d_k %.1e d_v %.1e\n", Name(d).c_str(), errs[0],
              errs[1], errs[2], errs[3], errs[4]);
}

std::vector<Dims> ReferenceDims() {
  std::vector<Dims> dims;
  for (int64_t s : {1, 7, 64, 65, 130}) {
    for (int64_t b : {1, 3}) {
      for (int64_t kv : {2, 1}) {
        for (int64_t dh : {8, 64}) dims.push_back({b, s, kv == 2 ? 2 : 4, kv, dh});
      }
    }
  }
  dims.push_back({2, 200, 8, 2, 16});  // several blocks per head, GQA group 4
  dims.push_back({1, 129, 3, 3, 2});   // the smallest head
  return dims;
}

INSTANTIATE_TEST_SUITE_P(Sizes, AttentionMatchesReference, ::testing::ValuesIn(ReferenceDims()),
                         [](const ::testing::TestParamInfo<Dims>& info) {
                           return Name(info.param);
                         });

TEST(AttentionTest, SharpScoresExerciseTheOnlineMax) {
  // Scores of a few tens, so the running max changes between key blocks and e^(s − m) spans the
  // whole f32 range.
  const Dims d{1, 190, 2, 1, 32};
  const Inputs in = RandomInputs(d, 99, 6.0);
  const RefOut ref = RefForward(in.q, in.k, in.v, d);
  const RefGrads grads = RefBackward(in.q, in.k, in.v, in.d_out, d);
  const EngineRun run = RunEngine(in.q, in.k, in.v, in.d_out, d);
  EXPECT_LT(RelErr(ToVec(run.out), ref.out), 1e-5);
  EXPECT_LT(RelErr(ToVec(run.lse), ref.lse), 1e-5);
  EXPECT_LT(RelErr(ToVec(run.d_q), grads.dq), 1e-5);
  EXPECT_LT(RelErr(ToVec(run.d_k), grads.dk), 1e-5);
  EXPECT_LT(RelErr(ToVec(run.d_v), grads.dv), 1e-5);
}

// The layer as the model runs it: rope(q), rope(k), attention; gradients of the unrotated q and k
// by the inverse rotation, against the reference chain (itself checked by finite differences).
TEST(AttentionTest, RopeThenAttentionMatchesReferenceChain) {
  const double theta = 10000.0;
  const Dims tiny{1, 5, 2, 1, 4};
  const Dims dims[] = {tiny, {2, 97, 4, 2, 16}};
  for (const Dims& d : dims) {
    Inputs in = RandomInputs(d, 5);
    auto chain_grads = [&](const Vec& q, const Vec& k) {
      RefGrads g = RefBackward(RefRope(q, d, d.heads, theta, false),
                               RefRope(k, d, d.kv_heads, theta, false), in.v, in.d_out, d);
      g.dq = RefRope(g.dq, d, d.heads, theta, true);
      g.dk = RefRope(g.dk, d, d.kv_heads, theta, true);
      return g;
    };
    const RefGrads ref = chain_grads(in.q, in.k);
    if (d.seq_len == tiny.seq_len) {
      auto loss = [&]() {
        return Dot(RefForward(RefRope(in.q, d, d.heads, theta, false),
                              RefRope(in.k, d, d.kv_heads, theta, false), in.v, d)
                       .out,
                   in.d_out);
      };
      for (int which = 0; which < 2; ++which) {
        Vec& x = which == 0 ? in.q : in.k;
        Vec numeric(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          const double saved = x[i];
          x[i] = saved + 1e-5;
          const double up = loss();
          x[i] = saved - 1e-5;
          const double down = loss();
          x[i] = saved;
          numeric[i] = (up - down) / 2e-5;
        }
        EXPECT_LT(RelErr(which == 0 ? ref.dq : ref.dk, numeric), 1e-7);
      }
      continue;
    }
    const int64_t R = d.rows();
    Tensor q = ToTensor(in.q, {R, d.heads * d.head_dim});
    Tensor k = ToTensor(in.k, {R, d.kv_heads * d.head_dim});
    ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), theta, false, q).ok());
    ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), theta, false, k).ok());
    EXPECT_LT(RelErr(ToVec(q), RefRope(in.q, d, d.heads, theta, false)), 1e-6);
    EXPECT_LT(RelErr(ToVec(k), RefRope(in.k, d, d.kv_heads, theta, false)), 1e-6);
    EngineRun run = RunEngine(ToVec(q), ToVec(k), in.v, in.d_out, d);
    ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), theta, true, run.d_q).ok());
    ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), theta, true, run.d_k).ok());
    const double errs[] = {RelErr(ToVec(run.d_q), ref.dq), RelErr(ToVec(run.d_k), ref.dk),
                           RelErr(ToVec(run.d_v), ref.dv)};
    for (double e : errs) EXPECT_LT(e, 1e-5);
    std::printf("rope chain %s d_q %.1e d_k %.1e d_v %.1e\n", Name(d).c_str(), errs[0], errs[1],
                errs[2]);
  }
}

// ---- RoPE. ----

TEST(RopeTest, InverseIsIdentityPositionZeroFixedPairNormsKept) {
  const Dims d{3, 300, 4, 4, 64};
  std::mt19937 rng(3);
  const Vec x = Random(rng, d.rows() * d.heads * d.head_dim);
  Tensor t = ToTensor(x, {d.rows(), d.heads * d.head_dim});
  ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), 500000.0f, false, t).ok());
  const Vec rotated = ToVec(t);
  const int64_t cols = d.heads * d.head_dim, half = d.head_dim / 2;
  EXPECT_LT(RelErr(rotated, RefRope(x, d, d.heads, 500000.0, false)), 1e-6);
  double worst_norm = 0.0;
  for (int64_t row = 0; row < d.rows(); ++row) {
    for (int64_t c = 0; c < cols; ++c) {
      const double before = static_cast<float>(x[row * cols + c]);
      if (row % d.seq_len == 0) {
        ASSERT_EQ(rotated[row * cols + c], before) << "row " << row;
      }
      if (c % d.head_dim >= half) continue;
      const double xa = static_cast<float>(x[row * cols + c]);
      const double xb = static_cast<float>(x[row * cols + c + half]);
      const double ya = rotated[row * cols + c], yb = rotated[row * cols + c + half];
      worst_norm = std::max(worst_norm, std::fabs(std::hypot(ya, yb) / std::hypot(xa, xb) - 1));
    }
  }
  EXPECT_LT(worst_norm, 1e-6);
  ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), 500000.0f, true, t).ok());
  Vec x_float(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_float[i] = static_cast<float>(x[i]);
  EXPECT_LT(RelErr(ToVec(t), x_float), 1e-6);
}

TEST(RopeTest, KvHeadsAndLongSequences) {
  const Dims d{1, 4096, 4, 1, 128};
  std::mt19937 rng(4);
  const Vec x = Random(rng, d.rows() * d.kv_heads * d.head_dim);
  Tensor t = ToTensor(x, {d.rows(), d.kv_heads * d.head_dim});
  ASSERT_TRUE(ApplyRope(Cpu(), d.shape(), 10000.0f, false, t).ok());
  EXPECT_LT(RelErr(ToVec(t), RefRope(x, d, d.kv_heads, 10000.0, false)), 1e-6);
}

// ---- Causality and determinism. ----

TEST(AttentionTest, LaterTokensDoNotChangeEarlierOutputs) {
  const Dims d{2, 150, 4, 2, 16};
  const Inputs in = RandomInputs(d, 21);
  const EngineRun base = RunEngine(in.q, in.k, in.v, in.d_out, d);
  for (int64_t p : {0, 30, 63, 64, 127, 148}) {
    Inputs changed = in;
    std::mt19937 rng(static_cast<uint32_t>(p) + 100);
    std::normal_distribution<double> normal(0.0, 3.0);
    for (int64_t row = 0; row < d.rows(); ++row) {
      if (row % d.seq_len <= p) continue;
      for (int64_t c = 0; c < d.heads * d.head_dim; ++c) {
        changed.q[row * d.heads * d.head_dim + c] = normal(rng);
        changed.d_out[row * d.heads * d.head_dim + c] = normal(rng);
      }
      for (int64_t c = 0; c < d.kv_heads * d.head_dim; ++c) {
        changed.k[row * d.kv_heads * d.head_dim + c] = normal(rng);
        changed.v[row * d.kv_heads * d.head_dim + c] = normal(rng);
      }
    }
    const EngineRun run = RunEngine(changed.q, changed.k, changed.v, changed.d_out, d);
    const int64_t qc = d.heads * d.head_dim;
    for (int64_t b = 0; b < d.batch; ++b) {
      const int64_t first = b * d.seq_len, n = (p + 1) * qc;
      EXPECT_EQ(0, std::memcmp(run.out.data<float>() + first * qc,
                               base.out.data<float>() + first * qc, sizeof(float) * n))
          << "out, p = " << p;
      // d_q at a position reads only keys, values and d_out at or before it.
      EXPECT_EQ(0, std::memcmp(run.d_q.data<float>() + first * qc,
                               base.d_q.data<float>() + first * qc, sizeof(float) * n))
          << "d_q, p = " << p;
      for (int64_t h = 0; h < d.heads; ++h) {
        const int64_t at = (b * d.heads + h) * d.seq_len;
        EXPECT_EQ(0, std::memcmp(run.lse.data<float>() + at, base.lse.data<float>() + at,
                                 sizeof(float) * (p + 1)))
            << "lse, p = " << p;
      }
    }
  }
}

TEST(AttentionTest, RunsAreBitIdentical) {
  const Dims d{2, 300, 8, 2, 64};
  const Inputs in = RandomInputs(d, 8);
  const EngineRun first = RunEngine(in.q, in.k, in.v, in.d_out, d);
  const EngineRun second = RunEngine(in.q, in.k, in.v, in.d_out, d);
  EXPECT_TRUE(BitEqual(first.out, second.out));
  EXPECT_TRUE(BitEqual(first.lse, second.lse));
  EXPECT_TRUE(BitEqual(first.d_q, second.d_q));
  EXPECT_TRUE(BitEqual(first.d_k, second.d_k));
  EXPECT_TRUE(BitEqual(first.d_v, second.d_v));
}

// ---- Argument errors name the tensor or field and its value. ----

TEST(AttentionTest, ErrorsNameTheArgument) {
  const Dims d{2, 10, 4, 2, 8};
  const AttentionShape shape = d.shape();
  const int64_t R = d.rows();
  Tensor q = Tensor::Zeros(DType::kF32, {R, 32}), kv = Tensor::Zeros(DType::kF32, {R, 16});
  Tensor out = Tensor::Zeros(DType::kF32, {R, 32}), lse = Tensor::Zeros(DType::kF32, {2, 4, 10});
  Tensor d_q = Tensor::Zeros(DType::kF32, {R, 32}), d_kv = Tensor::Zeros(DType::kF32, {R, 16});
  Tensor wide = Tensor::Zeros(DType::kF32, {R, 40}), bf16 = Tensor::Zeros(DType::kBF16, {R, 32});
  Tensor lse_swapped = Tensor::Zeros(DType::kF32, {2, 10, 4});
  ASSERT_TRUE(CausalAttentionForward(Cpu(), shape, q, kv, kv, out, lse).ok());
  ASSERT_TRUE(
      CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse, out, d_q, d_kv, d_kv).ok());

  auto expect_error = [](const absl::Status& status, const std::string& needle) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(needle), std::string::npos) << status;
  };
  expect_error(CausalAttentionForward(Cpu(), shape, wide, kv, kv, out, lse),
               "q: expected (20, 32) f32");
  expect_error(CausalAttentionForward(Cpu(), shape, q, q, kv, out, lse),
               "k: expected (20, 16) f32");
  expect_error(CausalAttentionForward(Cpu(), shape, q, kv, q, out, lse), "v:");
  expect_error(CausalAttentionForward(Cpu(), shape, q, kv, kv, bf16, lse),
               "out: expected (20, 32) f32, got (20, 32) bf16");
  expect_error(CausalAttentionForward(Cpu(), shape, q, kv, kv, out, lse_swapped),
               "lse: expected (2, 4, 10)");
  expect_error(CausalAttentionForward(Cpu(), shape, q, kv, kv, out, TensorView()), "lse:");
  expect_error(
      CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse_swapped, out, d_q, d_kv, d_kv),
      "lse:");
  expect_error(CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse, wide, d_q, d_kv, d_kv),
               "d_out:");
  expect_error(CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse, out, kv, d_kv, d_kv),
               "d_q:");
  expect_error(CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse, out, d_q, q, d_kv),
               "d_k:");
  expect_error(CausalAttentionBackward(Cpu(), shape, q, kv, kv, out, lse, out, d_q, d_kv, q),
               "d_v:");
  const int64_t strides[] = {40, 1};
  const int64_t dims[] = {R, 32};
  const TensorView strided(wide.data<float>(), DType::kF32, dims, strides);
  expect_error(CausalAttentionForward(Cpu(), shape, strided, kv, kv, out, lse),
               "q: must be contiguous");

  AttentionShape bad = shape;
  bad.num_kv_heads = 3;
  expect_error(CausalAttentionForward(Cpu(), bad, q, kv, kv, out, lse),
               "shape.num_kv_heads = 3 does not divide shape.num_heads = 4");
  bad = shape;
  bad.head_dim = 7;
  expect_error(CausalAttentionBackward(Cpu(), bad, q, kv, kv, out, lse, out, d_q, d_kv, d_kv),
               "shape.head_dim = 7 must be even");
  bad = shape;
  bad.batch = 0;
  expect_error(CausalAttentionForward(Cpu(), bad, q, kv, kv, out, lse), "shape.batch = 0");
  expect_error(ApplyRope(Cpu(), bad, 10000.0f, false, q), "shape.batch = 0");
  expect_error(ApplyRope(Cpu(), shape, 10000.0f, false, Tensor::Zeros(DType::kF32, {R, 12})),
               "x: 12 columns are not a positive multiple of shape.head_dim = 8");
  expect_error(ApplyRope(Cpu(), shape, 10000.0f, false, Tensor::Zeros(DType::kF32, {R + 1, 32})),
               "x: expected (20, -1) f32");
  expect_error(ApplyRope(Cpu(), shape, -1.0f, false, q), "theta = -1");
  expect_error(ApplyRope(Cpu(), shape, 10000.0f, false, bf16), "x:");
}

}  // namespace
}  // namespace moetrain::ops
