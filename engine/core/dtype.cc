#include "engine/core/dtype.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/dtype_math.h"
#include "engine/core/fast_math.h"
#include "engine/core/fp8_math.h"

namespace moetrain {

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

// One implementation with the FP8 ops (engine/core/fp8_math.h): E4M3 is exactly its satfinite
// cast; E5M2 differs only in keeping infinities, which the storage type can represent.
F8E4M3 FloatToF8E4M3(float x) { return F8E4M3{QuantizeFp8(x, Fp8Format::kE4M3)}; }

float F8E4M3ToFloat(F8E4M3 x) { return Fp8ToFloat(x.bits, Fp8Format::kE4M3); }

F8E5M2 FloatToF8E5M2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) == 0x7F800000u)
    return F8E5M2{static_cast<uint8_t>(((bits >> 24) & 0x80u) | 0x7Cu)};
  return F8E5M2{QuantizeFp8(x, Fp8Format::kE5M2)};
}

float F8E5M2ToFloat(F8E5M2 x) { return Fp8ToFloat(x.bits, Fp8Format::kE5M2); }

MOETRAIN_CLONES
void ConvertF32ToBF16(const float* src, BF16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = FloatToBF16Bits(src[i]);
}

MOETRAIN_CLONES
void ConvertBF16ToF32(const BF16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BF16BitsToFloat(src[i].bits);
}

}  // namespace moetrain
