#include "engine/ops/fp8/fp8.h"

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/fp8_math.h"
#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

using ops::Fp8Scaling;
using ops::Fp8Tensor;
using test_util::IsInvalidArgument;

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t Pad4(int64_t n) { return (n + 3) / 4 * 4; }

// ---------------------------------------------------------------------------------------------
// The reference: a plain scalar quantiser written from fp8.h's layout and fp8_math.h's formulas,
// element (i, j) at a time with explicit indices; no code shared with fp8_cpu.cc but the
// per-element formulas themselves.
// ---------------------------------------------------------------------------------------------

struct RefQuantized {
  std::vector<uint8_t> data;  // rows × Fp8PaddedCols(cols)
  std::vector<float> scale_inv;
  float scale = 0.0f;  // kTensor
  float amax = 0.0f;   // of the whole source, NaN-sticky
  int64_t saturated = 0;
};

struct RefParams {
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  bool transpose = false;
  bool pow2 = false;
  float epsilon = 0.0f;
  bool compute_scale = false;
  float given_scale = 1.0f;  // kTensor with compute_scale false
  DType src_dtype = DType::kF32;
};

// The NaN-sticky maximum magnitude of a list of values.
float RefAmax(const std::vector<float>& v) {
  float amax = 0.0f;
  for (float x : v) {
    if (std::isnan(x)) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x));
  }
  return amax;
}

// src: R × C values (already what the tensor stores).
RefQuantized RefQuantize(const std::vector<float>& src, int64_t src_rows, int64_t src_cols,
                         const RefParams& p) {
  const int64_t rows = p.transpose ? src_cols : src_rows;
  const int64_t cols = p.transpose ? src_rows : src_cols;
  const int64_t padded = (cols + 15) / 16 * 16;
  auto x = [&](int64_t i, int64_t j) {
    return p.transpose ? src[j * src_cols + i] : src[i * src_cols + j];
  };
  const float fp8_max = p.format == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
  const float value_for_inf = p.src_dtype == DType::kBF16 ? BF16ToFloat(BF16{0x7F7F}) : FLT_MAX;
  RefQuantized r;
  r.data.assign(rows * padded, 0);
  r.amax = RefAmax(src);
  auto put = [&](int64_t i, int64_t j, float multiplier) {
    const float y = x(i, j) * multiplier;
    r.data[i * padded + j] = QuantizeFp8(y, p.format);
    if (std::fabs(y) > fp8_max) ++r.saturated;
  };
  switch (p.scaling) {
    case Fp8Scaling::kTensor: {
      r.scale = p.compute_scale ? ScaleFromAmax(r.amax, fp8_max, p.pow2, p.epsilon, FLT_MAX)
                                : p.given_scale;
      r.scale_inv = {1.0f / r.scale};
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) put(i, j, r.scale);
      break;
    }
    case Fp8Scaling::kBlock1x128: {
      const int64_t nb = CeilDiv(cols, 128), pr = Pad4(rows);
      r.scale_inv.assign(nb * pr, 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t b = 0; b < nb; ++b) {
          std::vector<float> block;
          for (int64_t j = b * 128; j < std::min(cols, b * 128 + 128); ++j)
            block.push_back(x(i, j));
          const float scale =
              ScaleFromAmax(RefAmax(block), fp8_max, p.pow2, p.epsilon, value_for_inf);
          r.scale_inv[b * pr + i] = 1.0f / scale;
          for (int64_t j = b * 128; j < std::min(cols, b * 128 + 128); ++j) put(i, j, scale);
        }
      }
      break;
    }
    case Fp8Scaling::kBlock128x128: {
      const int64_t nrb = CeilDiv(rows, 128), ncb = CeilDiv(cols, 128), pc = Pad4(ncb);
      r.scale_inv.assign(nrb * pc, 0.0f);
      for (int64_t rb = 0; rb < nrb; ++rb) {
        for (int64_t cb = 0; cb < ncb; ++cb) {
          std::vector<float> block;
          for (int64_t i = rb * 128; i < std::min(rows, rb * 128 + 128); ++i)
            for (int64_t j = cb * 128; j < std::min(cols, cb * 128 + 128); ++j)
              block.push_back(x(i, j));
          const float scale =
              ScaleFromAmax(RefAmax(block), fp8_max, p.pow2, p.epsilon, value_for_inf);
          r.scale_inv[rb * pc + cb] = 1.0f / scale;
          for (int64_t i = rb * 128; i < std::min(rows, rb * 128 + 128); ++i)
            for (int64_t j = cb * 128; j < std::min(cols, cb * 128 + 128); ++j) put(i, j, scale);
        }
      }
      break;
    }
    case Fp8Scaling::kMx1x32: {
      const int64_t nb = CeilDiv(cols, 32);
      r.scale_inv.assign(rows * nb, 0.0f);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t b = 0; b < nb; ++b) {
          std::vector<float> block;
          for (int64_t j = b * 32; j < std::min(cols, b * 32 + 32); ++j) block.push_back(x(i, j));
          const uint8_t e = E8M0FromAmax(RefAmax(block), fp8_max);
          r.scale_inv[i * nb + b] = E8M0ScaleInv(e);
          for (int64_t j = b * 32; j < std::min(cols, b * 32 + 32); ++j)
            put(i, j, E8M0QuantMultiplier(e));
        }
      }
      break;
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Running the op.
// ---------------------------------------------------------------------------------------------

