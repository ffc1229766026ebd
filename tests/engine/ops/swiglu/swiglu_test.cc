#include "engine/ops/swiglu/swiglu.h"

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
// SwiGLU.
// ---------------------------------------------------------------------------------------------

class SwigluTest : public ::testing::TestWithParam<ActSizeParam> {};

TEST_P(SwigluTest, ForwardMatchesReference) {
  const auto [dtype, size] = GetParam();
  const int64_t rows = size.rows, f = size.cols;
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + f));
  std::vector<float> gate_up_values = GateUpValues(rows, f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor out = NaNAct(dtype, {rows, f});
  const absl::Status status = ops::SwigluForward(Cpu(), gate_up, out);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(rows * f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      want[r * f + i] = RefSwiglu(gate_up_values[r * 2 * f + i], gate_up_values[r * 2 * f + f + i]);
    }
  }
  EXPECT_LT(RelError(out, want), Tolerance(dtype));
}

TEST_P(SwigluTest, BackwardMatchesReference) {
  const auto [dtype, size] = GetParam();
  const int64_t rows = size.rows, f = size.cols;
  std::mt19937 rng(static_cast<uint32_t>(rows * 37 + f));
  std::vector<float> gate_up_values = GateUpValues(rows, f, rng);
  std::vector<float> d_out_values = Uniform(rows * f, -1.0f, 1.0f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {rows, f}, d_out_values);
  Tensor d_gate_up = NaNAct(dtype, {rows, 2 * f});
  const absl::Status status = ops::SwigluBackward(Cpu(), gate_up, d_out, d_gate_up);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<double> want(rows * 2 * f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const double gate = gate_up_values[r * 2 * f + i], up = gate_up_values[r * 2 * f + f + i];
      const double d = d_out_values[r * f + i];
      want[r * 2 * f + i] = d * RefSwigluDGate(gate, up);
      want[r * 2 * f + f + i] = d * RefSwigluDUp(gate);
    }
  }
  EXPECT_LT(RelError(d_gate_up, want), Tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwigluTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Size{1, 1}, kSmall, kLarge)),
                         ActSizeName);

// The derivative formulas of the reference itself, against central differences in double.
TEST(SwigluReferenceTest, DerivativesMatchFiniteDifferences) {
  const double h = 1e-5;
  for (double gate : {-8.0, -2.5, -0.7, -1e-3, 0.0, 0.3, 1.9, 7.5}) {
    for (double up : {-1.7, 0.4, 2.2}) {
      const double fd_gate = (RefSwiglu(gate + h, up) - RefSwiglu(gate - h, up)) / (2 * h);
      const double fd_up = (RefSwiglu(gate, up + h) - RefSwiglu(gate, up - h)) / (2 * h);
      EXPECT_NEAR(RefSwigluDGate(gate, up), fd_gate, 1e-8) << gate << ", " << up;
      EXPECT_NEAR(RefSwigluDUp(gate), fd_up, 1e-8) << gate << ", " << up;
    }
  }
}

// The engine's backward against central differences of the engine's own f32 forward. Each
// output depends on its own gate and up only, so shifting all gates (or all ups) at once gives
// every partial derivative from two forward calls.
TEST(SwigluEdgeTest, BackwardMatchesFiniteDifferencesOfForward) {
  const int64_t rows = 5, f = 7;
  const float h = 1e-2f;
  std::mt19937 rng(3);
  std::vector<float> gate_up_values = Uniform(rows * 2 * f, -3.0f, 3.0f, rng);
  std::vector<float> d_out_values = Uniform(rows * f, -1.0f, 1.0f, rng);
  Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {rows, f}, d_out_values);
  Tensor d_gate_up = NaNAct(DType::kF32, {rows, 2 * f});
  ASSERT_TRUE(ops::SwigluBackward(Cpu(), gate_up, d_out, d_gate_up).ok());

  // Forward with column block `half` (0 = gate, 1 = up) shifted by `delta`.
  auto forward = [&](int half, float delta) {
    std::vector<float> shifted = gate_up_values;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < f; ++i) shifted[r * 2 * f + half * f + i] += delta;
    }
    Tensor in = MakeAct(DType::kF32, {rows, 2 * f}, shifted);
    Tensor out = NaNAct(DType::kF32, {rows, f});
    EXPECT_TRUE(ops::SwigluForward(Cpu(), in, out).ok());
    return out;
  };
  for (int half : {0, 1}) {
    const Tensor plus = forward(half, h), minus = forward(half, -h);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < f; ++i) {
        // Differences of f32 values: the shifted input is rounded, so use the actual step.
        const float x = gate_up_values[r * 2 * f + half * f + i];
        const double step = static_cast<double>(x + h) - static_cast<double>(x - h);
        const double fd =
            d_out_values[r * f + i] * (At(plus, r * f + i) - At(minus, r * f + i)) / step;
        EXPECT_NEAR(d_gate_up.data<float>()[r * 2 * f + half * f + i], fd,
                    1e-3 * std::max(1.0, std::abs(fd)))
            << (half == 0 ? "d_gate" : "d_up") << " at (" << r << ", " << i << ")";
      }
    }
  }
}

