// The MLA layout ops (ops/mla/mla.h) against a float64 reference written as DeepSeek-V3 defines
// MLA: per head q = [q_nope | rope(q_pe)], k = [k_nope | rope(k_pe)] with interleaved RoPE (pair
// (x_2i, x_2i+1) rotated by p·θ^(−2i/rope)), v = kv's value part. The ops store the rope features
// de-interleaved, so q and k are compared through what the attention core reads of them: every
// q·k dot product of a head, at every pair of positions, and the nope features themselves. The
// backward is the adjoint of the (linear) forward: ⟨F(x), g⟩ = ⟨x, B(g)⟩ on random x and g.
// Fresh random inputs each run (the seed is printed with a failure); edges: no nope features,
// values as wide as the keys (no padding), one head, one position, odd sequence lengths.
#include "engine/ops/mla/mla.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

struct Inputs {
  std::vector<float> q_full, k_rope, kv;
};

Inputs RandomInputs(const ops::MlaShape& s, std::mt19937& rng) {
  const int64_t t = s.tokens(), h = s.num_heads;
  return {Uniform(t * h * s.qk_head_dim(), -2.0f, 2.0f, rng),
          Uniform(t * s.qk_rope, -2.0f, 2.0f, rng),
          Uniform(t * h * (s.qk_nope + s.v_head_dim), -2.0f, 2.0f, rng)};
}

// Interleaved RoPE of `x` (rope features) at position p, in double, as DeepSeek-V3 applies it.
std::vector<double> InterleavedRope(const float* x, int64_t rope, int64_t p, float theta) {
  std::vector<double> out(rope);
  for (int64_t i = 0; i < rope / 2; ++i) {
    const double angle = static_cast<double>(p) * std::pow(double{theta}, -2.0 * i / rope);
    const double c = std::cos(angle), sn = std::sin(angle);
    out[2 * i] = x[2 * i] * c - x[2 * i + 1] * sn;
    out[2 * i + 1] = x[2 * i + 1] * c + x[2 * i] * sn;
  }
  return out;
}

struct Outputs {
  Tensor q, k, v;
};

Outputs RunForward(const ExecContext& ctx, const ops::MlaShape& s, float theta, Inputs in) {
  const int64_t t = s.tokens(), wide = s.num_heads * s.qk_head_dim();
  Tensor q_full = MakeAct(DType::kF32, {t, wide}, in.q_full);
  Tensor k_rope = MakeAct(DType::kF32, {t, s.qk_rope}, in.k_rope);
  Tensor kv = MakeAct(DType::kF32, {t, s.num_heads * (s.qk_nope + s.v_head_dim)}, in.kv);
  Outputs out{NaNAct(DType::kF32, {t, wide}), NaNAct(DType::kF32, {t, wide}),
              NaNAct(DType::kF32, {t, wide})};
  EXPECT_TRUE(ops::MlaQkvForward(ctx, s, theta, q_full, k_rope, kv, out.q, out.k, out.v).ok());
  return out;
}

void ExpectMatchesReference(const ops::MlaShape& s, float theta, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << s.batch << " S=" << s.seq_len << " H=" << s.num_heads
               << " nope=" << s.qk_nope << " rope=" << s.qk_rope << " v=" << s.v_head_dim);
  const Inputs in = RandomInputs(s, rng);
  const Outputs out = RunForward(Cpu(), s, theta, in);
  const int64_t h_count = s.num_heads, dqk = s.qk_head_dim(), nope = s.qk_nope;
  const int64_t kv_width = nope + s.v_head_dim;
  const float* q = out.q.data<float>();
  const float* k = out.k.data<float>();
  const float* v = out.v.data<float>();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < h_count; ++h) {
      for (int64_t i = 0; i < s.seq_len; ++i) {
        const int64_t ti = b * s.seq_len + i, row_i = ti * h_count + h;
        const std::vector<double> q_pe =
            InterleavedRope(&in.q_full[row_i * dqk + nope], s.qk_rope, i, theta);
        for (int64_t f = 0; f < nope; ++f) {
          ASSERT_EQ(q[row_i * dqk + f], in.q_full[row_i * dqk + f]);
          ASSERT_EQ(k[row_i * dqk + f], in.kv[row_i * kv_width + f]);
        }
        for (int64_t f = 0; f < dqk; ++f) {
          const float want = f < s.v_head_dim ? in.kv[row_i * kv_width + nope + f] : 0.0f;
          ASSERT_EQ(v[row_i * dqk + f], want) << "v feature " << f;
        }
        for (int64_t j = 0; j < s.seq_len; ++j) {
          const int64_t tj = b * s.seq_len + j, row_j = tj * h_count + h;
          const std::vector<double> k_pe =
              InterleavedRope(&in.k_rope[tj * s.qk_rope], s.qk_rope, j, theta);
          double want = 0, got = 0, scale = 0;
          for (int64_t f = 0; f < nope; ++f) {
            want += double{in.q_full[row_i * dqk + f]} * in.kv[row_j * kv_width + f];
          }
          for (int64_t f = 0; f < s.qk_rope; ++f) want += q_pe[f] * k_pe[f];
          for (int64_t f = 0; f < dqk; ++f) {
            got += double{q[row_i * dqk + f]} * k[row_j * dqk + f];
            scale += std::fabs(double{q[row_i * dqk + f]} * k[row_j * dqk + f]);
          }
          ASSERT_NEAR(got, want, 1e-6 * (1.0 + scale)) << "q" << i << "·k" << j << " head " << h;
        }
      }
    }
  }
}