struct Quantized {
  ops::OwnedFp8Tensor q;
  Tensor scale = Tensor::Zeros(DType::kF32, {1});
  Tensor amax = Tensor::Zeros(DType::kF32, {1});
  Tensor saturated = Tensor::Zeros(DType::kI64, {1});
};

// Quantises src (R, C) with p on `ctx`; data and scale_inv start as garbage (0xAB bytes, NaN
// scales) so that unwritten padding shows.
Quantized RunQuantize(const ExecContext& ctx, const Tensor& src, const RefParams& p) {
  const int64_t rows = p.transpose ? src.dim(1) : src.dim(0);
  const int64_t cols = p.transpose ? src.dim(0) : src.dim(1);
  Quantized out;
  absl::StatusOr<ops::OwnedFp8Tensor> q =
      ops::AllocateFp8Tensor(ctx, p.format, p.scaling, rows, cols);
  EXPECT_TRUE(q.ok()) << q.status();
  out.q = std::move(*q);
  std::memset(out.q.data.data<uint8_t>(), 0xAB, out.q.data.numel());
  for (int64_t i = 0; i < out.q.scale_inv.numel(); ++i) out.q.scale_inv.data<float>()[i] = kNaN;
  out.scale.data<float>()[0] = p.compute_scale ? kNaN : p.given_scale;
  ops::Fp8QuantizeArgs args;
  args.src = src;
  args.transpose = p.transpose;
  args.pow2_scales = p.pow2;
  args.amax_epsilon = p.epsilon;
  if (p.scaling == Fp8Scaling::kTensor) args.scale = out.scale;
  args.compute_scale = p.compute_scale;
  args.out = out.q.view;
  args.amax = out.amax;
  args.saturated = out.saturated;
  const absl::Status status = ops::Fp8Quantize(ctx, args);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Fp8QuantizeArgs by assignment (designated initialisers would leave the other views to
// -Wmissing-field-initializers).
ops::Fp8QuantizeArgs Args(const TensorView& src, const TensorView& scale, const Fp8Tensor& out,
                          const TensorView& amax = TensorView(),
                          const TensorView& saturated = TensorView()) {
  ops::Fp8QuantizeArgs args;
  args.src = src;
  args.scale = scale;
  args.out = out;
  args.amax = amax;
  args.saturated = saturated;
  return args;
}

// Bit-equality of the op's result and the reference, with the first difference named.
void ExpectMatchesReference(const Quantized& got, const RefQuantized& want, const RefParams& p) {
  const uint8_t* data = got.q.data.data<uint8_t>();
  ASSERT_EQ(got.q.data.numel(), static_cast<int64_t>(want.data.size()));
  for (size_t i = 0; i < want.data.size(); ++i) {
    ASSERT_EQ(data[i], want.data[i]) << "data byte " << i;
  }
  ASSERT_EQ(got.q.scale_inv.numel(), static_cast<int64_t>(want.scale_inv.size()));
  for (size_t i = 0; i < want.scale_inv.size(); ++i) {
    ASSERT_EQ(Bits(got.q.scale_inv.data<float>()[i]), Bits(want.scale_inv[i]))
        << "scale_inv " << i << ": " << got.q.scale_inv.data<float>()[i] << " vs "
        << want.scale_inv[i];
  }
  if (p.scaling == Fp8Scaling::kTensor) {
    EXPECT_EQ(Bits(got.scale.data<float>()[0]), Bits(want.scale));
  }
  EXPECT_EQ(Bits(got.amax.data<float>()[0]), Bits(want.amax));
  EXPECT_EQ(got.saturated.data<int64_t>()[0], want.saturated);
}

// Values over many binades (so blocks have different scales), some above E4M3's max; with
// `specials`, a few NaN, ±inf, zeros and subnormal-range values.
std::vector<float> TestValues(int64_t n, std::mt19937& rng, bool specials) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-12, 10);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = normal(rng) * std::ldexp(1.0f, binade(rng));
  if (specials && n > 0) {
    const float kinds[] = {kNaN, kInf, -kInf, 0.0f, -0.0f, 1e-30f, 600.0f, -70000.0f};
    for (int k = 0; k < 8 && k < n; ++k) v[rng() % n] = kinds[k];
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Every scaling, format, source dtype, orientation and shape against the reference.
// ---------------------------------------------------------------------------------------------

using QuantizeParam = std::tuple<Fp8Scaling, Fp8Format, DType, bool, Size>;

const char* ScalingName(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::kTensor:
      return "Tensor";
    case Fp8Scaling::kBlock1x128:
      return "Block1x128";
    case Fp8Scaling::kBlock128x128:
      return "Block128x128";
    case Fp8Scaling::kMx1x32:
      return "Mx1x32";
  }
  return "?";
}

class Fp8QuantizeTest : public ::testing::TestWithParam<QuantizeParam> {};

TEST_P(Fp8QuantizeTest, MatchesScalarReferenceBitForBit) {
  const auto [scaling, format, dtype, transpose, size] = GetParam();
  const std::vector<RefParams> variants = [&] {
    RefParams base{
        .format = format, .scaling = scaling, .transpose = transpose, .src_dtype = dtype};
    std::vector<RefParams> v;
    if (scaling == Fp8Scaling::kTensor) {
      RefParams delayed = base;
      delayed.given_scale = 3.5f;
      RefParams current = base;
      current.compute_scale = true;
      RefParams current_pow2 = current;
      current_pow2.pow2 = true;
      current_pow2.epsilon = 1e-3f;
      v = {delayed, current, current_pow2};
    } else {
      RefParams pow2 = base;
      pow2.pow2 = true;
      RefParams eps = base;
      eps.epsilon = 0.5f;
      v = {base, pow2, eps};
    }
    return v;
  }();
  for (bool specials : {false, true}) {
    for (const RefParams& p : variants) {
      std::mt19937 rng(static_cast<uint32_t>(size.rows * 1000 + size.cols + specials));
      std::vector<float> values = TestValues(size.rows * size.cols, rng, specials);
      Tensor src = MakeAct(dtype, {size.rows, size.cols}, values);
      const Quantized got = RunQuantize(Cpu(), src, p);
      SCOPED_TRACE(::testing::Message() << "specials " << specials << " pow2 " << p.pow2 << " eps "
                                        << p.epsilon << " compute_scale " << p.compute_scale);
      ExpectMatchesReference(got, RefQuantize(values, size.rows, size.cols, p), p);
    }
  }
}

// Quantise, then dequantise to f32 and bf16: each element is Fp8ToFloat(q) · its scale_inv.
TEST_P(Fp8QuantizeTest, DequantizeIsStoredValueTimesScaleInv) {
  const auto [scaling, format, dtype, transpose, size] = GetParam();
  RefParams p{.format = format,
              .scaling = scaling,
              .transpose = transpose,
              .compute_scale = true,
              .src_dtype = dtype};
  std::mt19937 rng(static_cast<uint32_t>(size.rows + 7 * size.cols));
  std::vector<float> values = TestValues(size.rows * size.cols, rng, false);
  Tensor src = MakeAct(dtype, {size.rows, size.cols}, values);
  const Quantized got = RunQuantize(Cpu(), src, p);
  const RefQuantized want = RefQuantize(values, size.rows, size.cols, p);
  const int64_t rows = got.q.view.rows, cols = got.q.view.cols, padded = (cols + 15) / 16 * 16;
  for (DType dst_dtype : {DType::kF32, DType::kBF16}) {
    Tensor dst = NaNAct(dst_dtype, {rows, cols});
    ASSERT_OK(ops::Fp8Dequantize(Cpu(), got.q.view, dst));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        float s = 0.0f;
        switch (scaling) {
          case Fp8Scaling::kTensor:
            s = want.scale_inv[0];
            break;
          case Fp8Scaling::kBlock1x128:
            s = want.scale_inv[(j / 128) * Pad4(rows) + i];
            break;
          case Fp8Scaling::kBlock128x128:
            s = want.scale_inv[(i / 128) * Pad4(CeilDiv(cols, 128)) + j / 128];
            break;
          case Fp8Scaling::kMx1x32:
            s = want.scale_inv[i * CeilDiv(cols, 32) + j / 32];
            break;
        }
        const float value = Fp8ToFloat(want.data[i * padded + j], format) * s;
        const float got_value = dst_dtype == DType::kF32
                                    ? dst.data<float>()[i * cols + j]
                                    : BF16ToFloat(dst.data<BF16>()[i * cols + j]);
        const float want_value = dst_dtype == DType::kF32 ? value : test_util::RoundToBF16(value);
        ASSERT_EQ(Bits(got_value), Bits(want_value)) << i << ", " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8QuantizeTest,
    ::testing::Combine(::testing::Values(Fp8Scaling::kTensor, Fp8Scaling::kBlock1x128,
                                         Fp8Scaling::kBlock128x128, Fp8Scaling::kMx1x32),
                       ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                       ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool(),
                       // Not multiples of 32 or 128, exact multiples, one element, and a size
                       // spread over the threads.
                       ::testing::Values(Size{1, 1}, Size{5, 7}, Size{33, 130}, Size{128, 256},
                                         Size{130, 257}, Size{300, 160})),
    [](const ::testing::TestParamInfo<QuantizeParam>& info) {
      const Fp8Scaling scaling = std::get<0>(info.param);
      const Fp8Format format = std::get<1>(info.param);
      const DType dtype = std::get<2>(info.param);
      const bool transpose = std::get<3>(info.param);
      const Size size = std::get<4>(info.param);
      return std::string(ScalingName(scaling)) +
             (format == Fp8Format::kE4M3 ? "_E4M3_" : "_E5M2_") + Name(dtype) +
             (transpose ? "_T_" : "_N_") + std::to_string(size.rows) + "x" +
             std::to_string(size.cols);
    });

// ---------------------------------------------------------------------------------------------
// Hand-computed cases.
// ---------------------------------------------------------------------------------------------

std::vector<float> Row(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(Fp8QuantizeHandTest, SaturationInfNaNAndStats) {
  std::vector<float> values = Row({500.0f, -1000.0f, 448.0f, kInf, -kInf, kNaN, 449.0f, 1.0f});
  Tensor src = MakeAct(DType::kF32, {1, 8}, values);
  const RefParams p{.format = Fp8Format::kE4M3, .scaling = Fp8Scaling::kTensor};
  const Quantized got = RunQuantize(Cpu(), src, p);
  const uint8_t want[] = {0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x7F, 0x7E, 0x38};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(got.q.data.data<uint8_t>()[j], want[j]) << j;
  for (int j = 8; j < 16; ++j) EXPECT_EQ(got.q.data.data<uint8_t>()[j], 0) << "padding " << j;
  EXPECT_EQ(got.q.scale_inv.data<float>()[0], 1.0f);
  EXPECT_EQ(got.saturated.data<int64_t>()[0], 5);  // 500, -1000, ±inf, 449; not NaN nor 448
  EXPECT_TRUE(std::isnan(got.amax.data<float>()[0]));

  // E5M2: ±inf saturate to ±57344 too.
  const Quantized e5 = RunQuantize(
      Cpu(), src, RefParams{.format = Fp8Format::kE5M2, .scaling = Fp8Scaling::kTensor});
  EXPECT_EQ(e5.q.data.data<uint8_t>()[3], 0x7B);
  EXPECT_EQ(e5.q.data.data<uint8_t>()[4], 0xFB);
  EXPECT_EQ(e5.saturated.data<int64_t>()[0], 2);
}

TEST(Fp8QuantizeHandTest, StatsAccumulateIntoWhatIsThere) {
  std::vector<float> values = Row({3.0f, -2.0f, 1000.0f});
  Tensor src = MakeAct(DType::kF32, {1, 3}, values);
  auto q = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, 1, 3);
  ASSERT_TRUE(q.ok());
  std::vector<float> one = {1.0f};
  Tensor scale = MakeAct(DType::kF32, {1}, one);
  std::vector<float> amax0 = {5000.0f}, amax1 = {1.0f};
  Tensor amax = MakeAct(DType::kF32, {1}, amax0);
  Tensor saturated = Tensor::Zeros(DType::kI64, {1});
  saturated.data<int64_t>()[0] = 10;
  ops::Fp8QuantizeArgs args = Args(src, scale, q->view, amax, saturated);
  ASSERT_OK(ops::Fp8Quantize(Cpu(), args));
  EXPECT_EQ(amax.data<float>()[0], 5000.0f);
  EXPECT_EQ(saturated.data<int64_t>()[0], 11);
  amax.data<float>()[0] = amax1[0];
  ASSERT_OK(ops::Fp8Quantize(Cpu(), args));
  EXPECT_EQ(amax.data<float>()[0], 1000.0f);
  EXPECT_EQ(saturated.data<int64_t>()[0], 12);
}

TEST(Fp8QuantizeHandTest, CurrentScalingPowerOfTwoAmax) {
  // amax 4 exactly: scale 448 / 4 = 112, or 64 with pow2; written to `scale`.
  std::vector<float> values = Row({4.0f, -1.0f, 0.5f});
  Tensor src = MakeAct(DType::kF32, {1, 3}, values);
  RefParams p{.scaling = Fp8Scaling::kTensor, .compute_scale = true};
  Quantized got = RunQuantize(Cpu(), src, p);
  EXPECT_EQ(got.scale.data<float>()[0], 112.0f);
  EXPECT_EQ(got.q.scale_inv.data<float>()[0], 1.0f / 112.0f);
  EXPECT_EQ(got.q.data.data<uint8_t>()[0], 0x7E);  // 4 · 112 = 448
  p.pow2 = true;
  got = RunQuantize(Cpu(), src, p);
  EXPECT_EQ(got.scale.data<float>()[0], 64.0f);
  EXPECT_EQ(got.q.scale_inv.data<float>()[0], 1.0f / 64.0f);
  EXPECT_EQ(got.q.data.data<uint8_t>()[0], 0x78);  // 256
  EXPECT_EQ(got.q.data.data<uint8_t>()[1], 0xE8);  // -64
  EXPECT_EQ(got.q.data.data<uint8_t>()[2], 0x60);  // 32
}

TEST(Fp8QuantizeHandTest, Block1x128ZeroBlockPowerOfTwoBlockAndNaNBlock) {
  // One row of 3 blocks: all zero; amax exactly 4; holding a NaN. Plus rows padded to 4.
  std::vector<float> values(300, 0.0f);
  values[128] = 4.0f;
  values[129] = -2.0f;
  values[256] = kNaN;
  values[257] = 2.0f;
  Tensor src = MakeAct(DType::kF32, {1, 300}, values);
  const RefParams p{.scaling = Fp8Scaling::kBlock1x128, .pow2 = true};
  const Quantized got = RunQuantize(Cpu(), src, p);
  const float* s = got.q.scale_inv.data<float>();
  ASSERT_EQ(got.q.scale_inv.dim(0), 3);
  ASSERT_EQ(got.q.scale_inv.dim(1), 4);
  EXPECT_EQ(s[0], 1.0f);          // zero block: scale 1
  EXPECT_EQ(s[4], 1.0f / 64.0f);  // 448 / 4 = 112 → 64
  EXPECT_EQ(s[8], 1.0f);          // NaN amax: scale 1
  for (int b = 0; b < 3; ++b)
    for (int i = 1; i < 4; ++i) EXPECT_EQ(s[b * 4 + i], 0.0f) << "padding " << b << " " << i;
  const uint8_t* q = got.q.data.data<uint8_t>();
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[128], 0x78);  // 256
  EXPECT_EQ(q[129], 0xF0);  // -128
  EXPECT_EQ(q[256], 0x7F);
  EXPECT_EQ(q[257], 0x40);  // 2 · 1
  for (int j = 300; j < 304; ++j) EXPECT_EQ(q[j], 0);
}

TEST(Fp8QuantizeHandTest, Block1x128ValueForInfFollowsTheSourceDType) {
  // A subnormal amax: 448 / amax overflows, so the scale is the source dtype's max finite.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<float> values = {std::ldexp(1.0f, -130), 0.0f};
    Tensor src = MakeAct(dtype, {1, 2}, values);
    const Quantized got =
        RunQuantize(Cpu(), src, RefParams{.scaling = Fp8Scaling::kBlock1x128, .src_dtype = dtype});
    const float max_finite = dtype == DType::kBF16 ? BF16ToFloat(BF16{0x7F7F}) : FLT_MAX;
    EXPECT_EQ(got.q.scale_inv.data<float>()[0], 1.0f / max_finite) << Name(dtype);
  }
}