// Gates far out on both sides, around where e^-x leaves float range: silu(g) → 0 for g → −∞ and
// → g for g → +∞, with no inf or NaN on the way. Checked element by element.
TEST(SwigluEdgeTest, SaturatedGates) {
  const std::vector<float> gates = {-1e4f,  -1000.0f, -100.0f,  -89.0f,  -88.5f, -87.5f,
                                    -30.0f, -20.0f,   -1.2785f, 20.0f,   30.0f,  87.5f,
                                    88.5f,  89.0f,    100.0f,   1000.0f, 1e4f};
  const int64_t f = static_cast<int64_t>(gates.size());
  const float up = 1.5f, d = -0.75f;
  std::vector<float> gate_up_values(gates);
  gate_up_values.insert(gate_up_values.end(), f, up);
  std::vector<float> d_out_values(f, d);
  Tensor gate_up = MakeAct(DType::kF32, {1, 2 * f}, gate_up_values);
  Tensor d_out = MakeAct(DType::kF32, {1, f}, d_out_values);
  Tensor out = NaNAct(DType::kF32, {1, f});
  Tensor d_gate_up = NaNAct(DType::kF32, {1, 2 * f});
  ASSERT_TRUE(ops::SwigluForward(Cpu(), gate_up, out).ok());
  ASSERT_TRUE(ops::SwigluBackward(Cpu(), gate_up, d_out, d_gate_up).ok());
  for (int64_t i = 0; i < f; ++i) {
    const double g = gates[i];
    const double want_out = RefSwiglu(g, up), want_d_gate = d * RefSwigluDGate(g, up);
    const double want_d_up = d * RefSwigluDUp(g);
    EXPECT_NEAR(At(out, i), want_out, 1e-5 * std::abs(want_out) + 1e-30) << "out, gate " << g;
    EXPECT_NEAR(At(d_gate_up, i), want_d_gate, 1e-5 * std::abs(want_d_gate) + 1e-6)
        << "d_gate, gate " << g;
    EXPECT_NEAR(At(d_gate_up, f + i), want_d_up, 1e-5 * std::abs(want_d_up) + 1e-30)
        << "d_up, gate " << g;
  }
}

TEST(SwigluEdgeTest, EmptyBatch) {
  Tensor gate_up = Tensor::Empty(DType::kF32, {0, 8});
  Tensor out = Tensor::Empty(DType::kBF16, {0, 4});
  Tensor d_out = Tensor::Empty(DType::kF32, {0, 4});
  Tensor d_gate_up = Tensor::Empty(DType::kF32, {0, 8});
  EXPECT_TRUE(ops::SwigluForward(Cpu(), gate_up, out).ok());
  EXPECT_TRUE(ops::SwigluBackward(Cpu(), gate_up, d_out, d_gate_up).ok());
}

TEST(SwigluEdgeTest, RejectsBadArguments) {
  Tensor gate_up = Tensor::Zeros(DType::kF32, {4, 6});
  Tensor odd = Tensor::Zeros(DType::kF32, {4, 7});
  Tensor gate_up_bf16 = Tensor::Zeros(DType::kBF16, {4, 6});
  Tensor out = Tensor::Zeros(DType::kF32, {4, 3});
  Tensor out_wrong = Tensor::Zeros(DType::kF32, {4, 4});
  Tensor out_i32 = Tensor::Zeros(DType::kI32, {4, 3});
  Tensor d_out_bf16 = Tensor::Zeros(DType::kBF16, {4, 3});
  Tensor d_gate_up_wrong = Tensor::Zeros(DType::kF32, {4, 3});

  EXPECT_TRUE(IsInvalidArgument(ops::SwigluForward(Cpu(), odd, Tensor::Zeros(DType::kF32, {4, 3})),
                                "even"));
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluForward(Cpu(), gate_up_bf16, out), "swiglu gate_up"));
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluForward(Cpu(), gate_up, out_wrong), "swiglu out"));
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluForward(Cpu(), gate_up, out_i32), "swiglu out"));
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluForward(Cpu(), gate_up, TensorView()), "swiglu out"));
  EXPECT_TRUE(
      IsInvalidArgument(ops::SwigluBackward(Cpu(), gate_up, d_out_bf16, gate_up), "swiglu d_out"));
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluBackward(Cpu(), gate_up, out, d_gate_up_wrong),
                                "swiglu d_gate_up"));
  // 7 columns would pass as F = 3 with d_gate_up (4, 6), and rows would be read 6 apart.
  EXPECT_TRUE(IsInvalidArgument(ops::SwigluBackward(Cpu(), odd, out, gate_up), "even"));
}

// Strided views. The kernels index their tensors as dense row-major arrays, so a view with
// other strides must be refused (CheckAct does so for act tensors) instead of being read or
// written in the wrong places.
TensorView EveryOtherRow(const Tensor& buffer) {
  return TensorView(buffer.view().raw(), buffer.dtype(), {buffer.dim(0) / 2, buffer.dim(1)},
                    {2 * buffer.dim(1), 1});
}

TEST(StridedViewTest, NonContiguousSwigluTensorsAreRejected) {
  const int64_t tokens = 4, d = 3;
  Tensor gate_up_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, 2 * d});
  Tensor d_out_buffer = Tensor::Zeros(DType::kF32, {2 * tokens, d});
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, d});
  Tensor gate_up = Tensor::Zeros(DType::kF32, {tokens, 2 * d});
  EXPECT_TRUE(
      IsInvalidArgument(ops::SwigluForward(Cpu(), EveryOtherRow(gate_up_buffer), out), "gate_up"));
  EXPECT_TRUE(IsInvalidArgument(
      ops::SwigluBackward(Cpu(), gate_up, EveryOtherRow(d_out_buffer), gate_up), "d_out"));
}

}  // namespace
}  // namespace moetrain::ops_test
