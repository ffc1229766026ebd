#include "engine/core/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- Independent references: values by formula, rounding by comparing distances in double. ----

// The value of a finite fp8 code with `mantissa_bits` and `bias`, from the textbook formula.
double F8Value(int code, int mantissa_bits, int bias) {
  const int exponent = (code & 0x7F) >> mantissa_bits;
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, 1 - bias - mantissa_bits)
                    : std::ldexp(1.0 + std::ldexp(mantissa, -mantissa_bits), exponent - bias);
  return (code & 0x80) ? -magnitude : magnitude;
}

struct F8Spec {
  int mantissa_bits;
  int bias;
  int max_code;  // Largest finite positive code.
};
constexpr F8Spec kE4M3Spec = {3, 7, 0x7E};
constexpr F8Spec kE5M2Spec = {2, 15, 0x7B};

// Nearest finite code (magnitude), ties to the even code; beyond max that is max (saturation).
int F8Reference(float x, const F8Spec& spec) {
  const double magnitude = std::fabs(static_cast<double>(x));
  int best = 0;
  for (int code = 1; code <= spec.max_code; ++code) {
    const double d = std::fabs(F8Value(code, spec.mantissa_bits, spec.bias) - magnitude);
    const double best_d = std::fabs(F8Value(best, spec.mantissa_bits, spec.bias) - magnitude);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return (std::signbit(x) ? 0x80 : 0) | best;
}

// bf16 code -> value, with the code above the largest finite one standing for 2^128, which is
// where IEEE rounding puts infinity.
double BF16Value(uint32_t magnitude_code) {
  if (magnitude_code == 0x7F80) return std::ldexp(1.0, 128);
  return std::bit_cast<float>(magnitude_code << 16);
}

// Round to nearest even by picking the closer of the two neighbouring bf16 values.
uint16_t BF16Reference(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = bits >> 31 << 15;
  if (std::isnan(x)) return 0xFFFF;  // Marker: compared only with isnan below.
  if (std::isinf(x)) return static_cast<uint16_t>(sign | 0x7F80);
  const uint32_t below = (bits & 0x7FFFFFFF) >> 16;
  const double magnitude = std::fabs(static_cast<double>(x));
  const double down = magnitude - BF16Value(below);
  const double up = BF16Value(below + 1) - magnitude;
  const uint32_t pick = (down < up || (down == up && below % 2 == 0)) ? below : below + 1;
  return static_cast<uint16_t>(sign | pick);
}

bool BF16IsNaN(uint16_t bits) { return (bits & 0x7FFF) > 0x7F80; }

// Random floats with every exponent equally likely, plus specials now and then.
std::vector<float> RandomFloats(int count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> out;
  out.reserve(count);
  for (int i = 0; i < count; ++i) {
    switch (gen() % 32) {
      case 0:
        out.push_back(kNaN);
        break;
      case 1:
        out.push_back(-kInf);
        break;
      case 2:
        out.push_back(kInf);
        break;
      default:
        out.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
    }
  }
  return out;
}

// ---- DType metadata. ----

TEST(DtypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E5M2), 1u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "fp8_e4m3");
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "fp8_e5m2");
  EXPECT_EQ(DTypeName(DType::kI32), "i32");
  EXPECT_EQ(DTypeName(DType::kI64), "i64");
}

TEST(DtypeTest, ParseInvertsName) {
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DtypeTest, ParseRejectsUnknownNames) {
  absl::StatusOr<DType> parsed = ParseDType("xyz");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(),
            "unknown dtype 'xyz' (expected one of f32, bf16, fp8_e4m3, fp8_e5m2, i32, i64)");
  // Names are exact: no case folding, no prefixes.
  EXPECT_FALSE(ParseDType("F32").ok());
  EXPECT_FALSE(ParseDType("").ok());
  EXPECT_FALSE(ParseDType("bf1").ok());
}

// ---- bf16. ----

