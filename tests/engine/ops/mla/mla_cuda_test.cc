// The MLA layout ops on CUDA against their CPU twins (mla_test.cc checks the CPU against the
// float64 definition), on fresh random inputs: forward, backward, narrow and widen. The copies
// must match bit for bit; the rotated features within a few ulps of their inputs (the device
// rounds each product of the rotation, the CPU's FMA clones may fuse one: rope_math.h), and the
// shared key's gradient, a sum over the heads in the same order, within a few ulps of the sum of
// magnitudes. A second CUDA run repeats the first bit for bit. Without a GPU these skip.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/ops/mla/mla.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

// |got − want| ≤ 2⁻¹⁹·(1 + |want|) per element: a few ulps of inputs in [−2, 2] summed over at
// most 16 heads.
void ExpectClose(const Tensor& want, const Tensor& got, const char* what) {
  ASSERT_EQ(want.numel(), got.numel());
  int64_t outside = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.data<float>()[i], g = got.data<float>()[i];
    if (!(std::fabs(w - g) <= std::ldexp(16.0 * (1.0 + std::fabs(w)), -21))) {
      if (first < 0) first = i;
      ++outside;
    }
  }
  EXPECT_EQ(outside, 0) << what << ": first at " << first;
}

void ExpectSameAsCpu(const ExecContext& gpu, const ops::MlaShape& s, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "B=" << s.batch << " S=" << s.seq_len << " H=" << s.num_heads
               << " nope=" << s.qk_nope << " rope=" << s.qk_rope << " v=" << s.v_head_dim);
  const float theta = 10000.0f;
  const int64_t t = s.tokens(), wide = s.num_heads * s.qk_head_dim();
  const int64_t kv_cols = s.num_heads * (s.qk_nope + s.v_head_dim);
  const int64_t narrow_cols = s.num_heads * s.v_head_dim;
  std::vector<float> q_full = Uniform(t * wide, -2.0f, 2.0f, rng);
  std::vector<float> k_rope = Uniform(t * s.qk_rope, -2.0f, 2.0f, rng);
  std::vector<float> kv = Uniform(t * kv_cols, -2.0f, 2.0f, rng);
  auto dev = [&](std::vector<int64_t> shape, std::vector<float>& values) {
    return test_util::ToDevice(gpu, MakeAct(DType::kF32, shape, values));
  };
  auto empty = [&](std::vector<int64_t> shape) {
    return test_util::ToDevice(gpu, NaNAct(DType::kF32, shape));
  };
  // Forward.
  Tensor q = NaNAct(DType::kF32, {t, wide}), k = NaNAct(DType::kF32, {t, wide});
  Tensor v = NaNAct(DType::kF32, {t, wide});
  ASSERT_OK(ops::MlaQkvForward(Cpu(), s, theta, MakeAct(DType::kF32, {t, wide}, q_full),
                               MakeAct(DType::kF32, {t, s.qk_rope}, k_rope),
                               MakeAct(DType::kF32, {t, kv_cols}, kv), q, k, v));
  Tensor gq = empty({t, wide}), gk = empty({t, wide}), gv = empty({t, wide});
  ASSERT_OK(ops::MlaQkvForward(gpu, s, theta, dev({t, wide}, q_full), dev({t, s.qk_rope}, k_rope),
                               dev({t, kv_cols}, kv), gq, gk, gv));
  ExpectClose(q, test_util::ToHost(gpu, gq), "q");
  ExpectClose(k, test_util::ToHost(gpu, gk), "k");
  EXPECT_TRUE(SameBytes(v, test_util::ToHost(gpu, gv))) << "v";

  // Backward, twice on the GPU.
  std::vector<float> dq = Uniform(t * wide, -2.0f, 2.0f, rng);
  std::vector<float> dk = Uniform(t * wide, -2.0f, 2.0f, rng);
  std::vector<float> dv = Uniform(t * wide, -2.0f, 2.0f, rng);
  Tensor dq_full = NaNAct(DType::kF32, {t, wide}), dk_rope = NaNAct(DType::kF32, {t, s.qk_rope});
  Tensor dkv = NaNAct(DType::kF32, {t, kv_cols});
  ASSERT_OK(ops::MlaQkvBackward(Cpu(), s, theta, MakeAct(DType::kF32, {t, wide}, dq),
                                MakeAct(DType::kF32, {t, wide}, dk),
                                MakeAct(DType::kF32, {t, wide}, dv), dq_full, dk_rope, dkv));
  Tensor first_rope;
  for (int run = 0; run < 2; ++run) {
    Tensor gdq_full = empty({t, wide}), gdk_rope = empty({t, s.qk_rope}),
           gdkv = empty({t, kv_cols});
    ASSERT_OK(ops::MlaQkvBackward(gpu, s, theta, dev({t, wide}, dq), dev({t, wide}, dk),
                                  dev({t, wide}, dv), gdq_full, gdk_rope, gdkv));
    ExpectClose(dq_full, test_util::ToHost(gpu, gdq_full), "d_q_full");
    ExpectClose(dk_rope, test_util::ToHost(gpu, gdk_rope), "d_k_rope");
    EXPECT_TRUE(SameBytes(dkv, test_util::ToHost(gpu, gdkv))) << "d_kv";
    if (run == 0) {
      first_rope = test_util::ToHost(gpu, gdk_rope);
    } else {
      EXPECT_TRUE(SameBytes(first_rope, test_util::ToHost(gpu, gdk_rope))) << "run to run";
    }
  }

  // Narrow and widen: exact copies.
  std::vector<float> w = Uniform(t * wide, -2.0f, 2.0f, rng);
  Tensor narrow = NaNAct(DType::kF32, {t, narrow_cols});
  ASSERT_OK(ops::MlaNarrowHeads(Cpu(), s, MakeAct(DType::kF32, {t, wide}, w), narrow));
  Tensor g_narrow = empty({t, narrow_cols});
  ASSERT_OK(ops::MlaNarrowHeads(gpu, s, dev({t, wide}, w), g_narrow));
  EXPECT_TRUE(SameBytes(narrow, test_util::ToHost(gpu, g_narrow))) << "narrow";
  Tensor widened = NaNAct(DType::kF32, {t, wide});
  ASSERT_OK(ops::MlaWidenHeads(Cpu(), s, narrow, widened));
  Tensor g_wide = empty({t, wide});
  ASSERT_OK(ops::MlaWidenHeads(gpu, s, g_narrow, g_wide));
  EXPECT_TRUE(SameBytes(widened, test_util::ToHost(gpu, g_wide))) << "widen";
}

TEST(MlaCudaTest, MatchesTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const ops::MlaShape shapes[] = {
      {.batch = 2, .seq_len = 5, .num_heads = 3, .qk_nope = 4, .qk_rope = 6, .v_head_dim = 7},
      {.batch = 1, .seq_len = 1, .num_heads = 1, .qk_nope = 0, .qk_rope = 2, .v_head_dim = 2},
      {.batch = 2,
       .seq_len = 300,
       .num_heads = 16,
       .qk_nope = 128,
       .qk_rope = 64,
       .v_head_dim = 128},  // DeepSeek-V3's head widths
      {.batch = 3, .seq_len = 33, .num_heads = 5, .qk_nope = 10, .qk_rope = 4, .v_head_dim = 14},
  };
  for (const ops::MlaShape& s : shapes) ExpectSameAsCpu(gpu, s, rng);
}

}  // namespace
}  // namespace moetrain::ops_test