TEST(Fp8QuantizeHandTest, Block128x128TileSpansRows) {
  // 130 × 130: tiles (0,0) 128×128, (0,1) 128×2, (1,0) 2×128, (1,1) 2×2. Put the amax of tile
  // (0,0) in its last row, and leave tile (1,1) zero.
  std::vector<float> values(130 * 130, 1.0f);
  values[127 * 130 + 5] = 8.0f;
  for (int i = 128; i < 130; ++i)
    for (int j = 128; j < 130; ++j) values[i * 130 + j] = 0.0f;
  Tensor src = MakeAct(DType::kF32, {130, 130}, values);
  const Quantized got = RunQuantize(Cpu(), src, RefParams{.scaling = Fp8Scaling::kBlock128x128});
  ASSERT_EQ(got.q.scale_inv.dim(0), 2);
  ASSERT_EQ(got.q.scale_inv.dim(1), 4);
  const float* s = got.q.scale_inv.data<float>();
  EXPECT_EQ(s[0], 1.0f / 56.0f);   // 448 / 8
  EXPECT_EQ(s[1], 1.0f / 448.0f);  // amax 1
  EXPECT_EQ(s[2], 0.0f);           // padding
  EXPECT_EQ(s[3], 0.0f);
  EXPECT_EQ(s[4], 1.0f / 448.0f);
  EXPECT_EQ(s[5], 1.0f);  // zero tile
  EXPECT_EQ(s[6], 0.0f);
  const uint8_t* q = got.q.data.data<uint8_t>();
  const int64_t padded = 144;
  EXPECT_EQ(q[127 * padded + 5], 0x7E);  // 8 · 56 = 448
  EXPECT_EQ(q[0], 0x66);                 // 1 · 56 = 56 = 1.75 · 2^5
  EXPECT_EQ(q[129 * padded + 129], 0x00);
}