TEST(DtypeBF16Test, KnownValues) {
  EXPECT_EQ(FloatToBF16(1.0f).bits, 0x3F80);
  EXPECT_EQ(FloatToBF16(-2.0f).bits, 0xC000);
  EXPECT_EQ(FloatToBF16(3.14159265f).bits, 0x4049);  // 3.140625: the dropped bits are < half.
  EXPECT_EQ(FloatToBF16(-0.0f).bits, 0x8000);
  EXPECT_EQ(FloatToBF16(kInf).bits, 0x7F80);
  EXPECT_EQ(FloatToBF16(-kInf).bits, 0xFF80);
  EXPECT_EQ(BF16ToFloat(BF16{0x3F80}), 1.0f);
  EXPECT_EQ(BF16ToFloat(BF16{0x0001}), std::ldexp(1.0f, -133));  // Smallest subnormal.
  // The largest float is past the midpoint between the largest bf16 and 2^128: infinity.
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()).bits, 0x7F80);
}

TEST(DtypeBF16Test, EveryPatternRoundTrips) {
  for (uint32_t code = 0; code <= 0xFFFF; ++code) {
    const uint16_t bits = static_cast<uint16_t>(code);
    const float value = BF16ToFloat(BF16{bits});
    ASSERT_EQ(std::bit_cast<uint32_t>(value), code << 16) << "code " << code;
    const uint16_t back = FloatToBF16(value).bits;
    if (BF16IsNaN(bits)) {
      ASSERT_TRUE(BF16IsNaN(back)) << "code " << code;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << "sign of NaN " << code;
    } else {
      ASSERT_EQ(back, bits) << "code " << code;
    }
  }
}

TEST(DtypeBF16Test, MidpointsTieToEven) {
  // For mantissa parities even and odd, the exact midpoint and its float neighbours.
  for (uint32_t lower : {0x3F80u, 0x3F81u, 0x0000u, 0x0001u, 0x7F7Eu, 0xBF80u, 0xBF81u}) {
    const float midpoint = std::bit_cast<float>(lower << 16 | 0x8000);
    const uint16_t even = static_cast<uint16_t>(lower % 2 == 0 ? lower : lower + 1);
    EXPECT_EQ(FloatToBF16(midpoint).bits, even) << std::hex << lower;
    const float away = std::bit_cast<float>((lower << 16 | 0x8000) + 1);
    const float toward = std::bit_cast<float>((lower << 16 | 0x8000) - 1);
    EXPECT_EQ(FloatToBF16(away).bits, lower + 1) << std::hex << lower;
    EXPECT_EQ(FloatToBF16(toward).bits, lower) << std::hex << lower;
  }
}

TEST(DtypeBF16Test, NaNStaysNaNEvenWithOnlyLowPayloadBits) {
  // Truncating or rounding 0x7F800001 naively gives infinity.
  for (uint32_t bits : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    const uint16_t out = FloatToBF16(std::bit_cast<float>(bits)).bits;
    EXPECT_TRUE(BF16IsNaN(out)) << std::hex << bits;
    EXPECT_EQ(out >> 15, bits >> 31) << std::hex << bits;
  }
}

TEST(DtypeBF16Test, MatchesReferenceOnRandomFloats) {
  for (float x : RandomFloats(1 << 20, 1)) {
    const uint16_t got = FloatToBF16(x).bits;
    if (std::isnan(x)) {
      ASSERT_TRUE(BF16IsNaN(got));
    } else {
      ASSERT_EQ(got, BF16Reference(x)) << "x bits " << std::hex << std::bit_cast<uint32_t>(x);
    }
  }
}

