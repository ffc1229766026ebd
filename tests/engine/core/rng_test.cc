#include "engine/core/rng.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

// Known-answer vectors published with Random123 (kat_vectors, philox4x32 10 rounds).
TEST(RngPhiloxTest, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The counter and key layout documented in rng.h.
TEST(RngTest, BitsFollowDocumentedCounterLayout) {
  const uint64_t seed = 0x1122334455667788ull;
  const Rng rng(seed, /*step=*/0x0000000Au, /*rank=*/3, /*stream_id=*/7);
  for (uint64_t block : {0ull, 1ull, 12345ull, 0x123456789ull}) {
    const std::array<uint32_t, 4> expected =
        Philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0x0000000A,
                    3u << 16 | 7u},
                   {0x55667788, 0x11223344});
    for (int lane = 0; lane < 4; ++lane) {
      EXPECT_EQ(rng.Bits(4 * block + lane), expected[lane]) << "block " << block;
    }
  }
}

TEST(RngTest, SameArgumentsGiveSameStream) {
  const Rng a(7, 100, 2, 1);
  const Rng b(7, 100, 2, 1);
  for (uint64_t i = 0; i < 1000; ++i) ASSERT_EQ(a.Bits(i), b.Bits(i)) << i;
}

// Philox is a bijection for a fixed key, so distinct counters give distinct blocks: a collision
// here can only mean two (step, rank, stream) map to one counter.
TEST(RngTest, DistinctStepRankStreamGiveDistinctBlocks) {
  std::set<std::array<uint32_t, 4>> blocks;
  int count = 0;
  for (uint64_t step : {0ull, 1ull, 2ull, 0x7FFFFFFFull, 0xFFFFFFFFull}) {
    for (uint32_t rank : {0u, 1u, 2u, 0xFFFFu}) {
      for (uint32_t stream : {0u, 1u, 2u, 0xFFFFu}) {
        const Rng rng(99, step, rank, stream);
        blocks.insert({rng.Bits(0), rng.Bits(1), rng.Bits(2), rng.Bits(3)});
        ++count;
      }
    }
  }
  EXPECT_EQ(blocks.size(), static_cast<size_t>(count));
}

TEST(RngTest, EveryArgumentChangesTheStream) {
  const Rng base(1, 2, 3, 4);
  const Rng others[] = {Rng(2, 2, 3, 4),
                        Rng(1, 3, 3, 4),
                        Rng(1, 2, 4, 4),
                        Rng(1, 2, 3, 5),
                        Rng(1, 2, 4, 3),  // rank and stream swapped
                        Rng(1ull << 32 | 1, 2, 3, 4),
                        Rng(1, 2ull | 1ull << 32, 3, 4),
                        Rng(1, 2, 3 | 1u << 16, 4),
                        Rng(1, 2, 3, 4 | 1u << 16)};
  for (const Rng& other : others) {
    int same = 0;
    for (uint64_t i = 0; i < 64; ++i) same += base.Bits(i) == other.Bits(i);
    EXPECT_LE(same, 2);  // Independent words agree with probability 2^-32 each.
  }
}

TEST(RngTest, BitsDoNotDependOnCallOrder) {
  const Rng rng(5, 6, 7, 8);
  std::vector<uint64_t> indices(2000);
  std::iota(indices.begin(), indices.end(), 0);
  std::vector<uint32_t> forward;
  for (uint64_t i : indices) forward.push_back(rng.Bits(i));
  std::shuffle(indices.begin(), indices.end(), std::mt19937_64(1));
  for (uint64_t i : indices) ASSERT_EQ(rng.Bits(i), forward[i]) << i;
}