TEST(Fp8QuantizeHandTest, Mx1x32Blocks) {
  // 70 columns: blocks of 32, 32 and 6. Block 0 amax 256 (a power of two): 256/448 = 1.14 · 2^-1
  // rounds up to 2^0, so e = 127, scale 1. Block 1 all zero: e = 0, scale_inv 2^-127. Block 2
  // holds a NaN: e = 0xFF and the whole block is NaN.
  std::vector<float> values(70, 0.0f);
  values[0] = 256.0f;
  values[1] = -3.0f;
  values[64] = kNaN;
  values[65] = 1.0f;
  Tensor src = MakeAct(DType::kF32, {1, 70}, values);
  const Quantized got = RunQuantize(Cpu(), src, RefParams{.scaling = Fp8Scaling::kMx1x32});
  const float* s = got.q.scale_inv.data<float>();
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(s[2]));
  const uint8_t* q = got.q.data.data<uint8_t>();
  EXPECT_EQ(q[0], 0x78);
  EXPECT_EQ(q[1], 0xC4);  // -3
  EXPECT_EQ(q[32], 0x00);
  EXPECT_EQ(q[64], 0x7F);
  EXPECT_EQ(q[65], 0x7F);
  EXPECT_EQ(q[69], 0x7F);  // NaN · 0 = NaN
  EXPECT_EQ(got.saturated.data<int64_t>()[0], 0);
  // A block with an infinity: e = 0xFE, multiplier 2^-127: inf saturates, the rest vanish.
  std::vector<float> inf_values = {kInf, 1000.0f};
  Tensor inf_src = MakeAct(DType::kF32, {1, 2}, inf_values);
  const Quantized inf_got = RunQuantize(Cpu(), inf_src, RefParams{.scaling = Fp8Scaling::kMx1x32});
  EXPECT_EQ(inf_got.q.scale_inv.data<float>()[0], std::ldexp(1.0f, 127));
  EXPECT_EQ(inf_got.q.data.data<uint8_t>()[0], 0x7E);
  EXPECT_EQ(inf_got.q.data.data<uint8_t>()[1], 0x00);
  EXPECT_EQ(inf_got.saturated.data<int64_t>()[0], 1);
}

