// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") and the maps from
// its words to floats, for the host and CUDA devices alike: element i of a stream depends only on
// the key and the counter, so any thread of any device computes the same values (engine/core/rng.h
// lays out the streams).
#ifndef MOETRAIN_ENGINE_CORE_PHILOX_MATH_H_
#define MOETRAIN_ENGINE_CORE_PHILOX_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"

namespace moetrain {

struct PhiloxWords {
  uint32_t w[4];
};

// The bijection: 10 rounds over a 128-bit counter with a 64-bit key.
MOETRAIN_HOST_DEVICE PhiloxWords Philox4x32(PhiloxWords counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const uint64_t product0 = uint64_t{kMultiplier0} * counter.w[0];
    const uint64_t product1 = uint64_t{kMultiplier1} * counter.w[2];
    counter = {{static_cast<uint32_t>(product1 >> 32) ^ counter.w[1] ^ key0,
                static_cast<uint32_t>(product1),
                static_cast<uint32_t>(product0 >> 32) ^ counter.w[3] ^ key1,
                static_cast<uint32_t>(product0)}};
  }
  return counter;
}

// A word as a float uniform in [0, 1): 24 bits, so every value is exact and the largest is
// 1 − 2⁻²⁴.
MOETRAIN_HOST_DEVICE float PhiloxUnit(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1p-24f;
}

// Two words as one standard normal value (Box–Muller, the cosine half). The radius uses
// (0, 1] rather than [0, 1), so log never sees zero; the tails stop near 5.8 sigma.
MOETRAIN_HOST_DEVICE float PhiloxNormal(uint32_t radius_bits, uint32_t angle_bits) {
  constexpr float kTwoPi = 2.0f * 3.14159265358979323846f;
  const float u1 = static_cast<float>((radius_bits >> 8) + 1) * 0x1p-24f;
  const float u2 = PhiloxUnit(angle_bits);
  return sqrtf(-2.0f * logf(u1)) * cosf(kTwoPi * u2);
}

// One stream of engine/core/rng.h as plain words, so that a CUDA kernel computes the values the
// host's Rng computes: the key (the seed) and the counter's upper two words (step; rank and
// stream id). Word i of the stream is word i % 4 of block i / 4.
struct PhiloxStream {
  uint32_t key0, key1;
  uint32_t counter2, counter3;
};

// Block `block` of the stream: its four words.
MOETRAIN_HOST_DEVICE PhiloxWords PhiloxStreamBlock(const PhiloxStream& stream, uint64_t block) {
  return Philox4x32({{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                      stream.counter2, stream.counter3}},
                    stream.key0, stream.key1);
}

// Normal value 2·block + pair (pair 0 or 1) of the stream, from its block's words: mean + stddev ·
// the Box–Muller value of words 2·pair and 2·pair + 1. Multiply and add round separately on the
// device too (nvcc would fuse them into an FMA, which the host's baseline build does not).
MOETRAIN_HOST_DEVICE float PhiloxNormalOfBlock(const PhiloxWords& block, int pair, float mean,
                                               float stddev) {
  const float z = PhiloxNormal(block.w[2 * pair], block.w[2 * pair + 1]);
#if defined(__CUDA_ARCH__)
  return __fadd_rn(mean, __fmul_rn(stddev, z));
#else
  return mean + stddev * z;
#endif
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_PHILOX_MATH_H_