TEST(RngTest, UniformIsTop24BitsInUnitInterval) {
  const Rng rng(11, 0, 0, 0);
  float lo = 1, hi = 0;
  for (uint64_t i = 0; i < 1000000; ++i) {
    const float u = rng.Uniform(i);
    ASSERT_EQ(u, std::ldexp(static_cast<float>(rng.Bits(i) >> 8), -24)) << i;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_GE(lo, 0.0f);
  EXPECT_LT(hi, 1.0f);
  EXPECT_LT(lo, 1e-4f);  // And the whole interval is used.
  EXPECT_GT(hi, 1 - 1e-4f);
}

struct Moments {
  double mean;
  double variance;
};

Moments ComputeMoments(const std::vector<float>& x) {
  double sum = 0, sum_sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / x.size();
  for (float v : x) sum_sq += (v - mean) * (v - mean);
  return {mean, sum_sq / (x.size() - 1)};
}

TEST(RngTest, FillUniformHasUniformMoments) {
  const Rng rng(12, 1, 0, 0);
  std::vector<float> x(1000000);
  rng.FillUniform(x.data(), x.size(), -1.0f, 3.0f);
  EXPECT_GE(*std::min_element(x.begin(), x.end()), -1.0f);
  EXPECT_LT(*std::max_element(x.begin(), x.end()), 3.0f);
  const Moments m = ComputeMoments(x);
  // Width 4: variance 16 / 12. Standard errors are ~1.2e-3 (mean) and ~1.2e-3 (variance).
  EXPECT_NEAR(m.mean, 1.0, 6e-3);
  EXPECT_NEAR(m.variance, 16.0 / 12.0, 8e-3);
}

TEST(RngTest, FillUniformNeverReturnsHi) {
  // Floats near 2^24 are 2 apart, so lo + 2u rounds to hi for about half the draws unless the
  // result is clamped.
  const Rng rng(13, 0, 0, 0);
  std::vector<float> x(1000);
  const float lo = 16777216.0f, hi = 16777218.0f;
  rng.FillUniform(x.data(), x.size(), lo, hi);
  for (float v : x) ASSERT_TRUE(v >= lo && v < hi) << v;
}

TEST(RngTest, FillNormalHasNormalMoments) {
  const Rng rng(14, 2, 1, 3);
  std::vector<float> x(1000000);
  const double mean = 3.0, stddev = 2.0;
  rng.FillNormal(x.data(), x.size(), mean, stddev);
  const Moments m = ComputeMoments(x);
  // Standard errors: stddev / 1000 = 2e-3 for the mean, stddev^2 * sqrt(2 / n) ~ 5.7e-3 for the
  // variance; the bounds are about five of them.
  EXPECT_NEAR(m.mean, mean, 0.01);
  EXPECT_NEAR(m.variance, stddev * stddev, 0.03);
  // The shape, not only two moments: P(|z| < 1) = 0.6827, P(|z| < 2) = 0.9545 (errors < 5e-4).
  int64_t within1 = 0, within2 = 0;
  for (float v : x) {
    const double z = std::fabs((v - mean) / stddev);
    within1 += z < 1;
    within2 += z < 2;
    ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_NEAR(within1 / 1e6, 0.6827, 2.5e-3);
  EXPECT_NEAR(within2 / 1e6, 0.9545, 1.5e-3);
}

TEST(RngTest, FillWithOffsetContinuesTheStream) {
  const Rng rng(15, 3, 2, 1);
  constexpr int64_t kN = 1000;
  std::vector<float> uniform(kN), normal(kN);
  rng.FillUniform(uniform.data(), kN, -2.0f, 5.0f);
  rng.FillNormal(normal.data(), kN, 0.5f, 1.5f);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(uniform[i], -2.0f + 7.0f * rng.Uniform(i));
  // Offsets at every position within a Philox block, and past the first ones.
  for (uint64_t offset : {0, 1, 2, 3, 4, 5, 7, 13, 998, 999}) {
    const int64_t n = kN - static_cast<int64_t>(offset);
    std::vector<float> part_uniform(n), part_normal(n);
    rng.FillUniform(part_uniform.data(), n, -2.0f, 5.0f, offset);
    rng.FillNormal(part_normal.data(), n, 0.5f, 1.5f, offset);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(part_uniform[j], uniform[offset + j]) << "offset " << offset << " j " << j;
      ASSERT_EQ(part_normal[j], normal[offset + j]) << "offset " << offset << " j " << j;
    }
  }
}

TEST(RngTest, NormalValueJIsBoxMullerOfWords2JAnd2JPlus1) {
  // The contract in rng.h, checked in double: the radius from word 2j (24 bits, shifted into
  // (0, 1] so that log is finite), the angle from word 2j + 1.
  const Rng rng(16, 0, 0, 0);
  constexpr int64_t kN = 1000;
  std::vector<float> normal(kN);
  rng.FillNormal(normal.data(), kN, 0.0f, 1.0f);
  for (int64_t j = 0; j < kN; ++j) {
    const double u1 = ((rng.Bits(2 * j) >> 8) + 1.0) / 16777216.0;
    const double u2 = (rng.Bits(2 * j + 1) >> 8) / 16777216.0;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    ASSERT_NEAR(normal[j], z, 1e-5 * (1.0 + std::fabs(z))) << j;
  }
}

TEST(RngTest, FillOfZeroElementsWritesNothing) {
  const Rng rng(17, 0, 0, 0);
  float sentinel = 42.0f;
  rng.FillUniform(&sentinel, 0, 0.0f, 1.0f);
  rng.FillNormal(&sentinel, 0, 0.0f, 1.0f, 5);
  EXPECT_EQ(sentinel, 42.0f);
}

}  // namespace
}  // namespace moetrain