TEST(Fp8QuantizeHandTest, SubnormalsWithScaleOne) {
  std::vector<float> values = {std::ldexp(1.0f, -9), std::ldexp(1.0f, -10), std::ldexp(3.0f, -10),
                               -std::ldexp(7.0f, -9), 1e-40f};
  Tensor src = MakeAct(DType::kF32, {1, 5}, values);
  const Quantized got = RunQuantize(Cpu(), src, RefParams{});
  const uint8_t want[] = {0x01, 0x00, 0x02, 0x87, 0x00};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(got.q.data.data<uint8_t>()[j], want[j]) << j;
}

TEST(Fp8QuantizeHandTest, TransposeReadsColumns) {
  std::vector<float> values = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // (2, 3)
  Tensor src = MakeAct(DType::kBF16, {2, 3}, values);
  const Quantized got = RunQuantize(Cpu(), src, RefParams{.transpose = true});
  ASSERT_EQ(got.q.view.rows, 3);
  ASSERT_EQ(got.q.view.cols, 2);
  const uint8_t* q = got.q.data.data<uint8_t>();
  // out (3, 2) = [[1, 4], [2, 5], [3, 6]], rows 16 bytes apart.
  const float want[3][2] = {{1, 4}, {2, 5}, {3, 6}};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(q[i * 16 + j], QuantizeFp8(want[i][j], Fp8Format::kE4M3)) << i << " " << j;
}

