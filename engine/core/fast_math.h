// Vectorisable math for the kernels, and the one way the CPU's hot loops are multiversioned.
#ifndef MOETRAIN_ENGINE_CORE_FAST_MATH_H_
#define MOETRAIN_ENGINE_CORE_FAST_MATH_H_

#include <cstdint>
#include <cstring>

#include "engine/core/host_device.h"

// MOETRAIN_CLONES: plain loops that GCC vectorises, compiled also for x86-64-v3 (AVX2 with FMA;
// plain "avx2" has no FMA) and x86-64-v4 (AVX-512); the resolver picks one clone at load time, so
// binaries run on any x86-64 and a given machine always runs the same code.
//
// MOETRAIN_NO_FP_CONTRACT, beside it, for loops whose bits must not depend on the clone: GCC
// fuses a·b + c into an FMA where the target has one (the v3 and v4 clones, not the default), and
// the fused result rounds once instead of twice. The optimizer's update carries it, so that a job
// resumed on another CPU updates its weights with the same bits; the forward and backward
// kernels do not (their GEMMs differ across CPUs anyway: oneDNN picks kernels by the CPU).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define MOETRAIN_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#define MOETRAIN_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define MOETRAIN_CLONES
#define MOETRAIN_NO_FP_CONTRACT
#endif

namespace moetrain {

// e^x in f32 within ~2 ulp, and exactly 0 for x < −87 (so −inf, a masked score, gives 0):
// e^x = 2^n · e^r with n = round(x·log2 e) and |r| ≤ ln2/2 (ln 2 split in two so that n·ln2 is
// exact), e^r by its Taylor series to r⁸ (truncation < 6e-9). No branches and no errno, unlike
// std::exp, so loops over it vectorise.
MOETRAIN_HOST_DEVICE float FastExp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds
  // min(max(x, −87), 88), spelled as std::max and std::min compare (NaN passes through).
  const float above = x < -87.0f ? -87.0f : x;
  const float clamped = 88.0f < above ? 88.0f : above;
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
