// The float64 references of the grouped GEMMs over ragged groups (grouped_gemm.h), which the CPU
// and CUDA tests both compare with.
#ifndef MOETRAIN_TESTS_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_REFERENCE_H_
#define MOETRAIN_TESTS_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_REFERENCE_H_

#include <cstdint>
#include <vector>

namespace moetrain::ops_test {

// y_g = x_g · w_gᵀ: x (R, K), w (G, N, K) -> y (R, N).
inline std::vector<double> RefGroupedForward(const std::vector<double>& x,
                                             const std::vector<double>& w,
                                             const std::vector<int64_t>& offsets, int64_t n,
                                             int64_t k) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> y(offsets.back() * n);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p) sum += x[r * k + p] * w[(g * n + j) * k + p];
        y[r * n + j] = sum;
      }
    }
  }
  return y;
}

// dx_g = dy_g · w_g: dy (R, N), w (G, N, K) -> dx (R, K).
inline std::vector<double> RefGroupedBackwardData(const std::vector<double>& dy,
                                                  const std::vector<double>& w,
                                                  const std::vector<int64_t>& offsets, int64_t n,
                                                  int64_t k) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> dx(offsets.back() * k);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t p = 0; p < k; ++p) {
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += dy[r * n + j] * w[(g * n + j) * k + p];
        dx[r * k + p] = sum;
      }
    }
  }
  return dx;
}

// dw_g = [dw0_g +] dy_gᵀ · x_g: dy (R, N), x (R, K) -> dw (G, N, K).
inline std::vector<double> RefGroupedBackwardWeight(const std::vector<double>& dy,
                                                    const std::vector<double>& x,
                                                    const std::vector<int64_t>& offsets, int64_t n,
                                                    int64_t k, const std::vector<double>& dw0,
                                                    bool accumulate) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> dw(groups * n * k);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        double sum = accumulate ? dw0[(g * n + j) * k + p] : 0.0;
        for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) sum += dy[r * n + j] * x[r * k + p];
        dw[(g * n + j) * k + p] = sum;
      }
    }
  }
  return dw;
}

}  // namespace moetrain::ops_test

#endif  // MOETRAIN_TESTS_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_REFERENCE_H_
