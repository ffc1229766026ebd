// Vectorisable math for the CPU kernels, and the one way their hot loops are multiversioned.
#ifndef MOETRAIN_ENGINE_CORE_FAST_MATH_H_
#define MOETRAIN_ENGINE_CORE_FAST_MATH_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

// Plain loops that GCC vectorises, compiled also for x86-64-v3 (AVX2 with FMA; plain "avx2" has
// no FMA) and x86-64-v4 (AVX-512); the resolver picks one clone at load time, so binaries run on
// any x86-64 and a given machine always runs the same code.
#define MOETRAIN_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))

namespace moetrain {

// e^x in f32 within ~2 ulp, and exactly 0 for x < −87 (so −inf, a masked score, gives 0):
// e^x = 2^n · e^r with n = round(x·log2 e) and |r| ≤ ln2/2 (ln 2 split in two so that n·ln2 is
// exact), e^r by its Taylor series to r⁸ (truncation < 6e-9). No branches and no errno, unlike
// std::exp, so loops over it vectorise.
inline float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds
  const float clamped = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 40320;
  p = p * r + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < -87.0f ? 0.0f : p * two_n;
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_FAST_MATH_H_
