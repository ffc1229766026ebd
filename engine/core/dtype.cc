#include "engine/core/dtype.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/dtype_math.h"
#include "engine/core/fast_math.h"

namespace moetrain {
namespace {

// One fp8 format: 1 sign bit, 7 - mantissa_bits exponent bits, mantissa_bits mantissa bits.
struct F8Format {
  int mantissa_bits;
  int bias;
  uint8_t max_finite;  // Code of the largest finite magnitude.
  uint8_t nan;         // Code of the (positive) NaN it produces.
  uint8_t infinity;    // Code that float infinity maps to (max_finite when it has no inf).
};

constexpr F8Format kE4M3 = {
    .mantissa_bits = 3, .bias = 7, .max_finite = 0x7E, .nan = 0x7F, .infinity = 0x7E};
constexpr F8Format kE5M2 = {
    .mantissa_bits = 2, .bias = 15, .max_finite = 0x7B, .nan = 0x7E, .infinity = 0x7C};

uint8_t FloatToF8Bits(float x, const F8Format& format) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | format.nan;
  if (magnitude == 0x7F800000u) return sign | format.infinity;

  // Float subnormals (below 2^-126) are far under half the smallest fp8 subnormal: they round to
  // (signed) zero, as does zero itself.
  const int float_exponent = static_cast<int>(magnitude >> 23);
  if (float_exponent == 0) return sign;
  const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;  // 24 bits, implicit 1.

  // Exponent field the value would have in fp8; <= 0 means it lands in the subnormal range,
  // where each step down drops one more significand bit.
  const int f8_exponent = float_exponent - 127 + format.bias;
  int shift = 23 - format.mantissa_bits;
  if (f8_exponent <= 0) shift += 1 - f8_exponent;
  // Even the largest significand is then below half of one unit: rounds to zero.
  if (shift > 24) return sign;

  uint32_t kept = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (kept & 1u))) ++kept;

  // For normals `kept` includes the implicit bit, so adding it to (exponent - 1) << m yields the
  // code directly, and a rounding carry moves into the exponent. A subnormal that rounds up to
  // 1 << m becomes the smallest normal the same way.
  const int exponent_base = f8_exponent > 0 ? f8_exponent - 1 : 0;
  const int code = (exponent_base << format.mantissa_bits) + static_cast<int>(kept);
  if (code > format.max_finite) return sign | format.max_finite;
  return sign | static_cast<uint8_t>(code);
}

// Only finite codes reach here.
float F8FiniteToFloat(uint8_t code, const F8Format& format) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const int exponent = (code & 0x7F) >> format.mantissa_bits;
  const uint32_t mantissa = code & ((1u << format.mantissa_bits) - 1);
  if (exponent == 0) {
    // Subnormal: mantissa * 2^(1 - bias - m), exact in float.
    const float magnitude =
        static_cast<float>(mantissa) * std::bit_cast<float>(static_cast<uint32_t>(
                                           (127 + 1 - format.bias - format.mantissa_bits) << 23));
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  const uint32_t float_exponent = static_cast<uint32_t>(exponent - format.bias + 127);
  return std::bit_cast<float>(sign | (float_exponent << 23) |
                              (mantissa << (23 - format.mantissa_bits)));
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;  // Not a valid enumerator.
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kF8E5M2:
      return "fp8_e5m2";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "invalid";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  // Debian's Abseil has its own string_view type, hence the explicit conversion below.
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64}) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", absl::string_view(name.data(), name.size()),
                   "' (expected one of f32, bf16, fp8_e4m3, fp8_e5m2, i32, i64)"));
}

absl::Status CheckComputeDType(DType dtype, std::string_view what) {
  if (dtype == DType::kF32 || dtype == DType::kBF16) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(absl::string_view(what.data(), what.size()), " = ",
                   absl::string_view(DTypeName(dtype).data(), DTypeName(dtype).size()),
                   " is not supported: the engine computes in f32 or bf16"));
}

BF16 FloatToBF16(float x) { return BF16{FloatToBF16Bits(x)}; }

float BF16ToFloat(BF16 x) { return BF16BitsToFloat(x.bits); }

F8E4M3 FloatToF8E4M3(float x) { return F8E4M3{FloatToF8Bits(x, kE4M3)}; }

float F8E4M3ToFloat(F8E4M3 x) {
  // E4M3FN spends the would-be infinity codes on finite values; only S.1111.111 is NaN.
  if ((x.bits & 0x7F) == 0x7F)
    return std::bit_cast<float>(0x7FC00000u | static_cast<uint32_t>(x.bits & 0x80u) << 24);
  return F8FiniteToFloat(x.bits, kE4M3);
}

F8E5M2 FloatToF8E5M2(float x) { return F8E5M2{FloatToF8Bits(x, kE5M2)}; }

float F8E5M2ToFloat(F8E5M2 x) {
  // E5M2 keeps IEEE specials: exponent all ones is inf (mantissa 0) or NaN; widening them to
  // float bit by bit keeps both and their sign.
  if ((x.bits & 0x7C) == 0x7C) {
    return std::bit_cast<float>(static_cast<uint32_t>(x.bits & 0x80u) << 24 | 0x7F800000u |
                                static_cast<uint32_t>(x.bits & 0x03u) << 21);
  }
  return F8FiniteToFloat(x.bits, kE5M2);
}

MOETRAIN_CLONES
void ConvertF32ToBF16(const float* src, BF16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = FloatToBF16Bits(src[i]);
}

MOETRAIN_CLONES
void ConvertBF16ToF32(const BF16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BF16BitsToFloat(src[i].bits);
}

}  // namespace moetrain
