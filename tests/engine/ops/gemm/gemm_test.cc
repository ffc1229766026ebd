#include "engine/ops/gemm/gemm.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/gemm/gemm_test_util.h"

namespace moetrain::ops_test {
namespace {

using namespace gemm_test;  // NOLINT: the shared helpers of the GEMM tests

// ---------------------------------------------------------------------------------------------
// Dense GEMM.
// ---------------------------------------------------------------------------------------------

using GemmParam = std::tuple<DType, bool, bool, bool, Shape>;  // dtype, trans_a, trans_b, acc

class GemmTest : public ::testing::TestWithParam<GemmParam> {};

TEST_P(GemmTest, MatchesFloat64Reference) {
  const auto [dtype, trans_a, trans_b, accumulate, shape] = GetParam();
  const auto [m, n, k] = shape;
  std::mt19937 rng(static_cast<uint32_t>(1000003 * m + 1009 * n + k + 2 * trans_a + trans_b));
  Operand a = RandomOperand(dtype, trans_a ? std::vector<int64_t>{k, m} : std::vector{m, k}, rng);
  Operand b = RandomOperand(dtype, trans_b ? std::vector<int64_t>{n, k} : std::vector{k, n}, rng);
  // Accumulation adds into random existing values; otherwise NaN shows any element not written.
  Operand c = RandomOperand(DType::kF32, {m, n}, rng);
  if (!accumulate) c.tensor = Filled({m, n}, kNaN);
  const std::vector<double> want =
      RefGemm(a.values, b.values, c.values, m, n, k, trans_a, trans_b, accumulate);

  const absl::Status status = ops::Gemm(Cpu(), {.a = a.tensor,
                                                .b = b.tensor,
                                                .c = c.tensor,
                                                .trans_a = trans_a,
                                                .trans_b = trans_b,
                                                .accumulate = accumulate});
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(RelError(c.tensor, want), Tolerance(dtype));
}

std::string GemmParamName(const ::testing::TestParamInfo<GemmParam>& info) {
  const auto& [dtype, trans_a, trans_b, accumulate, shape] = info.param;
  return std::string(Name(dtype)) + (trans_a ? "_At" : "_A") + (trans_b ? "Bt" : "B") +
         (accumulate ? "_Acc_" : "_") + std::to_string(shape.m) + "x" + std::to_string(shape.n) +
         "x" + std::to_string(shape.k);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GemmTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(Shape{1, 1, 1}, Shape{7, 13, 5},
                                                              Shape{33, 65, 17},
                                                              Shape{129, 3, 250})),
                         GemmParamName);

TEST(GemmEdgeTest, EmptyInnerDimensionZeroesOrKeepsC) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool transpose : {false, true}) {
      SCOPED_TRACE(std::string(Name(dtype)) + (transpose ? " transposed" : ""));
      std::mt19937 rng(7);
      Tensor a =
          Tensor::Empty(dtype, transpose ? std::vector<int64_t>{0, 5} : std::vector<int64_t>{5, 0});
      Tensor b =
          Tensor::Empty(dtype, transpose ? std::vector<int64_t>{6, 0} : std::vector<int64_t>{0, 6});
      Operand c = RandomOperand(DType::kF32, {5, 6}, rng);
      const Tensor before = Filled({5, 6}, 0.0f);
      std::memcpy(before.data<float>(), c.tensor.data<float>(), 30 * sizeof(float));

      ops::GemmArgs args{.a = a, .b = b, .c = c.tensor, .trans_a = transpose, .trans_b = transpose};
      args.accumulate = true;
      absl::Status status = ops::Gemm(Cpu(), args);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(SameBits(c.tensor, before)) << "accumulating an empty sum must keep c";

      args.accumulate = false;
      status = ops::Gemm(Cpu(), args);
      ASSERT_TRUE(status.ok()) << status;
      for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(c.tensor.data<float>()[i], 0.0f) << i;
    }
  }
}

TEST(GemmEdgeTest, EmptyOutputIsFine) {
  for (bool accumulate : {false, true}) {
    Tensor a0 = Tensor::Empty(DType::kF32, {0, 4});
    Tensor b = Filled({4, 3}, 1.0f);
    Tensor c0 = Tensor::Empty(DType::kF32, {0, 3});
    absl::Status status = ops::Gemm(Cpu(), {.a = a0, .b = b, .c = c0, .accumulate = accumulate});
    EXPECT_TRUE(status.ok()) << "M = 0: " << status;

    Tensor a = Filled({2, 4}, 1.0f);
    Tensor b0 = Tensor::Empty(DType::kF32, {4, 0});
    Tensor c1 = Tensor::Empty(DType::kF32, {2, 0});
    status = ops::Gemm(Cpu(), {.a = a, .b = b0, .c = c1, .accumulate = accumulate});
    EXPECT_TRUE(status.ok()) << "N = 0: " << status;
  }
}

