#include "engine/core/rng.h"

#include <algorithm>
#include <cmath>

#include "engine/core/philox_math.h"

namespace moetrain {
namespace {

// The stream's 32-bit words come in blocks of four, one Philox call each.
std::array<uint32_t, 4> Block(const std::array<uint32_t, 2>& key, const uint32_t counter_hi[2],
                              uint64_t block) {
  const PhiloxWords out =
      moetrain::Philox4x32({{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                             counter_hi[0], counter_hi[1]}},
                           key[0], key[1]);
  return {out.w[0], out.w[1], out.w[2], out.w[3]};
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  const PhiloxWords out =
      moetrain::Philox4x32({{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]);
  return {out.w[0], out.w[1], out.w[2], out.w[3]};
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

float Rng::Uniform(uint64_t i) const { return PhiloxUnit(Bits(i)); }

void Rng::FillUniform(float* out, int64_t n, float lo, float hi, uint64_t offset) const {
  const float scale = hi - lo;
  // lo + scale * u can round up to hi when hi's spacing is coarse; clamp to keep [lo, hi).
  const float below_hi = std::nextafter(hi, lo);
  uint64_t word = offset;
  int64_t j = 0;
  while (j < n) {
    const std::array<uint32_t, 4> block = Block(key_, counter_hi_, word / 4);
    for (uint64_t lane = word % 4; lane < 4 && j < n; ++lane, ++word, ++j) {
      out[j] = std::min(lo + scale * PhiloxUnit(block[lane]), below_hi);
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
      out[j] = PhiloxNormalOfBlock({{block[0], block[1], block[2], block[3]}},
                                   static_cast<int>(pair), mean, stddev);
    }
  }
}

}  // namespace moetrain
