#include "engine/core/fp8_math.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

// The oracle: cuda_fp8.h's host conversions (plain C++ that g++ compiles) when the CUDA toolkit's
// headers are on the include path (tests/CMakeLists.txt adds them when it finds them).
#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define MOETRAIN_HAVE_FP8_ORACLE 1
#else
#define MOETRAIN_HAVE_FP8_ORACLE 0
#endif

namespace moetrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

float F(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t B(float x) { return std::bit_cast<uint32_t>(x); }

// ---- QuantizeFp8 against cuda_fp8.h, bit for bit. ----

#if MOETRAIN_HAVE_FP8_ORACLE
uint8_t Oracle(float x, Fp8Format format) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
                               format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}
#endif

// Edges of both formats: zeros, float subnormals, FP8 subnormals and their halfway points, ±max,
// just above max, the rounding boundary to max, infinities and NaNs.
std::vector<float> EdgeValues() {
  std::vector<float> v = {0.0f,           1.0f,          1.5f,     448.0f,         464.0f,
                          480.0f,         57344.0f,      61440.0f, 65536.0f,       FLT_MAX,
                          FLT_MIN,        kInf,          kNaN,     F(0x7F800001u), F(0x7FFFFFFFu),
                          F(0x00000001u), F(0x007FFFFFu)};
  for (int e = -30; e <= 20; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float m : {1.0f, 1.125f, 1.25f, 1.375f, 1.0625f, 1.1875f, 1.5f, 1.75f, 1.875f, 1.9375f}) {
      v.push_back(p * m);
      v.push_back(std::nextafter(p * m, 0.0f));
      v.push_back(std::nextafter(p * m, kInf));
    }
  }
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

TEST(Fp8MathOracleTest, EveryBF16PatternMatchesCudaFp8) {
#if !MOETRAIN_HAVE_FP8_ORACLE
  GTEST_SKIP() << "cuda_fp8.h not found: the oracle comparison needs the CUDA toolkit's headers";
#else
  for (Fp8Format format : kFormats) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const float x = F(b << 16);
      ASSERT_EQ(QuantizeFp8(x, format), Oracle(x, format))
          << "format " << static_cast<int>(format) << " bits " << std::hex << (b << 16);
    }
  }
#endif
}

TEST(Fp8MathOracleTest, EdgesMatchCudaFp8) {
#if !MOETRAIN_HAVE_FP8_ORACLE
  GTEST_SKIP() << "cuda_fp8.h not found";
#else
  for (Fp8Format format : kFormats) {
    for (float x : EdgeValues()) {
      ASSERT_EQ(QuantizeFp8(x, format), Oracle(x, format))
          << "format " << static_cast<int>(format) << " bits " << std::hex << B(x);
    }
    // Every FP8 value, and the midpoints between neighbours and their float neighbours.
    for (int code = 0; code < 256; ++code) {
      const float a = Fp8ToFloat(static_cast<uint8_t>(code), format);
      const float b = Fp8ToFloat(static_cast<uint8_t>(code + 1), format);
      for (float x :
           {a, (a + b) / 2, std::nextafter((a + b) / 2, a), std::nextafter((a + b) / 2, b)}) {
        ASSERT_EQ(QuantizeFp8(x, format), Oracle(x, format))
            << "format " << static_cast<int>(format) << " code " << code << " bits " << std::hex
            << B(x);
      }
    }
  }
#endif
}

TEST(Fp8MathOracleTest, RandomFloatBitsMatchCudaFp8) {
#if !MOETRAIN_HAVE_FP8_ORACLE
  GTEST_SKIP() << "cuda_fp8.h not found";
#else
  std::mt19937 gen(16);
  for (Fp8Format format : kFormats) {
    // Uniform bit patterns (mostly huge or tiny magnitudes), then patterns whose exponent lies
    // around the FP8 range, where the rounding happens.
    for (int i = 0; i < 2'000'000; ++i) {
      const uint32_t bits = static_cast<uint32_t>(gen());
      ASSERT_EQ(QuantizeFp8(F(bits), format), Oracle(F(bits), format)) << std::hex << bits;
    }
    for (int i = 0; i < 2'000'000; ++i) {
      const uint32_t r = static_cast<uint32_t>(gen());
      const uint32_t exponent = 127 - 30 + (r >> 24) % 52;  // 2^-30 .. 2^21
      const uint32_t bits = (r & 0x807FFFFFu) | exponent << 23;
      ASSERT_EQ(QuantizeFp8(F(bits), format), Oracle(F(bits), format)) << std::hex << bits;
    }
  }
#endif
}

