// SwigluForward and SwigluBackward on CUDA against the CPU backend, on fresh random inputs (the
// seed is printed with any failure). Both run swiglu_math.h, but nvcc fuses multiply-adds inside
// FastExp and in 1 + g·(1 − s) where the CPU's baseline clone does not, so the last bits differ.
// Tolerances, δ = 2e-6 (≈ 16 f32 ulp; the observed differences are a few ulp of σ):
// - out = g·σ(g)·u and d_up = d·g·σ(g), products only: |cuda − cpu| ≤ δ·|cpu| + 1e-35.
// - d_gate = d·u·σ·(1 + g·(1 − σ)), which cancels near g ≈ −1.28: an error of σ enters through
//   (1 − σ) times g, so the bound is δ·|d·u|·σ·(1 + 2|g|) + 1e-35 (σ in double).
// - bf16 outputs: the f32 bound plus one bf16 ulp (rounding may land on either neighbour).
// Every result is bit-identical from run to run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/swiglu/swiglu.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

constexpr double kDelta = 2e-6;
constexpr double kFloor = 1e-35;

// (rows, F): one pair, F no multiple of 2, 4 or 8, a wide row, many rows, and no pairs at all.
const Size kSizes[] = {{1, 1}, {37, 23}, {5, 1001}, {3000, 301}, {0, 8}, {4, 0}};

// gate_up (R, 2F) in [-6, 6], with saturating and signed-zero gates planted.
std::vector<float> Inputs(int64_t rows, int64_t f, std::mt19937& rng) {
  std::vector<float> v = Uniform(rows * 2 * f, -6.0f, 6.0f, rng);
  const float specials[] = {0.0f, -0.0f, 20.0f, -20.0f, 90.0f, -90.0f, -100.0f, -1.2785f};
  for (int64_t r = 0; r < rows && f > 0; ++r) {
    v[r * 2 * f + (r * 5) % f] = specials[r % std::size(specials)];
  }
  return v;
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

double BF16Ulp(double x) { return x == 0.0 ? 0.0 : std::ldexp(1.0, std::ilogb(x) - 7); }

// Whether `got` (from the device) is within `bound` (f32) of `want`, plus a bf16 ulp for bf16.
::testing::AssertionResult Near(DType dtype, double want, double got, double bound) {
  if (dtype == DType::kBF16) bound += BF16Ulp(std::max(std::fabs(want), std::fabs(got)));
  if (std::fabs(got - want) <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "cpu " << want << ", cuda " << got << ", bound " << bound;
}

TEST(SwigluCudaTest, ForwardMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Size& size : kSizes) {
      const int64_t rows = size.rows, f = size.cols;
      SCOPED_TRACE(::testing::Message() << Name(dtype) << " " << rows << "x" << f);
      std::vector<float> values = Inputs(rows, f, rng);
      const Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, values);
      Tensor want = NaNAct(dtype, {rows, f});
      ASSERT_OK(ops::SwigluForward(Cpu(), gate_up, want));

      const Tensor gate_up_gpu = test_util::ToDevice(gpu, gate_up);
      const Tensor out_gpu = test_util::ToDevice(gpu, NaNAct(dtype, {rows, f}));
      ASSERT_OK(ops::SwigluForward(gpu, gate_up_gpu, out_gpu));
      const Tensor got = test_util::ToHost(gpu, out_gpu);
      for (int64_t i = 0; i < rows * f; ++i) {
        const double w = At(want, i);
        ASSERT_TRUE(Near(dtype, w, At(got, i), kDelta * std::fabs(w) + kFloor)) << "pair " << i;
      }

      const Tensor again_gpu = test_util::ToDevice(gpu, NaNAct(dtype, {rows, f}));
      ASSERT_OK(ops::SwigluForward(gpu, gate_up_gpu, again_gpu));
      EXPECT_TRUE(test_util::SameBytes(got, test_util::ToHost(gpu, again_gpu)));
    }
  }
}

TEST(SwigluCudaTest, BackwardMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Size& size : kSizes) {
      const int64_t rows = size.rows, f = size.cols;
      SCOPED_TRACE(::testing::Message() << Name(dtype) << " " << rows << "x" << f);
      std::vector<float> values = Inputs(rows, f, rng);
      std::vector<float> d_values = Uniform(rows * f, -1.0f, 1.0f, rng);
      const Tensor gate_up = MakeAct(DType::kF32, {rows, 2 * f}, values);
      const Tensor d_out = MakeAct(DType::kF32, {rows, f}, d_values);
      Tensor want = NaNAct(dtype, {rows, 2 * f});
      ASSERT_OK(ops::SwigluBackward(Cpu(), gate_up, d_out, want));

      const Tensor gate_up_gpu = test_util::ToDevice(gpu, gate_up);
      const Tensor d_out_gpu = test_util::ToDevice(gpu, d_out);
      const Tensor d_gate_up_gpu = test_util::ToDevice(gpu, NaNAct(dtype, {rows, 2 * f}));
      ASSERT_OK(ops::SwigluBackward(gpu, gate_up_gpu, d_out_gpu, d_gate_up_gpu));
      const Tensor got = test_util::ToHost(gpu, d_gate_up_gpu);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < f; ++c) {
          const int64_t gate_at = r * 2 * f + c, up_at = gate_at + f;
          const double g = values[gate_at], u = values[up_at], d = d_values[r * f + c];
          const double gate_bound =
              kDelta * std::fabs(d * u) * Sigmoid(g) * (1.0 + 2.0 * std::fabs(g)) + kFloor;
          ASSERT_TRUE(Near(dtype, At(want, gate_at), At(got, gate_at), gate_bound))
              << "d_gate at row " << r << ", column " << c << ", gate " << g;
          const double w_up = At(want, up_at);
          ASSERT_TRUE(Near(dtype, w_up, At(got, up_at), kDelta * std::fabs(w_up) + kFloor))
              << "d_up at row " << r << ", column " << c << ", gate " << g;
        }
      }

      const Tensor again_gpu = test_util::ToDevice(gpu, NaNAct(dtype, {rows, 2 * f}));
      ASSERT_OK(ops::SwigluBackward(gpu, gate_up_gpu, d_out_gpu, again_gpu));
      EXPECT_TRUE(test_util::SameBytes(got, test_util::ToHost(gpu, again_gpu)));
    }
  }
}

}  // namespace
}  // namespace moetrain::ops_test
