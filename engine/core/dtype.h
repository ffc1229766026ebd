// Element types and exact conversions between them.
//
// bf16: the top 16 bits of an IEEE float, rounded to nearest even; NaN stays NaN (quiet).
// fp8 E4M3 (OCP "E4M3FN"): bias 7, max 448, no infinities, NaN = S.1111.111; conversion from
//   float rounds to nearest even and saturates to ±448 (inf too); NaN becomes 0x7F.
// fp8 E5M2: bias 15, max 57344, has inf and NaN like IEEE; conversion rounds to nearest even and
//   saturates finite values beyond max to ±57344; inf stays inf, NaN becomes 0x7F.
// Both are engine/core/fp8_math.h's QuantizeFp8 (cuda_fp8.h's satfinite casts), except that
// E5M2 keeps infinities here.
#ifndef MOETRAIN_ENGINE_CORE_DTYPE_H_
#define MOETRAIN_ENGINE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace moetrain {

enum class DType : uint8_t { kF32, kBF16, kF8E4M3, kF8E5M2, kI32, kI64 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "f32", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64".
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; InvalidArgument naming the value otherwise.
absl::StatusOr<DType> ParseDType(std::string_view name);

// The engine computes in f32 or bf16: OK for those, else InvalidArgument naming `what` and the
// dtype ("train.precision = fp8_e4m3 is not supported: the engine computes in f32 or bf16").
absl::Status CheckComputeDType(DType dtype, std::string_view what);

// Storage types: the raw bits of one element.
struct BF16 {
  uint16_t bits;
};
struct F8E4M3 {
  uint8_t bits;
};
struct F8E5M2 {
  uint8_t bits;
};

BF16 FloatToBF16(float x);
float BF16ToFloat(BF16 x);
F8E4M3 FloatToF8E4M3(float x);
float F8E4M3ToFloat(F8E4M3 x);
F8E5M2 FloatToF8E5M2(float x);
float F8E5M2ToFloat(F8E5M2 x);

inline constexpr float kF8E4M3Max = 448.0f;
inline constexpr float kF8E5M2Max = 57344.0f;

// Bulk conversions over n contiguous elements (vectorised where the CPU allows).
void ConvertF32ToBF16(const float* src, BF16* dst, int64_t n);
void ConvertBF16ToF32(const BF16* src, float* dst, int64_t n);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_DTYPE_H_
