// ApplyRope on CUDA against the CPU backend, on fresh random inputs (the seed is printed with any
// failure). Both backends rotate by the same f32 cos/sin values (the host table of rope_table.h,
// copied to the device); the device rounds each product before the sum, while the CPU's FMA
// clones fuse one of them (rope_math.h). Tolerance: |cuda − cpu| ≤ 2⁻²¹·(|x1| + |x2|) per
// element, a few ulps of the inputs (one fused rounding less, and the sum's rounding). Forward and
// inverse, head counts and head sizes that are no multiple of a warp, one position and many
// sequences, a run of (S, Dh, θ) longer than the table caches hold (so a table is evicted and
// rebuilt), and run-to-run identity of the CUDA result. Without a GPU these skip; the host
// table's own test runs everywhere.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"
#include "engine/ops/rope/rope.h"
#include "engine/ops/rope/rope_math.h"
#include "engine/ops/rope/rope_table.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

struct RopeCase {
  ops::AttentionShape shape;  // only batch, seq_len and head_dim matter to RoPE
  int64_t heads;              // Hx of x (B·S, Hx·Dh)
  float theta;
};

// Checks ApplyRope(gpu) against ApplyRope(cpu) within the tolerance above, forward and inverse,
// and that a second CUDA run repeats the first bit for bit.
void ExpectSameAsCpu(const ExecContext& gpu, const RopeCase& c, std::mt19937& rng) {
  const int64_t rows = c.shape.batch * c.shape.seq_len, cols = c.heads * c.shape.head_dim;
  SCOPED_TRACE(::testing::Message()
               << "B=" << c.shape.batch << " S=" << c.shape.seq_len << " heads=" << c.heads
               << " Dh=" << c.shape.head_dim << " theta=" << c.theta);
  std::vector<float> values = Uniform(rows * cols, -3.0f, 3.0f, rng);
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    Tensor want = MakeAct(DType::kF32, {rows, cols}, values);
    ASSERT_OK(ops::ApplyRope(Cpu(), c.shape, c.theta, inverse, want));
    const Tensor x_gpu = test_util::ToDevice(gpu, MakeAct(DType::kF32, {rows, cols}, values));
    ASSERT_OK(ops::ApplyRope(gpu, c.shape, c.theta, inverse, x_gpu));
    const Tensor got = test_util::ToHost(gpu, x_gpu);
    // An element's partner is Dh/2 columns away within its head.
    const int64_t dh = c.shape.head_dim, half = dh / 2;
    int64_t outside = 0, first = -1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const int64_t in_head = i % dh;
      const int64_t partner = in_head < half ? i + half : i - half;
      const double bound = std::ldexp(std::fabs(values[i]) + std::fabs(values[partner]), -21);
      if (!(std::fabs(static_cast<double>(want.data<float>()[i]) - got.data<float>()[i]) <=
            bound)) {
        if (first < 0) first = i;
        ++outside;
      }
    }
    EXPECT_EQ(outside, 0) << "first at element " << first << ": cpu "
                          << (first >= 0 ? want.data<float>()[first] : 0.0f) << ", cuda "
                          << (first >= 0 ? got.data<float>()[first] : 0.0f);

    const Tensor again_gpu = test_util::ToDevice(gpu, MakeAct(DType::kF32, {rows, cols}, values));
    ASSERT_OK(ops::ApplyRope(gpu, c.shape, c.theta, inverse, again_gpu));
    EXPECT_TRUE(SameBytes(got, test_util::ToHost(gpu, again_gpu)));
  }
}

TEST(RopeCudaTest, MatchesTheCpuBitForBit) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  auto shape = [](int64_t batch, int64_t seq_len, int64_t head_dim) {
    return ops::AttentionShape{.batch = batch,
                               .seq_len = seq_len,
                               .num_heads = 1,
                               .num_kv_heads = 1,
                               .head_dim = head_dim};
  };
  const RopeCase cases[] = {
      {shape(1, 1, 2), 1, 10000.0f},       // one pair at position 0
      {shape(2, 5, 6), 3, 10000.0f},       // Dh/2 = 3, no multiple of anything
      {shape(3, 300, 64), 4, 500000.0f},   // a Llama-like head
      {shape(1, 4097, 128), 2, 10000.0f},  // a long sequence
      {shape(4, 33, 130), 8, 10000.0f},    // Dh/2 = 65 straddles warps
      {shape(64, 16, 2), 1, 10.0f},        // many short sequences, one pair each
      {shape(2, 1000, 8), 5, 1000000.0f},  // a large θ
  };
  for (const RopeCase& c : cases) ExpectSameAsCpu(gpu, c, rng);
}

TEST(RopeCudaTest, TablesAreKeptApartAndRebuiltAfterEviction) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const ops::AttentionShape shape{
      .batch = 2, .seq_len = 40, .num_heads = 1, .num_kv_heads = 1, .head_dim = 16};
  // Twelve θ on one (S, Dh), more than the caches hold (8), then the first again: a table must
  // be found by θ too, and one evicted must come back with the same values.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 12; ++i) {
      ExpectSameAsCpu(gpu, {shape, 3, 100.0f * static_cast<float>(i + 1)}, rng);
    }
  }
  // The same θ with another S and another Dh.
  ExpectSameAsCpu(gpu, {{.batch = 1, .seq_len = 41, .head_dim = 16}, 2, 100.0f}, rng);
  ExpectSameAsCpu(gpu, {{.batch = 1, .seq_len = 40, .head_dim = 18}, 2, 100.0f}, rng);
}

// The host table both backends rotate by: one per (S, Dh, θ), cos and sin of the double angle.
TEST(RopeTableTest, OnePerKeyHoldingTheDoubleAnglesCosAndSin) {
  const std::shared_ptr<const ops::RopeTable> a = ops::CachedRopeTable(7, 10, 10000.0f);
  EXPECT_EQ(a, ops::CachedRopeTable(7, 10, 10000.0f));
  EXPECT_NE(a, ops::CachedRopeTable(7, 10, 5000.0f));
  EXPECT_NE(a, ops::CachedRopeTable(8, 10, 10000.0f));
  EXPECT_NE(a, ops::CachedRopeTable(7, 12, 10000.0f));
  ASSERT_EQ(a->cos.size(), 7u * 5u);
  ASSERT_EQ(a->sin.size(), 7u * 5u);
  for (int64_t p = 0; p < 7; ++p) {
    for (int64_t i = 0; i < 5; ++i) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * i / 10);
      EXPECT_EQ(a->cos[p * 5 + i], static_cast<float>(std::cos(angle))) << p << ", " << i;
      EXPECT_EQ(a->sin[p * 5 + i], static_cast<float>(std::sin(angle))) << p << ", " << i;
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