TEST(Fp8QuantizeHandTest, EmptySource) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{0, 40}, {40, 0}}) {
    Tensor src = Tensor::Zeros(DType::kF32, shape);
    for (bool transpose : {false, true}) {
      for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kBlock1x128,
                                 Fp8Scaling::kBlock128x128, Fp8Scaling::kMx1x32}) {
        const RefParams p{.scaling = scaling, .transpose = transpose, .compute_scale = true};
        const Quantized got = RunQuantize(Cpu(), src, p);
        ExpectMatchesReference(got, RefQuantize({}, shape[0], shape[1], p), p);
        Tensor dst = Tensor::Empty(DType::kF32, {got.q.view.rows, got.q.view.cols});
        ASSERT_OK(ops::Fp8Dequantize(Cpu(), got.q.view, dst));
      }
    }
  }
}

// The same bits with 1, 2 and 3 threads.
TEST(Fp8QuantizeHandTest, ResultsDoNotDependOnThreadCount) {
  std::mt19937 rng(11);
  std::vector<float> values = TestValues(700 * 300, rng, true);
  Tensor src = MakeAct(DType::kBF16, {700, 300}, values);
  for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kBlock1x128,
                             Fp8Scaling::kBlock128x128, Fp8Scaling::kMx1x32}) {
    for (bool transpose : {false, true}) {
      const RefParams p{.scaling = scaling, .transpose = transpose, .compute_scale = true};
      std::vector<std::vector<uint8_t>> results;
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        const ExecContext ctx = ExecContext::Cpu(&pool);
        const Quantized got = RunQuantize(ctx, src, p);
        Tensor dst = Tensor::Empty(DType::kF32, {got.q.view.rows, got.q.view.cols});
        ASSERT_OK(ops::Fp8Dequantize(ctx, got.q.view, dst));
        std::vector<uint8_t> bytes;
        for (const TensorView& t : {got.q.data.view(), got.q.scale_inv.view(), got.amax.view(),
                                    got.saturated.view(), got.scale.view(), dst.view()}) {
          const auto* b = static_cast<const uint8_t*>(t.raw());
          bytes.insert(bytes.end(), b, b + t.numel() * DTypeSize(t.dtype()));
        }
        results.push_back(std::move(bytes));
      }
      EXPECT_EQ(results[0], results[1]) << ScalingName(scaling) << " transpose " << transpose;
      EXPECT_EQ(results[0], results[2]) << ScalingName(scaling) << " transpose " << transpose;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Argument checks.
// ---------------------------------------------------------------------------------------------

TEST(Fp8ArgsTest, ShapesAndHelpers) {
  EXPECT_EQ(ops::Fp8DType(Fp8Format::kE4M3), DType::kF8E4M3);
  EXPECT_EQ(ops::Fp8DType(Fp8Format::kE5M2), DType::kF8E5M2);
  EXPECT_EQ(ops::Fp8PaddedCols(0), 0);
  EXPECT_EQ(ops::Fp8PaddedCols(1), 16);
  EXPECT_EQ(ops::Fp8PaddedCols(16), 16);
  EXPECT_EQ(ops::Fp8PaddedCols(17), 32);
  using Shape = std::array<int64_t, 2>;
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kTensor, 7, 9), (Shape{1, 1}));
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kBlock1x128, 5, 129), (Shape{2, 8}));
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kBlock1x128, 8, 128), (Shape{1, 8}));
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kBlock128x128, 129, 640), (Shape{2, 8}));
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kBlock128x128, 128, 128), (Shape{1, 4}));
  EXPECT_EQ(ops::Fp8ScaleShape(Fp8Scaling::kMx1x32, 3, 33), (Shape{3, 2}));
  auto t = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE5M2, Fp8Scaling::kBlock1x128, 5, 129);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->view.data.dtype(), DType::kF8E5M2);
  EXPECT_EQ(t->view.data.dim(0), 5);
  EXPECT_EQ(t->view.data.dim(1), 144);
  EXPECT_EQ(t->view.scale_inv.dim(0), 2);
  EXPECT_EQ(t->view.scale_inv.dim(1), 8);
  EXPECT_TRUE(IsInvalidArgument(
      ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, -1, 3).status(),
      "rows = -1"));
}

