#include "engine/ops/elementwise/elementwise.h"

#include <algorithm>
#include <bit>
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
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/act_test_util.h"

namespace moetrain::ops_test {
namespace {

// ---------------------------------------------------------------------------------------------
// ConvertTensor.
// ---------------------------------------------------------------------------------------------

// Random values with the specials a conversion must get right at fixed places.
std::vector<float> ConvertValues(int64_t n, std::mt19937& rng) {
  std::vector<float> v = Uniform(n, -1000.0f, 1000.0f, rng);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            kNaN,
                            std::numeric_limits<float>::max(),  // rounds up to infinity
                            std::numeric_limits<float>::denorm_min(),
                            1.00390625f,  // exactly halfway between two bf16 values: to even
                            1.01171875f};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i)
    v[i * 3 % v.size()] = specials[i];
  return v;
}

class ConvertTensorTest : public ::testing::TestWithParam<Size> {};

TEST_P(ConvertTensorTest, F32ToBF16RoundsLikeFloatToBF16) {
  const Size size = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows + size.cols));
  std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
  Tensor src = MakeAct(DType::kF32, {size.rows, size.cols}, values);
  Tensor dst = NaNAct(DType::kBF16, {size.rows, size.cols});
  ASSERT_TRUE(ops::ConvertTensor(Cpu(), src, dst).ok());
  for (int64_t i = 0; i < src.numel(); ++i) {
    ASSERT_EQ(dst.data<BF16>()[i].bits, FloatToBF16(values[i]).bits) << i << ": " << values[i];
  }
}

TEST_P(ConvertTensorTest, BF16ToF32IsExact) {
  const Size size = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(size.rows * 2 + size.cols));
  std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
  Tensor src = MakeAct(DType::kBF16, {size.rows, size.cols}, values);
  Tensor dst = NaNAct(DType::kF32, {size.rows, size.cols});
  ASSERT_TRUE(ops::ConvertTensor(Cpu(), src, dst).ok());
  for (int64_t i = 0; i < src.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(dst.data<float>()[i]),
              static_cast<uint32_t>(src.data<BF16>()[i].bits) << 16)
        << i;
  }
}

TEST_P(ConvertTensorTest, SameDTypeCopies) {
  const Size size = GetParam();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(static_cast<uint32_t>(size.rows * 3 + size.cols));
    std::vector<float> values = ConvertValues(size.rows * size.cols, rng);
    Tensor src = MakeAct(dtype, {size.rows, size.cols}, values);
    Tensor dst = NaNAct(dtype, {size.rows, size.cols});
    ASSERT_TRUE(ops::ConvertTensor(Cpu(), src, dst).ok());
    EXPECT_TRUE(SameBytes(src, dst)) << Name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ConvertTensorTest, ::testing::Values(Size{1, 1}, kSmall, kLarge),
                         [](const ::testing::TestParamInfo<Size>& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

TEST(ConvertTensorErrorTest, RejectsMismatches) {
  Tensor f32 = Tensor::Zeros(DType::kF32, {4, 6});
  Tensor bf16_short = Tensor::Zeros(DType::kBF16, {4, 5});
  Tensor f32_long = Tensor::Zeros(DType::kF32, {5, 6});
  Tensor i32 = Tensor::Zeros(DType::kI32, {4, 6});
  EXPECT_TRUE(IsInvalidArgument(ops::ConvertTensor(Cpu(), f32, bf16_short), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ops::ConvertTensor(Cpu(), f32, f32_long), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ops::ConvertTensor(Cpu(), f32, i32), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ops::ConvertTensor(Cpu(), i32, f32), "convert"));
  EXPECT_TRUE(IsInvalidArgument(ops::ConvertTensor(Cpu(), TensorView(), f32), "convert"));
}

// ---------------------------------------------------------------------------------------------
// Add.
// ---------------------------------------------------------------------------------------------

// out = a + b is one f32 add per element (b widened from bf16 first), so the sum is exact to
// compare; zero rows and zero columns are valid and touch nothing.
TEST(CopyColumnsTest, CopiesABlockOfColumnsAndNothingElse) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(Name(dtype));
    std::vector<float> src_values(5 * 4), dst_values(5 * 7, -1.0f);
    for (size_t i = 0; i < src_values.size(); ++i) src_values[i] = static_cast<float>(i);
    const Tensor src = MakeAct(dtype, {5, 4}, src_values);
    Tensor dst = MakeAct(dtype, {5, 7}, dst_values);
    ASSERT_TRUE(ops::CopyColumns(Cpu(), src, 1, dst, 4, 3).ok());
    for (int64_t r = 0; r < 5; ++r) {
      for (int64_t c = 0; c < 7; ++c) {
        const float want = c >= 4 ? src_values[r * 4 + 1 + (c - 4)] : -1.0f;
        const float got = dtype == DType::kF32 ? dst.data<float>()[r * 7 + c]
                                               : BF16ToFloat(dst.data<BF16>()[r * 7 + c]);
        EXPECT_EQ(got, want) << r << ", " << c;
      }
    }
  }
  // Out of range, or another dtype: refused, naming the ranges.
  Tensor a = Tensor::Empty(DType::kF32, {2, 3}), b = Tensor::Empty(DType::kF32, {2, 3});
  const absl::Status status = ops::CopyColumns(Cpu(), a, 1, b, 2, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("to columns [2, 4)"), std::string::npos) << status;
  Tensor c = Tensor::Empty(DType::kBF16, {2, 3});
  EXPECT_FALSE(ops::CopyColumns(Cpu(), a, 0, c, 0, 1).ok());
}

TEST(AddTest, AddsElementwiseWithF32AndBF16AndEmptyShapes) {
  std::mt19937 rng(std::random_device{}());
  for (const Size size : {Size{1, 1}, Size{37, 23}, Size{0, 5}, Size{7, 0}}) {
    for (DType b_dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << size.rows << "x" << size.cols << " b " << DTypeName(b_dtype));
      const int64_t n = size.rows * size.cols;
      const std::vector<float> a_values = Uniform(n, -10.0f, 10.0f, rng);
      const std::vector<float> b_values = Uniform(n, -10.0f, 10.0f, rng);
      Tensor a = Tensor::Zeros(DType::kF32, {size.rows, size.cols});
      Tensor b = Tensor::Zeros(b_dtype, {size.rows, size.cols});
      std::copy(a_values.begin(), a_values.end(), a.data<float>());
      for (int64_t i = 0; i < n; ++i) {
        if (b_dtype == DType::kF32) {
          b.data<float>()[i] = b_values[i];
        } else {
          b.data<BF16>()[i] = FloatToBF16(b_values[i]);
        }
      }
      Tensor out = Tensor::Zeros(DType::kF32, {size.rows, size.cols});
      ASSERT_TRUE(ops::Add(Cpu(), a, b, out).ok());
      for (int64_t i = 0; i < n; ++i) {
        const float b_i =
            b_dtype == DType::kF32 ? b_values[i] : BF16ToFloat(FloatToBF16(b_values[i]));
        ASSERT_EQ(out.data<float>()[i], a_values[i] + b_i) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
