// The FP8 recipes' per-element and per-scale formulas (docs/fp8.md), for the host and CUDA devices
// alike, so that the CPU emulation and the CUDA kernels compute the same bits. They follow
// Transformer Engine's recipe kernels (GPU-NOTES.md §2):
//
//   ScaleFromAmax   current and blockwise scaling: fp8_max / amax, pow2 rounding down;
//   E8M0FromAmax    MXFP8: the shared exponent of a 32-element block, rounded up;
//   QuantizeFp8     cvt.rn.satfinite: round to nearest even, ±max for out-of-range and ±inf,
//                   NaN stays NaN (the bits of cuda_fp8.h's __NV_SATFINITE conversions).
#ifndef MOETRAIN_ENGINE_CORE_FP8_MATH_H_
#define MOETRAIN_ENGINE_CORE_FP8_MATH_H_

#include <cstdint>
#include <cstring>

#include "engine/core/host_device.h"
#include "engine/core/rn_math.h"

namespace moetrain {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

// 448 for E4M3, 57344 for E5M2.
MOETRAIN_HOST_DEVICE float Fp8Max(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
}

namespace fp8_internal {

// Bit casts that compile for both the host and the device (as engine/core/dtype_math.h does).
MOETRAIN_HOST_DEVICE uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}
MOETRAIN_HOST_DEVICE float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}
// inf or NaN, by bits (std::isnan is host-only, and -ffast-math-proof).
MOETRAIN_HOST_DEVICE bool NotFinite(float x) { return (Bits(x) & 0x7FFFFFFFu) >= 0x7F800000u; }
MOETRAIN_HOST_DEVICE bool IsNaN(float x) { return (Bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

}  // namespace fp8_internal

// The running amax of a tensor or block: max(amax, |x|), NaN-sticky (once an element is NaN the
// amax stays NaN; fmaxf would drop it). Every amax the FP8 ops compute, for statistics and for
// scales alike, folds its elements with this, in any order (max is order-independent, and so is
// NaN-stickiness), so the CPU and CUDA agree bit for bit. A block holding a NaN therefore gets
// ScaleFromAmax's scale 1, and in MXFP8 the E8M0 byte 0xFF (its whole block dequantises to NaN).
MOETRAIN_HOST_DEVICE float Fp8AmaxFold(float amax, float x) {
  const float a = fp8_internal::FromBits(fp8_internal::Bits(x) & 0x7FFFFFFFu);
  if (fp8_internal::IsNaN(amax)) return amax;
  if (fp8_internal::IsNaN(a)) return a;
  return a > amax ? a : amax;
}

// The quantising scale of a tensor or block whose largest magnitude is `amax`:
//   amax < epsilon → amax = epsilon; amax 0, inf or NaN → 1; else fp8_max / amax (IEEE
//   division), value_for_inf when that overflows; pow2 clears the mantissa (rounds down to 2^k).
MOETRAIN_HOST_DEVICE float ScaleFromAmax(float amax, float fp8_max, bool pow2, float epsilon,
                                         float value_for_inf) {
  if (amax < epsilon) amax = epsilon;
  if (amax == 0.0f || fp8_internal::NotFinite(amax)) return 1.0f;
  float scale = DivRn(fp8_max, amax);
  if ((fp8_internal::Bits(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = value_for_inf;
  if (pow2) scale = fp8_internal::FromBits(fp8_internal::Bits(scale) & 0xFF800000u);
  return scale;
}

// The dequantisation factor of a scale: RN_f32(1 / scale), as TE's __frcp_rn (or 1.0 / scale in
// its block kernels, the same bits).
MOETRAIN_HOST_DEVICE float Fp8ScaleInv(float scale) { return DivRn(1.0f, scale); }

// Whether a scaled value counts as saturated in the statistics: its magnitude is above the
// format's max (±inf included, NaN not), whatever it rounds to.
MOETRAIN_HOST_DEVICE bool Fp8Saturates(float scaled, Fp8Format format) {
  return fp8_internal::FromBits(fp8_internal::Bits(scaled) & 0x7FFFFFFFu) > Fp8Max(format);
}

// MXFP8's E8M0 exponent byte of a block with largest magnitude `amax` (TE's float_to_e8m0 of
// amax · (1 / fp8_max), rounded up): NaN → 0xFF, inf → 0xFE, 0 → 0x00.
MOETRAIN_HOST_DEVICE uint8_t E8M0FromAmax(float amax, float fp8_max) {
  // The reciprocal is rounded from double, as TE's (float)(1.0 / fp8_max); one RN product.
  const float rcp = static_cast<float>(1.0 / static_cast<double>(fp8_max));
  const float v = MulRn(amax, rcp);
  const uint32_t bits = fp8_internal::Bits(v);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0xFF;
  if ((bits & 0x7FFFFFFFu) == 0x7F800000u) return 0xFE;
  if ((bits & 0x7FFFFFFFu) == 0u) return 0x00;
  // The byte drops the sign bit (an amax is never negative anyway).
  uint32_t exponent = (bits >> 23) & 0xFFu;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  // Round up to the next power of two unless that would leave the finite range (0xFE stays), and
  // not for subnormals up to 2^-127 (mantissa ≤ 0x400000), whose block 2^-127 already covers.
  if (mantissa > 0 && exponent != 0xFEu && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// 2^(e − 127): the dequantisation factor of an E8M0 byte. e = 0 gives the subnormal 2^-127
// (0x00400000); e = 255 is E8M0's NaN.
MOETRAIN_HOST_DEVICE float E8M0ScaleInv(uint8_t e) {
  if (e == 0xFF) return fp8_internal::FromBits(0x7FC00000u);
  if (e == 0) return fp8_internal::FromBits(0x00400000u);
  return fp8_internal::FromBits(static_cast<uint32_t>(e) << 23);
}

// 2^(127 − e) by exponent-field construction (e = 254 → 2^-127, e = 255 → NaN): the quantising
// multiplier.
MOETRAIN_HOST_DEVICE float E8M0QuantMultiplier(uint8_t e) {
  if (e == 0xFF) return fp8_internal::FromBits(0x7FC00000u);
  if (e == 0xFE) return fp8_internal::FromBits(0x00400000u);
  return fp8_internal::FromBits(static_cast<uint32_t>(254 - e) << 23);
}

// The FP8 bits of x (already multiplied by its scale), saturating: cvt.rn.satfinite, i.e. the
// bits of cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format). Round to nearest even;
// finite values beyond max and ±inf give ±max; float subnormals (far below half the smallest FP8
// subnormal) give ±0; NaN gives the canonical 0x7F in both formats, sign dropped, as cuda_fp8.h.
MOETRAIN_HOST_DEVICE uint8_t QuantizeFp8(float x, Fp8Format format) {
  const uint32_t bits = fp8_internal::Bits(x);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return 0x7F;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const bool e4m3 = format == Fp8Format::kE4M3;
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int max_code = e4m3 ? 0x7E : 0x7B;

  const int float_exponent = static_cast<int>(magnitude >> 23);
  if (float_exponent == 0) return sign;
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;  // 24 bits, implicit 1.
  // The exponent field x would have in FP8; ≤ 0 is the subnormal range, where each step down
  // drops one more significand bit.
  const int f8_exponent = float_exponent - 127 + bias;
  int shift = 23 - mantissa_bits;
  if (f8_exponent <= 0) shift += 1 - f8_exponent;
  // Below half the smallest subnormal (a tie at exactly half rounds to the even 0 below).
  if (shift > 24) return sign;
  uint32_t kept = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (kept & 1u))) ++kept;
  // For normals `kept` includes the implicit bit, so adding it to (exponent − 1) << m gives the
  // code, and a rounding carry moves into the exponent; a subnormal that rounds up to 1 << m
  // becomes the smallest normal the same way. Large and infinite inputs overshoot max_code
  // (inf: exponent 255 → a code far above it) and saturate.
  const int exponent_base = f8_exponent > 0 ? f8_exponent - 1 : 0;
  const int code = (exponent_base << mantissa_bits) + static_cast<int>(kept);
  return static_cast<uint8_t>(sign | (code > max_code ? max_code : code));
}

// The value of FP8 bits (exact in f32). E4M3 has no infinities (S.1111.111 is NaN); E5M2's
// exponent-31 codes are ±inf and NaN as in IEEE (QuantizeFp8 never makes ±inf).
MOETRAIN_HOST_DEVICE float Fp8ToFloat(uint8_t bits, Fp8Format format) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const bool e4m3 = format == Fp8Format::kE4M3;
  if (e4m3 && (bits & 0x7Fu) == 0x7Fu) return fp8_internal::FromBits(sign | 0x7FC00000u);
  if (!e4m3 && (bits & 0x7Cu) == 0x7Cu) {
    // Mantissa 0 is inf; otherwise NaN, its payload kept (0x7E → the quiet NaN 0x7FC00000).
    return fp8_internal::FromBits(sign | 0x7F800000u | static_cast<uint32_t>(bits & 0x03u) << 21);
  }
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const uint32_t exponent = (bits & 0x7Fu) >> mantissa_bits;
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1u);
  if (exponent == 0) {
    // Subnormal: mantissa · 2^(1 − bias − m), an exact product.
    const float unit =
        fp8_internal::FromBits(static_cast<uint32_t>(127 + 1 - bias - mantissa_bits) << 23);
    const float magnitude = static_cast<float>(mantissa) * unit;
    return fp8_internal::FromBits(fp8_internal::Bits(magnitude) | sign);
  }
  const uint32_t float_exponent = exponent + static_cast<uint32_t>(127 - bias);
  return fp8_internal::FromBits(sign | (float_exponent << 23) | (mantissa << (23 - mantissa_bits)));
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_FP8_MATH_H_