TEST(Fp8ArgsTest, QuantizeRefusesMismatches) {
  std::vector<float> values(6 * 4, 1.0f);
  Tensor src = MakeAct(DType::kF32, {6, 4}, values);
  Tensor scale = Tensor::Zeros(DType::kF32, {1});
  auto q = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, 6, 4);
  auto qt = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, 4, 6);
  auto q5 = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE5M2, Fp8Scaling::kTensor, 6, 4);
  auto qb = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kBlock1x128, 6, 4);
  ASSERT_TRUE(q.ok() && qt.ok() && q5.ok() && qb.ok());

  ops::Fp8QuantizeArgs args = Args(src, scale, q->view);
  ASSERT_OK(ops::Fp8Quantize(Cpu(), args));
  args.transpose = true;  // out should then be (4, 6)
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "transpose = true needs (4, 6)"));
  args.out = qt->view;
  ASSERT_OK(ops::Fp8Quantize(Cpu(), args));

  args = Args(src, TensorView(), q->view);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize scale: empty"));
  args.out = qb->view;  // block scalings take no scale
  ASSERT_OK(ops::Fp8Quantize(Cpu(), args));

  // The data's dtype must be the format's.
  args = Args(src, scale, q->view);
  args.out.format = Fp8Format::kE5M2;
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize out.data"));
  // scale_inv of another scaling's shape.
  args.out = q->view;
  args.out.scale_inv = qb->view.scale_inv;
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize out.scale_inv"));
  // Wrong dtypes of the source and the statistics.
  Tensor i32 = Tensor::Zeros(DType::kI32, {6, 4});
  args = Args(i32, scale, q->view);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize src"));
  Tensor wrong_amax = Tensor::Zeros(DType::kI64, {1});
  args = Args(src, scale, q->view, wrong_amax);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize amax"));
  args = Args(src, scale, q->view, TensorView(), scale);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize saturated"));
  args = Args(src, scale, q->view);
  args.amax_epsilon = -1.0f;
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "amax_epsilon = -1"));
  Tensor two = Tensor::Zeros(DType::kF32, {2});
  args = Args(src, two, q->view);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Quantize(Cpu(), args), "fp8 quantize scale"));
}

TEST(Fp8ArgsTest, DequantizeRefusesMismatches) {
  auto q = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kMx1x32, 3, 40);
  ASSERT_TRUE(q.ok());
  Tensor dst = Tensor::Zeros(DType::kF32, {3, 41});
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Dequantize(Cpu(), q->view, dst), "fp8 dequantize dst"));
  Tensor i64 = Tensor::Zeros(DType::kI64, {3, 40});
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Dequantize(Cpu(), q->view, i64), "fp8 dequantize dst"));
  Fp8Tensor bad = q->view;
  bad.cols = 50;  // data is (3, 48): 50 columns need 64
  Tensor dst50 = Tensor::Zeros(DType::kF32, {3, 50});
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Dequantize(Cpu(), bad, dst50), "fp8 dequantize src.data"));
}

// ---------------------------------------------------------------------------------------------
// Fp8Gemm.
// ---------------------------------------------------------------------------------------------

struct GemmCase {
  Fp8Scaling a_scaling, b_scaling;
  Fp8Format a_format, b_format;
};

// Quantises (rows, k) values with current scaling or the block scalings.
Quantized QuantizeOperand(const std::vector<float>& values, int64_t rows, int64_t k,
                          Fp8Scaling scaling, Fp8Format format) {
  std::vector<float> copy = values;
  Tensor src = MakeAct(DType::kF32, {rows, k}, copy);
  return RunQuantize(Cpu(), src,
                     RefParams{.format = format, .scaling = scaling, .compute_scale = true});
}

std::vector<double> Dequantized(const Quantized& q) {
  Tensor dst = Tensor::Empty(DType::kF32, {q.q.view.rows, q.q.view.cols});
  EXPECT_TRUE(ops::Fp8Dequantize(Cpu(), q.q.view, dst).ok());
  return test_util::ToDoubles(dst);
}