TEST(GemmEdgeTest, RejectsBadOperands) {
  Tensor a = Filled({4, 5}, 1.0f);  // (M, K)
  Tensor b = Filled({5, 3}, 1.0f);  // (K, N)
  Tensor c = Filled({4, 3}, 0.0f);  // (M, N)
  Tensor a_i32 = Tensor::Zeros(DType::kI32, {4, 5});
  Tensor b_i32 = Tensor::Zeros(DType::kI32, {5, 3});
  Tensor b_bf16 = Tensor::Zeros(DType::kBF16, {5, 3});
  Tensor c_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor c_wrong = Filled({4, 4}, 0.0f);
  Tensor b_wrong_k = Filled({6, 3}, 1.0f);

  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a_i32, .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b_i32, .c = c}), "gemm b"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b, .c = c_bf16}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b, .c = c_wrong}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = TensorView(), .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b_wrong_k, .c = c}), "K"));
  // Transposing a makes op(a) (5, 4): K = 4 no longer matches b.
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b, .c = c, .trans_a = true}), "K"));
  // Mixed input dtypes: the error shows both.
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b_bf16, .c = c}), "bf16"));

  // A non-contiguous a (every other row of a (8, 5) buffer).
  Tensor big = Filled({8, 5}, 1.0f);
  const TensorView strided_a(big.data<float>(), DType::kF32, {4, 5}, {10, 1});
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = strided_a, .b = b, .c = c}), "gemm a"));
}

// Wrong ranks and a missing output should name the operand like every other shape error does.
TEST(GemmEdgeTest, RankErrorsNameTheOperand) {
  Tensor a = Filled({4, 5}, 1.0f);
  Tensor b = Filled({5, 3}, 1.0f);
  Tensor c = Filled({4, 3}, 0.0f);
  Tensor a3 = Filled({1, 4, 5}, 1.0f);
  Tensor b1 = Filled({15}, 1.0f);
  Tensor c3 = Filled({1, 4, 3}, 0.0f);
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a3, .b = b, .c = c}), "gemm a"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b1, .c = c}), "gemm b"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b, .c = c3}), "gemm c"));
  EXPECT_TRUE(IsInvalidArgument(ops::Gemm(Cpu(), {.a = a, .b = b, .c = TensorView()}), "gemm c"));
}

// 0 when a small bf16 Gemm either succeeds with the right values or returns an error Status.
int SmallBf16GemmExitCode() {
  std::mt19937 rng(5);
  Operand a = RandomOperand(DType::kBF16, {7, 5}, rng);
  Operand b = RandomOperand(DType::kBF16, {5, 13}, rng);
  Tensor c = Filled({7, 13}, kNaN);
  const absl::Status status = ops::Gemm(Cpu(), {.a = a.tensor, .b = b.tensor, .c = c});
  if (!status.ok()) return 0;
  const std::vector<double> want = RefGemm(a.values, b.values, {}, 7, 13, 5, false, false, false);
  return RelError(c, want) < Tolerance(DType::kBF16) ? 0 : 1;
}

// oneDNN 2.x has no bf16 matmul on CPUs without AVX-512 (simulated here by capping its ISA at
// AVX2 in a fresh child process). Gemm must then fall back or return a Status: a dnnl::error
// escaping it would terminate a training process that only asked for a GEMM.
TEST(GemmDeathTest, Bf16WithoutAvx512ReturnsInsteadOfThrowing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Before the child's first oneDNN call, which is when oneDNN reads it.
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        std::_Exit(SmallBf16GemmExitCode());
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(GemmEdgeTest, IdenticalCallsGiveIdenticalBits) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::mt19937 rng(11);
    Operand a = RandomOperand(dtype, {129, 250}, rng);
    Operand b = RandomOperand(dtype, {3, 250}, rng);
    Tensor c1 = Filled({129, 3}, kNaN), c2 = Filled({129, 3}, kNaN);
    ASSERT_TRUE(ops::Gemm(Cpu(), {.a = a.tensor, .b = b.tensor, .c = c1, .trans_b = true}).ok());
    ASSERT_TRUE(ops::Gemm(Cpu(), {.a = a.tensor, .b = b.tensor, .c = c2, .trans_b = true}).ok());
    EXPECT_TRUE(SameBits(c1, c2)) << Name(dtype);
  }
}

}  // namespace
}  // namespace moetrain::ops_test
