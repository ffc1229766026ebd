// What the op tests share: activation tensors in f32 or bf16 built from values that are rounded
// to what the tensor stores (so a float64 reference computes from the engine's exact inputs),
// NaN-filled outputs (an element a kernel forgets to write cannot pass), relative errors, and
// the check of an InvalidArgument naming a thing.
#ifndef MOETRAIN_TESTS_ENGINE_OPS_ACT_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_OPS_ACT_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {

// The CPU context every op test runs on.
inline ExecContext Cpu() { return ExecContext::Cpu(); }

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Relative error bound for a result computed in f32 and stored in `dtype` (bf16 storage rounds
// to 8 significant bits: ~2^-9 relative).
inline double Tolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

inline const char* Name(DType dtype) { return dtype == DType::kBF16 ? "BF16" : "F32"; }

struct Size {
  int64_t rows, cols;
};
inline void PrintTo(const Size& s, std::ostream* os) { *os << s.rows << "x" << s.cols; }

// 37 × 23 is no multiple of any vector width; 3000 × 300 spreads over the thread pool.
inline const Size kSmall = {37, 23};
inline const Size kLarge = {3000, 300};

// A tensor in `dtype` (f32 or bf16) holding `values`, which are rounded in place to what the
// tensor stores so that a reference computes from exactly the engine's inputs.
inline Tensor MakeAct(DType dtype, std::vector<int64_t> shape, std::vector<float>& values) {
  Tensor t = Tensor::Empty(dtype, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(values[i]);
      values[i] = BF16ToFloat(t.data<BF16>()[i]);
    } else {
      t.data<float>()[i] = values[i];
    }
  }
  return t;
}

// An act tensor with every element NaN (f32) or a bf16 NaN: elements a kernel must overwrite.
inline Tensor NaNAct(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(kNaN);
    } else {
      t.data<float>()[i] = kNaN;
    }
  }
  return t;
}

inline Tensor MakeI32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::Empty(DType::kI32, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

inline std::vector<float> Uniform(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Element i of an f32 or bf16 tensor as double.
inline double At(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? BF16ToFloat(t.data<BF16>()[i]) : t.data<float>()[i];
}

// ‖got − want‖ / ‖want‖ (absolute when want is zero); a NaN left in got fails any bound.
inline double RelError(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double d = At(got, i) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.view().raw(), b.view().raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

using test_util::IsInvalidArgument;

inline double RefSigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double RefSwiglu(double gate, double up) { return gate * RefSigmoid(gate) * up; }
// ∂/∂gate and ∂/∂up of RefSwiglu.
inline double RefSwigluDGate(double gate, double up) {
  const double s = RefSigmoid(gate);
  return up * (s + gate * s * (1.0 - s));
}
inline double RefSwigluDUp(double gate) { return gate * RefSigmoid(gate); }

// gate_up (R, 2F) values in [-6, 6]; saturated gates have a test of their own, so that their
// large outputs do not dominate the norms here.
inline std::vector<float> GateUpValues(int64_t rows, int64_t f, std::mt19937& rng) {
  return Uniform(rows * 2 * f, -6.0f, 6.0f, rng);
}

// Parameters of the tests over an act dtype and a size.
using ActSizeParam = std::tuple<DType, Size>;

inline std::string ActSizeName(const ::testing::TestParamInfo<ActSizeParam>& info) {
  const Size s = std::get<1>(info.param);
  return std::string(Name(std::get<0>(info.param))) + "_" + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

}  // namespace moetrain::ops_test

#endif  // MOETRAIN_TESTS_ENGINE_OPS_ACT_TEST_UTIL_H_