TEST(Fp8GemmTest, MatchesFloat64ProductOfDequantizedValues) {
  const GemmCase cases[] = {
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kTensor, Fp8Scaling::kTensor, Fp8Format::kE5M2, Fp8Format::kE4M3},
      {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock1x128, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock128x128, Fp8Format::kE4M3, Fp8Format::kE5M2},
      {Fp8Scaling::kBlock128x128, Fp8Scaling::kBlock1x128, Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Scaling::kMx1x32, Fp8Scaling::kMx1x32, Fp8Format::kE4M3, Fp8Format::kE4M3},
  };
  const int64_t m = 37, n = 150, k = 300;
  std::mt19937 rng(21);
  for (const GemmCase& c : cases) {
    const Quantized a =
        QuantizeOperand(TestValues(m * k, rng, false), m, k, c.a_scaling, c.a_format);
    const Quantized b =
        QuantizeOperand(TestValues(n * k, rng, false), n, k, c.b_scaling, c.b_format);
    const std::vector<double> av = Dequantized(a), bv = Dequantized(b);
    for (bool accumulate : {false, true}) {
      Tensor out = Tensor::Empty(DType::kF32, {m, n});
      for (int64_t i = 0; i < m * n; ++i) out.data<float>()[i] = accumulate ? 0.25f : kNaN;
      ASSERT_OK(
          ops::Fp8Gemm(Cpu(), {.a = a.q.view, .b = b.q.view, .c = out, .accumulate = accumulate}));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = accumulate ? 0.25 : 0.0, magnitude = accumulate ? 0.25 : 0.0;
          for (int64_t l = 0; l < k; ++l) {
            want += av[i * k + l] * bv[j * k + l];
            magnitude += std::fabs(av[i * k + l] * bv[j * k + l]);
          }
          // f32 products and an f32 sum of k terms in any order: within (k + 1) · 2^-24 of the
          // sum of magnitudes (the classic bound; the dequantised values are exact).
          ASSERT_NEAR(out.data<float>()[i * n + j], want,
                      (k + 1) * std::ldexp(1.0, -24) * magnitude + 1e-30)
              << ScalingName(c.a_scaling) << " x " << ScalingName(c.b_scaling) << " at " << i
              << ", " << j;
        }
      }
    }
  }
}

TEST(Fp8GemmTest, RefusesUnsupportedPairsAndShapes) {
  auto make = [](Fp8Scaling s, Fp8Format f, int64_t rows, int64_t cols) {
    auto t = ops::AllocateFp8Tensor(Cpu(), f, s, rows, cols);
    EXPECT_TRUE(t.ok());
    return std::move(*t);
  };
  Tensor c = Tensor::Zeros(DType::kF32, {4, 5});
  const auto a = make(Fp8Scaling::kBlock128x128, Fp8Format::kE4M3, 4, 8);
  const auto b = make(Fp8Scaling::kBlock128x128, Fp8Format::kE4M3, 5, 8);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Gemm(Cpu(), {.a = a.view, .b = b.view, .c = c}),
                                "scalings a = block128x128, b = block128x128"));
  const auto at = make(Fp8Scaling::kTensor, Fp8Format::kE4M3, 4, 8);
  const auto bb = make(Fp8Scaling::kBlock1x128, Fp8Format::kE4M3, 5, 8);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Gemm(Cpu(), {.a = at.view, .b = bb.view, .c = c}),
                                "scalings a = tensor, b = block1x128"));
  const auto a5 = make(Fp8Scaling::kTensor, Fp8Format::kE5M2, 4, 8);
  const auto b5 = make(Fp8Scaling::kTensor, Fp8Format::kE5M2, 5, 8);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Gemm(Cpu(), {.a = a5.view, .b = b5.view, .c = c}), "e5m2"));
  const auto bk = make(Fp8Scaling::kTensor, Fp8Format::kE4M3, 5, 9);
  EXPECT_TRUE(IsInvalidArgument(ops::Fp8Gemm(Cpu(), {.a = at.view, .b = bk.view, .c = c}),
                                "K (cols) differ"));
  const auto bt = make(Fp8Scaling::kTensor, Fp8Format::kE4M3, 6, 8);
  EXPECT_TRUE(
      IsInvalidArgument(ops::Fp8Gemm(Cpu(), {.a = at.view, .b = bt.view, .c = c}), "fp8 gemm c"));
}

TEST(Fp8GemmTest, EmptyKZeroesOrKeepsC) {
  auto a = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, 2, 0);
  auto b = ops::AllocateFp8Tensor(Cpu(), Fp8Format::kE4M3, Fp8Scaling::kTensor, 3, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  Tensor c = Tensor::Empty(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) c.data<float>()[i] = 7.0f;
  ASSERT_OK(ops::Fp8Gemm(Cpu(), {.a = a->view, .b = b->view, .c = c, .accumulate = true}));
  EXPECT_EQ(c.data<float>()[5], 7.0f);
  ASSERT_OK(ops::Fp8Gemm(Cpu(), {.a = a->view, .b = b->view, .c = c}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.data<float>()[i], 0.0f);
}

}  // namespace
}  // namespace moetrain::ops_test