const ops::MlaShape kShapes[] = {
    {.batch = 2, .seq_len = 5, .num_heads = 3, .qk_nope = 4, .qk_rope = 6, .v_head_dim = 7},
    {.batch = 1, .seq_len = 1, .num_heads = 1, .qk_nope = 0, .qk_rope = 2, .v_head_dim = 2},
    {.batch = 3, .seq_len = 7, .num_heads = 2, .qk_nope = 8, .qk_rope = 4, .v_head_dim = 12},
    {.batch = 1, .seq_len = 33, .num_heads = 4, .qk_nope = 16, .qk_rope = 8, .v_head_dim = 1},
};

TEST(MlaTest, ForwardMatchesDeepSeekV3sDefinition) {
  MOETRAIN_FRESH_RNG(rng);
  for (const ops::MlaShape& s : kShapes) ExpectMatchesReference(s, 10000.0f, rng);
  ExpectMatchesReference(kShapes[0], 50.0f, rng);  // large angles at late positions
}

// ⟨F(x), g⟩ against ⟨x, B(g)⟩ in double, for the qkv pair and the narrow/widen pair.
TEST(MlaTest, BackwardIsTheForwardsAdjoint) {
  MOETRAIN_FRESH_RNG(rng);
  for (const ops::MlaShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "H=" << s.num_heads << " nope=" << s.qk_nope);
    const float theta = 10000.0f;
    const int64_t t = s.tokens(), wide = s.num_heads * s.qk_head_dim();
    const int64_t kv_cols = s.num_heads * (s.qk_nope + s.v_head_dim);
    Inputs in = RandomInputs(s, rng);
    const Outputs out = RunForward(Cpu(), s, theta, in);
    std::vector<float> gq = Uniform(t * wide, -1.0f, 1.0f, rng);
    std::vector<float> gk = Uniform(t * wide, -1.0f, 1.0f, rng);
    std::vector<float> gv = Uniform(t * wide, -1.0f, 1.0f, rng);
    // v's padding columns are zero in every forward and their gradient is dropped: both sides
    // leave them out.
    Tensor d_q = MakeAct(DType::kF32, {t, wide}, gq), d_k = MakeAct(DType::kF32, {t, wide}, gk);
    Tensor d_v = MakeAct(DType::kF32, {t, wide}, gv);
    Tensor d_q_full = NaNAct(DType::kF32, {t, wide}),
           d_k_rope = NaNAct(DType::kF32, {t, s.qk_rope});
    Tensor d_kv = NaNAct(DType::kF32, {t, kv_cols});
    ASSERT_OK(ops::MlaQkvBackward(Cpu(), s, theta, d_q, d_k, d_v, d_q_full, d_k_rope, d_kv));
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < t * wide; ++i) {
      for (const auto& [o, g] : {std::pair{out.q.data<float>()[i], gq[i]},
                                 {out.k.data<float>()[i], gk[i]},
                                 {out.v.data<float>()[i], gv[i]}}) {
        lhs += double{o} * g;
        scale += std::fabs(double{o} * g);
      }
    }
    for (int64_t i = 0; i < t * wide; ++i) rhs += double{in.q_full[i]} * d_q_full.data<float>()[i];
    for (int64_t i = 0; i < t * s.qk_rope; ++i)
      rhs += double{in.k_rope[i]} * d_k_rope.data<float>()[i];
    for (int64_t i = 0; i < t * kv_cols; ++i) rhs += double{in.kv[i]} * d_kv.data<float>()[i];
    EXPECT_NEAR(lhs, rhs, 1e-5 * scale);

    // narrow/widen: exact copies, each the other's adjoint.
    std::vector<float> w = Uniform(t * wide, -1.0f, 1.0f, rng);
    Tensor wide_t = MakeAct(DType::kF32, {t, wide}, w);
    Tensor narrow = NaNAct(DType::kF32, {t, s.num_heads * s.v_head_dim});
    ASSERT_OK(ops::MlaNarrowHeads(Cpu(), s, wide_t, narrow));
    Tensor back = NaNAct(DType::kF32, {t, wide});
    ASSERT_OK(ops::MlaWidenHeads(Cpu(), s, narrow, back));
    for (int64_t i = 0; i < t * wide; ++i) {
      const int64_t f = i % s.qk_head_dim();
      ASSERT_EQ(back.data<float>()[i], f < s.v_head_dim ? w[i] : 0.0f) << i;
    }
  }
}

TEST(MlaTest, BadShapesAndTensorsNameTheField) {
  ops::MlaShape s = kShapes[0];
  s.qk_rope = 3;
  EXPECT_EQ(ops::CheckMlaShape(s).message(), "mla: shape.qk_rope = 3 must be even and at least 2");
  s = kShapes[0];
  s.v_head_dim = 11;
  EXPECT_EQ(ops::CheckMlaShape(s).message(),
            "mla: shape.v_head_dim = 11 exceeds qk_nope + qk_rope = 10");
  s = kShapes[0];
  const int64_t t = s.tokens(), wide = s.num_heads * s.qk_head_dim();
  Tensor q_full = Tensor::Empty(DType::kF32, {t, wide}),
         k_rope = Tensor::Empty(DType::kF32, {t, 4});
  Tensor kv = Tensor::Empty(DType::kF32, {t, s.num_heads * (s.qk_nope + s.v_head_dim)});
  Tensor q = Tensor::Empty(DType::kF32, {t, wide});
  const absl::Status status = ops::MlaQkvForward(Cpu(), s, 10000.0f, q_full, k_rope, kv, q, q, q);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("mla k_rope"), std::string::npos) << status;
}

}  // namespace
}  // namespace moetrain::ops_test