TEST(DtypeBF16Test, BulkMatchesScalarAndStaysInBounds) {
  const std::vector<float> input = RandomFloats(1000, 2);
  for (int64_t n : {0, 1, 7, 17, 1000}) {
    std::vector<BF16> out(n + 1, BF16{0x1234});  // The extra element must stay untouched.
    ConvertF32ToBF16(input.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i].bits, FloatToBF16(input[i]).bits) << "n " << n << " i " << i;
    }
    EXPECT_EQ(out[n].bits, 0x1234) << "n " << n;

    std::vector<float> back(n + 1, 7.0f);
    ConvertBF16ToF32(out.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(BF16ToFloat(out[i])));
    }
    EXPECT_EQ(back[n], 7.0f) << "n " << n;
  }
}

// ---- fp8, both formats through one parameterised suite. ----

struct F8Case {
  const char* name;
  F8Spec spec;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
  bool is_nan(uint8_t code) const {
    return spec.mantissa_bits == 3 ? (code & 0x7F) == 0x7F : (code & 0x7F) > 0x7C;
  }
};

const F8Case kE4M3Case = {"E4M3", kE4M3Spec, [](float x) { return FloatToF8E4M3(x).bits; },
                          [](uint8_t c) { return F8E4M3ToFloat(F8E4M3{c}); }};
const F8Case kE5M2Case = {"E5M2", kE5M2Spec, [](float x) { return FloatToF8E5M2(x).bits; },
                          [](uint8_t c) { return F8E5M2ToFloat(F8E5M2{c}); }};

class DtypeF8Test : public testing::TestWithParam<F8Case> {};

TEST_P(DtypeF8Test, EveryPatternDecodesToFormulaAndRoundTrips) {
  const F8Case& f = GetParam();
  for (int code = 0; code < 256; ++code) {
    const uint8_t c = static_cast<uint8_t>(code);
    const float value = f.decode(c);
    const uint8_t back = f.encode(value);
    if (f.is_nan(c)) {
      ASSERT_TRUE(std::isnan(value)) << code;
      ASSERT_TRUE(f.is_nan(back)) << code;
    } else if (f.spec.mantissa_bits == 2 && (code & 0x7F) == 0x7C) {
      ASSERT_EQ(value, (code & 0x80) ? -kInf : kInf) << code;
      ASSERT_EQ(back, c) << code;
    } else {
      ASSERT_EQ(value, F8Value(code, f.spec.mantissa_bits, f.spec.bias)) << code;
      ASSERT_EQ(std::signbit(value), (code & 0x80) != 0) << code;  // Including -0.
      ASSERT_EQ(back, c) << code;
    }
  }
}

TEST_P(DtypeF8Test, AdjacentValuesTieToEvenAtMidpoints) {
  const F8Case& f = GetParam();
  for (int sign : {0, 0x80}) {
    for (int code = sign; code < (sign | f.spec.max_code); ++code) {
      const float a = f.decode(static_cast<uint8_t>(code));
      const float b = f.decode(static_cast<uint8_t>(code + 1));
      const float midpoint = (a + b) / 2;  // Exact: fp8 values have few significant bits.
      const int even = code % 2 == 0 ? code : code + 1;
      // Zero (0x00 or 0x80) is the even neighbour of the smallest subnormal.
      EXPECT_EQ(f.encode(midpoint), even) << f.name << " between " << code << " and " << code + 1;
      EXPECT_EQ(f.encode(std::nextafter(midpoint, b)), code + 1) << f.name << " code " << code;
      EXPECT_EQ(f.encode(std::nextafter(midpoint, a)), code) << f.name << " code " << code;
    }
  }
}