// ---- QuantizeFp8 and Fp8ToFloat, hand-computed. ----

TEST(Fp8MathTest, QuantizeKnownCodes) {
  EXPECT_EQ(QuantizeFp8(1.0f, Fp8Format::kE4M3), 0x38);
  EXPECT_EQ(QuantizeFp8(-2.0f, Fp8Format::kE4M3), 0xC0);
  EXPECT_EQ(QuantizeFp8(448.0f, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(QuantizeFp8(464.0f, Fp8Format::kE4M3), 0x7E);  // Tie: 448's mantissa is even.
  EXPECT_EQ(QuantizeFp8(1e6f, Fp8Format::kE4M3), 0x7E);    // Saturates.
  EXPECT_EQ(QuantizeFp8(-kInf, Fp8Format::kE4M3), 0xFE);
  EXPECT_EQ(QuantizeFp8(kInf, Fp8Format::kE5M2), 0x7B);  // satfinite: no inf.
  EXPECT_EQ(QuantizeFp8(-kInf, Fp8Format::kE5M2), 0xFB);
  EXPECT_EQ(QuantizeFp8(61440.0f, Fp8Format::kE5M2), 0x7B);
  EXPECT_EQ(QuantizeFp8(kNaN, Fp8Format::kE4M3), 0x7F);
  EXPECT_EQ(QuantizeFp8(-kNaN, Fp8Format::kE4M3), 0x7F);  // Canonical NaN, sign dropped.
  EXPECT_EQ(QuantizeFp8(-kNaN, Fp8Format::kE5M2), 0x7F);
  EXPECT_EQ(QuantizeFp8(-0.0f, Fp8Format::kE4M3), 0x80);
  EXPECT_EQ(QuantizeFp8(std::ldexp(1.0f, -9), Fp8Format::kE4M3), 0x01);   // Smallest subnormal.
  EXPECT_EQ(QuantizeFp8(std::ldexp(1.0f, -10), Fp8Format::kE4M3), 0x00);  // Tie to even zero.
  EXPECT_EQ(QuantizeFp8(std::ldexp(1.5f, -10), Fp8Format::kE4M3), 0x01);
  EXPECT_EQ(QuantizeFp8(-std::ldexp(3.0f, -10), Fp8Format::kE4M3), 0x82);  // 1.5 ulp → even 2.
  EXPECT_EQ(QuantizeFp8(std::ldexp(1.0f, -16), Fp8Format::kE5M2), 0x01);
  EXPECT_EQ(QuantizeFp8(F(0x00000001u), Fp8Format::kE5M2), 0x00);
}

TEST(Fp8MathTest, EveryCodeDecodesAndRoundTrips) {
  for (Fp8Format format : kFormats) {
    for (int code = 0; code < 256; ++code) {
      const float x = Fp8ToFloat(static_cast<uint8_t>(code), format);
      const bool nan_code =
          format == Fp8Format::kE4M3 ? (code & 0x7F) == 0x7F : (code & 0x7F) > 0x7C;
      const bool inf_code = format == Fp8Format::kE5M2 && (code & 0x7F) == 0x7C;
      if (nan_code) {
        EXPECT_TRUE(std::isnan(x)) << code;
      } else if (inf_code) {
        EXPECT_EQ(x, (code & 0x80) ? -kInf : kInf);
      } else {
        EXPECT_EQ(QuantizeFp8(x, format), code) << code;
        EXPECT_LE(std::fabs(x), Fp8Max(format));
      }
    }
  }
  EXPECT_EQ(Fp8ToFloat(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(Fp8ToFloat(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8ToFloat(0x7B, Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(Fp8ToFloat(0x83, Fp8Format::kE5M2), -std::ldexp(3.0f, -16));
}

// ---- ScaleFromAmax. ----

TEST(Fp8MathTest, ScaleFromAmaxSpecialAmaxes) {
  EXPECT_EQ(ScaleFromAmax(0.0f, 448.0f, false, 0.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(ScaleFromAmax(kNaN, 448.0f, false, 0.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(ScaleFromAmax(kInf, 448.0f, false, 0.0f, FLT_MAX), 1.0f);
  EXPECT_EQ(ScaleFromAmax(kNaN, 448.0f, true, 1e-3f, FLT_MAX), 1.0f);
  // Epsilon lifts small amaxes (0 included) before the division.
  EXPECT_EQ(ScaleFromAmax(0.0f, 448.0f, false, 0.5f, FLT_MAX), 896.0f);
  EXPECT_EQ(ScaleFromAmax(0.25f, 448.0f, false, 0.5f, FLT_MAX), 896.0f);
  EXPECT_EQ(ScaleFromAmax(1.0f, 448.0f, false, 0.5f, FLT_MAX), 448.0f);
}

TEST(Fp8MathTest, ScaleFromAmaxDividesAndRoundsDownToPowersOfTwo) {
  EXPECT_EQ(ScaleFromAmax(3.0f, 448.0f, false, 0.0f, FLT_MAX), 448.0f / 3.0f);
  // 448 / 3 = 149.33 → 128.
  EXPECT_EQ(ScaleFromAmax(3.0f, 448.0f, true, 0.0f, FLT_MAX), 128.0f);
  // An amax that is a power of two: 448 / 4 = 112 → 64; 57344 / 8192 = 7 → 4.
  EXPECT_EQ(ScaleFromAmax(4.0f, 448.0f, false, 0.0f, FLT_MAX), 112.0f);
  EXPECT_EQ(ScaleFromAmax(4.0f, 448.0f, true, 0.0f, FLT_MAX), 64.0f);
  EXPECT_EQ(ScaleFromAmax(8192.0f, 57344.0f, true, 0.0f, FLT_MAX), 4.0f);
  // Already a power of two: unchanged.
  EXPECT_EQ(ScaleFromAmax(448.0f / 256.0f, 448.0f, true, 0.0f, FLT_MAX), 256.0f);
  // Large amax: scale below 1.
  EXPECT_EQ(ScaleFromAmax(1e6f, 448.0f, false, 0.0f, FLT_MAX), 448.0f / 1e6f);
  EXPECT_EQ(ScaleFromAmax(1e6f, 448.0f, true, 0.0f, FLT_MAX), std::ldexp(1.0f, -12));
}

TEST(Fp8MathTest, ScaleFromAmaxOverflowGivesValueForInf) {
  const float tiny = F(0x00000001u);  // 448 / 2^-149 overflows.
  EXPECT_EQ(ScaleFromAmax(tiny, 448.0f, false, 0.0f, FLT_MAX), FLT_MAX);
  EXPECT_EQ(ScaleFromAmax(tiny, 448.0f, false, 0.0f, 1234.0f), 1234.0f);
  // pow2 applies after the replacement: FLT_MAX → 2^127.
  EXPECT_EQ(ScaleFromAmax(tiny, 448.0f, true, 0.0f, FLT_MAX), std::ldexp(1.0f, 127));
  // A small amax whose quotient still fits is divided normally.
  EXPECT_EQ(ScaleFromAmax(1e-35f, 448.0f, false, 0.0f, FLT_MAX), 448.0f / 1e-35f);
  EXPECT_EQ(ScaleFromAmax(FLT_MIN, 448.0f, false, 0.0f, FLT_MAX), FLT_MAX);  // 448 / 2^-126.
}

// ---- E8M0. ----

TEST(Fp8MathTest, E8M0FromAmaxSpecialsAndRounding) {
  EXPECT_EQ(E8M0FromAmax(kNaN, 448.0f), 0xFF);
  EXPECT_EQ(E8M0FromAmax(kInf, 448.0f), 0xFE);
  EXPECT_EQ(E8M0FromAmax(0.0f, 448.0f), 0x00);
  // 448 · (1/448) = 1 exactly? (float)(1/448) is rounded, so the product may be just off 1: the
  // formula, spelled out.
  const float rcp = static_cast<float>(1.0 / 448.0);
  auto expect = [](float v) {
    const uint32_t bits = B(v);
    uint32_t e = bits >> 23 & 0xFF;
    const uint32_t m = bits & 0x7FFFFF;
    if (m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000)) ++e;
    return static_cast<uint8_t>(e);
  };
  for (float amax : {448.0f, 1.0f, 3.0f, 1e-3f, 1e30f, 896.0f}) {
    EXPECT_EQ(E8M0FromAmax(amax, 448.0f), expect(amax * rcp)) << amax;
  }
  // amax · rcp a power of two (mantissa 0): no increment. 2^k · 57344 · (1/57344) for E5M2:
  // 1/57344 = 1/7 · 2^-13 is not a power of two, so use a value whose product has mantissa 0.
  const float p = F(0x3F800000u);  // 1.0
  EXPECT_EQ(expect(p), 127);
  // A mantissa ≠ 0 rounds up: 3 · rcp ≈ 0.0067 = 1.71 · 2^-8 → 2^-7 → 120.
  EXPECT_EQ(E8M0FromAmax(3.0f, 448.0f), 120);
  // 448 · rcp: rcp = 1/448 rounded; the product rounds to 1.0 or next to it.
  const uint8_t e448 = E8M0FromAmax(448.0f, 448.0f);
  EXPECT_TRUE(e448 == 127 || e448 == 128) << int{e448};
  EXPECT_EQ(e448, expect(448.0f * rcp));
  // The largest finite amax: v ≈ 7.6e35 (exponent 246) rounds up to 247.
  EXPECT_EQ(E8M0FromAmax(FLT_MAX, 448.0f), expect(FLT_MAX * rcp));
  // fp8_max = 1 makes v = amax: exponent 0xFE with a mantissa stays 0xFE (no increment to NaN).
  EXPECT_EQ(E8M0FromAmax(FLT_MAX, 1.0f), 0xFE);
  EXPECT_EQ(E8M0FromAmax(std::ldexp(1.0f, 127), 1.0f), 0xFE);
  EXPECT_EQ(E8M0FromAmax(std::ldexp(1.5f, 126), 1.0f), 0xFE);  // 0xFD rounds up.
  // Subnormal v: mantissa ≤ 0x400000 stays 0 (2^-127 covers it); above it rounds up to 1.
  EXPECT_EQ(E8M0FromAmax(F(0x00400000u), 1.0f), 0x00);
  EXPECT_EQ(E8M0FromAmax(F(0x00000001u), 1.0f), 0x00);
  EXPECT_EQ(E8M0FromAmax(F(0x00400001u), 1.0f), 0x01);
  EXPECT_EQ(E8M0FromAmax(F(0x007FFFFFu), 1.0f), 0x01);
  // Normal powers of two: exact exponent.
  EXPECT_EQ(E8M0FromAmax(FLT_MIN, 1.0f), 0x01);
  EXPECT_EQ(E8M0FromAmax(1.0f, 1.0f), 127);
  EXPECT_EQ(E8M0FromAmax(1.0f + FLT_EPSILON, 1.0f), 128);
}

TEST(Fp8MathTest, E8M0ScaleInvAndMultiplier) {
  EXPECT_EQ(E8M0ScaleInv(127), 1.0f);
  EXPECT_EQ(E8M0ScaleInv(128), 2.0f);
  EXPECT_EQ(E8M0ScaleInv(1), FLT_MIN);
  EXPECT_EQ(E8M0ScaleInv(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(E8M0ScaleInv(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8M0ScaleInv(255)));
  EXPECT_EQ(E8M0QuantMultiplier(127), 1.0f);
  EXPECT_EQ(E8M0QuantMultiplier(128), 0.5f);
  EXPECT_EQ(E8M0QuantMultiplier(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(E8M0QuantMultiplier(1), std::ldexp(1.0f, 126));
  EXPECT_EQ(E8M0QuantMultiplier(253), std::ldexp(1.0f, -126));
  EXPECT_EQ(B(E8M0QuantMultiplier(254)), 0x00400000u);  // 2^-127, a subnormal.
  EXPECT_TRUE(std::isnan(E8M0QuantMultiplier(255)));
  // Multiplier and scale_inv are reciprocals over the whole finite range.
  for (int e = 0; e <= 254; ++e) {
    EXPECT_EQ(E8M0QuantMultiplier(static_cast<uint8_t>(e)) * E8M0ScaleInv(static_cast<uint8_t>(e)),
              1.0f)
        << e;
  }
}

// The MX block's largest element, after its multiplier, lands within the format: rounding the
// exponent up never saturates.
TEST(Fp8MathTest, E8M0ScaledAmaxNeverExceedsMax) {
  std::mt19937 gen(5);
  for (Fp8Format format : kFormats) {
    for (int i = 0; i < 100000; ++i) {
      const uint32_t r = static_cast<uint32_t>(gen());
      const float amax = F((r & 0x7FFFFFu) | (((r >> 23) % 254) << 23));
      const uint8_t e = E8M0FromAmax(amax, Fp8Max(format));
      EXPECT_LE(amax * E8M0QuantMultiplier(e), Fp8Max(format)) << amax;
    }
  }
}

TEST(Fp8MathTest, AmaxFoldIsNaNSticky) {
  EXPECT_EQ(Fp8AmaxFold(0.0f, -3.0f), 3.0f);
  EXPECT_EQ(Fp8AmaxFold(4.0f, -3.0f), 4.0f);
  EXPECT_EQ(Fp8AmaxFold(4.0f, -kInf), kInf);
  EXPECT_TRUE(std::isnan(Fp8AmaxFold(4.0f, -kNaN)));
  EXPECT_TRUE(std::isnan(Fp8AmaxFold(kNaN, 5.0f)));
  EXPECT_FALSE(std::signbit(Fp8AmaxFold(0.0f, -0.0f)));
}

}  // namespace
}  // namespace moetrain
