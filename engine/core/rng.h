// Counter-based random numbers (Philox4x32-10): a stream depends only on
// (seed, step, rank, stream id), and element i of it can be computed without the ones before.
#ifndef MOETRAIN_ENGINE_CORE_RNG_H_
#define MOETRAIN_ENGINE_CORE_RNG_H_

#include <array>
#include <cstdint>

#include "engine/core/philox_math.h"

namespace moetrain {

// The raw Philox4x32-10 bijection: 10 rounds over a 128-bit counter with a 64-bit key.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The key is the seed (low half in key[0]); the counter is (block index low, block index high,
// step low, rank << 16 | stream_id), with word i of the stream being word i % 4 of block i / 4.
// Distinct (step, rank, stream_id) give distinct counters, hence independent streams, while
// step < 2^32, rank < 2^16 and stream_id < 2^16. Bits beyond those limits are hashed into the
// last word, so they still change the stream but are no longer guaranteed to avoid collisions.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t step, uint32_t rank, uint32_t stream_id);

  // Element i of the stream of 32-bit words.
  uint32_t Bits(uint64_t i) const;
  // Element i as a float uniform in [0, 1) (24 random bits).
  float Uniform(uint64_t i) const;

  // out[j] = element offset + j, mapped to [lo, hi) / N(mean, stddev²) (Box–Muller on pairs of
  // words, so FillNormal consumes two words per value: value j reads words 2(offset + j) and
  // 2(offset + j) + 1). Needs lo < hi.
  void FillUniform(float* out, int64_t n, float lo, float hi, uint64_t offset = 0) const;
  void FillNormal(float* out, int64_t n, float mean, float stddev, uint64_t offset = 0) const;

  // The stream as plain words, for kernels that compute its values on a device
  // (PhiloxStreamBlock, PhiloxNormalOfBlock give exactly the values above).
  PhiloxStream philox_stream() const { return {key_[0], key_[1], counter_hi_[0], counter_hi_[1]}; }

 private:
  std::array<uint32_t, 2> key_;
  uint32_t counter_hi_[2];
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_RNG_H_