TEST_P(DtypeF8Test, SaturatesInfinitiesAndNaN) {
  const F8Case& f = GetParam();
  const float max = f.decode(static_cast<uint8_t>(f.spec.max_code));
  const bool has_inf = f.spec.mantissa_bits == 2;
  EXPECT_EQ(f.encode(max), f.spec.max_code);
  EXPECT_EQ(f.encode(-max), 0x80 | f.spec.max_code);
  for (float big : {max * 1.1f, max * 2, 1e30f, std::numeric_limits<float>::max()}) {
    EXPECT_EQ(f.encode(big), f.spec.max_code) << f.name << " " << big;
    EXPECT_EQ(f.encode(-big), 0x80 | f.spec.max_code) << f.name << " " << big;
  }
  EXPECT_EQ(f.encode(kInf), has_inf ? 0x7C : f.spec.max_code);
  EXPECT_EQ(f.encode(-kInf), has_inf ? 0xFC : 0x80 | f.spec.max_code);
  EXPECT_TRUE(f.is_nan(f.encode(kNaN)));
  EXPECT_TRUE(f.is_nan(f.encode(-kNaN)));
  EXPECT_TRUE(f.is_nan(f.encode(std::bit_cast<float>(0x7F800001u))));
}

TEST_P(DtypeF8Test, TinyValuesKeepTheirSign) {
  const F8Case& f = GetParam();
  const float smallest = f.decode(1);
  EXPECT_EQ(f.encode(0.0f), 0x00);
  EXPECT_EQ(f.encode(-0.0f), 0x80);
  EXPECT_EQ(f.encode(smallest / 2), 0x00);  // Tie with zero: zero is even.
  EXPECT_EQ(f.encode(-smallest / 2), 0x80);
  EXPECT_EQ(f.encode(smallest * 0.51f), 0x01);
  EXPECT_EQ(f.encode(-smallest * 0.51f), 0x81);
  EXPECT_EQ(f.encode(smallest / 3), 0x00);
  EXPECT_EQ(f.encode(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f.encode(-std::numeric_limits<float>::min()), 0x80);
}

TEST_P(DtypeF8Test, MatchesReferenceOnRandomFloats) {
  const F8Case& f = GetParam();
  std::mt19937 gen(3);
  // Log-uniform magnitudes from far below the subnormals to far above max.
  std::uniform_real_distribution<float> log2_magnitude(-30.0f, 20.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(log2_magnitude(gen));
    if (gen() % 2) x = -x;
    ASSERT_EQ(f.encode(x), F8Reference(x, f.spec))
        << f.name << " x = " << x << " bits " << std::hex << std::bit_cast<uint32_t>(x);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DtypeF8Test, testing::Values(kE4M3Case, kE5M2Case),
                         [](const testing::TestParamInfo<F8Case>& info) {
                           return info.param.name;
                         });

TEST(DtypeF8ValuesTest, KnownCodes) {
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0x7E}), kF8E4M3Max);
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0x38}), 1.0f);
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0x08}), std::ldexp(1.0f, -6));  // Smallest normal.
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0x01}), std::ldexp(1.0f, -9));  // Smallest subnormal.
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0xC0}), -2.0f);
  EXPECT_EQ(F8E5M2ToFloat(F8E5M2{0x7B}), kF8E5M2Max);
  EXPECT_EQ(F8E5M2ToFloat(F8E5M2{0x3C}), 1.0f);
  EXPECT_EQ(F8E5M2ToFloat(F8E5M2{0x04}), std::ldexp(1.0f, -14));
  EXPECT_EQ(F8E5M2ToFloat(F8E5M2{0x01}), std::ldexp(1.0f, -16));
  EXPECT_EQ(F8E5M2ToFloat(F8E5M2{0xFC}), -kInf);
  EXPECT_TRUE(std::isnan(F8E5M2ToFloat(F8E5M2{0x7E})));
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(F8E4M3{0xFF})));
  // E4M3 has no infinity: 0x78 (exponent all ones) is the finite 256.
  EXPECT_EQ(F8E4M3ToFloat(F8E4M3{0x78}), 256.0f);
  // Just past the midpoint of 1.875 and 2, the mantissa carry must move into the exponent.
  EXPECT_EQ(FloatToF8E4M3(1.9375f + 0.001f).bits, 0x40);
  EXPECT_EQ(FloatToF8E5M2(1.875f).bits, 0x40);  // Tie between 1.75 (odd) and 2 (even).
}

}  // namespace
}  // namespace moetrain
