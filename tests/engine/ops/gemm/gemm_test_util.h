// What the GEMM tests share: random operands with the exact values they hold, a float64 reference
// of the dense GEMM, error checks, and the grouped problems (ragged groups, empty ones included).
#ifndef MOETRAIN_TESTS_ENGINE_OPS_GEMM_GEMM_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_OPS_GEMM_GEMM_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/gemm/gemm.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test::gemm_test {

inline ExecContext Cpu() { return ExecContext::Cpu(); }

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Relative error bounds: f32 inputs, and bf16 inputs (rounded before the reference sees them;
// accumulation is f32 in both).
inline double Tolerance(DType input_dtype) { return input_dtype == DType::kBF16 ? 1e-2 : 1e-5; }

// A random tensor stored in `dtype`, with the exact values it holds (after bf16 rounding).
struct Operand {
  Tensor tensor;
  std::vector<double> values;
};

inline Operand RandomOperand(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  Operand op{Tensor::Empty(dtype, shape), {}};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  op.values.resize(op.tensor.numel());
  for (int64_t i = 0; i < op.tensor.numel(); ++i) {
    float v = dist(rng);
    if (dtype == DType::kBF16) {
      const BF16 b = FloatToBF16(v);
      op.tensor.data<BF16>()[i] = b;
      v = BF16ToFloat(b);
    } else {
      op.tensor.data<float>()[i] = v;
    }
    op.values[i] = v;
  }
  return op;
}

// An f32 tensor with every element `value` (NaN marks elements the kernel must overwrite).
inline Tensor Filled(std::vector<int64_t> shape, float value) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value;
  return t;
}

// ‖got − want‖ / ‖want‖ over n elements (absolute when want is zero); NaN in got fails any bound.
inline double RelError(const float* got, const double* want, int64_t n) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += want[i] * want[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}
inline double RelError(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  return RelError(got.data<float>(), want.data(), got.numel());
}

inline bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

using test_util::IsInvalidArgument;

// c (m, n) = [c0 +] op(a) · op(b); a stored (k, m) when trans_a, b stored (n, k) when trans_b.
inline std::vector<double> RefGemm(const std::vector<double>& a, const std::vector<double>& b,
                                   const std::vector<double>& c0, int64_t m, int64_t n, int64_t k,
                                   bool trans_a, bool trans_b, bool accumulate) {
  std::vector<double> c(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = accumulate ? c0[i * n + j] : 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = trans_a ? a[p * m + i] : a[i * k + p];
        const double bv = trans_b ? b[j * k + p] : b[p * n + j];
        sum += av * bv;
      }
      c[i * n + j] = sum;
    }
  }
  return c;
}

inline const char* Name(DType dtype) { return dtype == DType::kBF16 ? "BF16" : "F32"; }

struct Shape {
  int64_t m, n, k;
};
inline void PrintTo(const Shape& s, std::ostream* os) { *os << s.m << "x" << s.n << "x" << s.k; }

inline std::vector<int64_t> OffsetsFromSizes(const std::vector<int64_t>& group_rows) {
  std::vector<int64_t> offsets = {0};
  for (int64_t rows : group_rows) offsets.push_back(offsets.back() + rows);
  return offsets;
}

struct GroupedCase {
  std::string name;
  std::vector<int64_t> group_rows;  // (G)
  int64_t n, k;
};
inline void PrintTo(const GroupedCase& c, std::ostream* os) {
  *os << c.name << " (G = " << c.group_rows.size() << ", N = " << c.n << ", K = " << c.k << ")";
}

// The grouped cases every grouped test runs: ragged, one group, one row, no rows, 64 groups.
inline std::vector<GroupedCase> GroupedCases() {
  std::vector<GroupedCase> cases = {
      // Empty first and last groups, empty and single-row groups between large ones.
      {"Ragged", {0, 1, 37, 0, 5, 120, 1, 0, 0, 19, 0}, 23, 19},
      {"SingleGroup", {77}, 33, 65},
      {"OneRowInManyGroups", {0, 0, 0, 1, 0, 0}, 7, 13},
      {"NoRowsAtAll", {0, 0, 0}, 5, 9},
  };
  // 64 groups, ~3000 rows, a few empty and single-row groups at fixed places.
  GroupedCase many{"SixtyFourGroups", {}, 37, 75};
  std::mt19937 rng(64);
  std::uniform_int_distribution<int64_t> rows(2, 108);
  for (int g = 0; g < 64; ++g) many.group_rows.push_back(rows(rng));
  for (int g : {0, 9, 10, 40, 63}) many.group_rows[g] = 0;
  for (int g : {1, 20, 62}) many.group_rows[g] = 1;
  cases.push_back(many);
  return cases;
}

// One grouped problem: x (R, K), w (G, N, K), dy (R, N) in `dtype`, offsets (G + 1).
struct GroupedProblem {
  int64_t rows, groups, n, k;
  std::vector<int64_t> offsets;
  Operand x, w, dy;
};

inline GroupedProblem MakeGroupedProblem(DType dtype, const GroupedCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  GroupedProblem p;
  p.offsets = OffsetsFromSizes(c.group_rows);
  p.rows = p.offsets.back();
  p.groups = static_cast<int64_t>(c.group_rows.size());
  p.n = c.n;
  p.k = c.k;
  p.x = RandomOperand(dtype, {p.rows, p.k}, rng);
  p.w = RandomOperand(dtype, {p.groups, p.n, p.k}, rng);
  p.dy = RandomOperand(dtype, {p.rows, p.n}, rng);
  return p;
}

// The CUDA tests' bound on one f32-accumulated element with `inner` products, relative to the sum
// of their magnitudes: 4·(inner + 1) float ulps, at least 1e-5.
inline double ElementTolerance(int64_t inner) {
  return std::max(1e-5, 4.0 * static_cast<double>(inner + 1) * std::ldexp(1.0, -24));
}

// Every element of got (f32) within tol·scale of want (NaN fails); stops after a few misses.
inline void ExpectElementsClose(const Tensor& got, const std::vector<double>& want,
                                const std::vector<double>& scale, double tol,
                                const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  int misses = 0;
  for (int64_t i = 0; i < got.numel() && misses < 5; ++i) {
    const double diff = std::fabs(static_cast<double>(got.data<float>()[i]) - want[i]);
    if (!(diff <= tol * scale[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got.data<float>()[i] << ", want "
                    << want[i] << " (bound " << tol * scale[i] << ")";
      ++misses;
    }
  }
}

}  // namespace moetrain::ops_test::gemm_test

#endif  // MOETRAIN_TESTS_ENGINE_OPS_GEMM_GEMM_TEST_UTIL_H_
