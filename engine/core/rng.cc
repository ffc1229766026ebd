#include "engine/core/rng.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moetrain {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;
constexpr float kTwoToMinus24 = 0x1p-24f;

// The stream's 32-bit words come in blocks of four, one Philox call each.
std::array<uint32_t, 4> Block(const std::array<uint32_t, 2>& key, const uint32_t counter_hi[2],
                              uint64_t block) {
  return Philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                     counter_hi[0], counter_hi[1]},
                    key);
}

// 24 bits, so every value is exact in float and the largest is 1 - 2^-24.
float ToUnit(uint32_t bits) { return static_cast<float>(bits >> 8) * kTwoToMinus24; }

float BoxMuller(uint32_t radius_bits, uint32_t angle_bits) {
  // (0, 1] rather than [0, 1), so log never sees zero; the tails stop near 5.8 sigma.
  const float u1 = static_cast<float>((radius_bits >> 8) + 1) * kTwoToMinus24;
  const float u2 = ToUnit(angle_bits);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(2.0f * std::numbers::pi_v<float> * u2);
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    const uint64_t product0 = uint64_t{kMultiplier0} * counter[0];
    const uint64_t product1 = uint64_t{kMultiplier1} * counter[2];
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key[0],
               static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key[1],
               static_cast<uint32_t>(product0)};
  }
  return counter;
}

Rng::Rng(uint64_t seed, uint64_t step, uint32_t rank, uint32_t stream_id)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)} {
  // Inside the documented limits `excess` is 0 and the layout is injective. Beyond them, the
  // excess bits (packed without overlap) are hashed so that nearby values still differ.
  const uint64_t excess = (step >> 32) << 32 | uint64_t{rank >> 16} << 16 | (stream_id >> 16);
  const uint32_t excess_hash = static_cast<uint32_t>((excess * 0x9E3779B97F4A7C15ull) >> 32);
  counter_hi_[0] = static_cast<uint32_t>(step);
  counter_hi_[1] = ((rank & 0xFFFFu) << 16 | (stream_id & 0xFFFFu)) ^ excess_hash;
}

uint32_t Rng::Bits(uint64_t i) const { return Block(key_, counter_hi_, i / 4)[i % 4]; }

float Rng::Uniform(uint64_t i) const { return ToUnit(Bits(i)); }

void Rng::FillUniform(float* out, int64_t n, float lo, float hi, uint64_t offset) const {
  const float scale = hi - lo;
  // lo + scale * u can round up to hi when hi's spacing is coarse; clamp to keep [lo, hi).
  const float below_hi = std::nextafter(hi, lo);
  uint64_t word = offset;
  int64_t j = 0;
  while (j < n) {
    const std::array<uint32_t, 4> block = Block(key_, counter_hi_, word / 4);
    for (uint64_t lane = word % 4; lane < 4 && j < n; ++lane, ++word, ++j) {
      out[j] = std::min(lo + scale * ToUnit(block[lane]), below_hi);
    }
  }
}

void Rng::FillNormal(float* out, int64_t n, float mean, float stddev, uint64_t offset) const {
  // Value v reads words 2v and 2v + 1, so each block holds two values.
  uint64_t value = offset;
  int64_t j = 0;
  while (j < n) {
    const std::array<uint32_t, 4> block = Block(key_, counter_hi_, value / 2);
    for (uint64_t pair = value % 2; pair < 2 && j < n; ++pair, ++value, ++j) {
      out[j] = mean + stddev * BoxMuller(block[2 * pair], block[2 * pair + 1]);
    }
  }
}

}  // namespace moetrain
