// The bf16 conversions of engine/core/dtype.h, per element, for the host and CUDA devices alike:
// bf16 is the top 16 bits of an IEEE float, rounded to nearest even; NaN stays a (quiet) NaN.
#ifndef MOETRAIN_ENGINE_CORE_DTYPE_MATH_H_
#define MOETRAIN_ENGINE_CORE_DTYPE_MATH_H_

#include <cstdint>
#include <cstring>

#include "engine/core/host_device.h"

namespace moetrain {

// Branch-free, so that bulk loops over it vectorise: the NaN case is a select, not a jump.
MOETRAIN_HOST_DEVICE uint16_t FloatBitsToBF16Bits(uint32_t bits) {
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
  // mantissa correctly bumps the exponent (and the largest floats round up to infinity).
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  // Rounding could turn a NaN with only low payload bits into infinity; set the quiet bit instead.
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

MOETRAIN_HOST_DEVICE uint16_t FloatToBF16Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return FloatBitsToBF16Bits(bits);
}

MOETRAIN_HOST_DEVICE float BF16BitsToFloat(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_DTYPE_MATH_H_
