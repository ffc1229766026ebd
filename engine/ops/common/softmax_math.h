// Softmax and log-sum-exp over one row, for the CPU and CUDA kernels alike: shifted by the row's
// maximum so that exp cannot overflow; exponentials in f32, their sum in f64.
#ifndef MOETRAIN_ENGINE_OPS_COMMON_SOFTMAX_MATH_H_
#define MOETRAIN_ENGINE_OPS_COMMON_SOFTMAX_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"

namespace moetrain {

// The largest of z[0..n) (n ≥ 1), as std::max_element finds it (a NaN is never preferred).
MOETRAIN_HOST_DEVICE float RowMax(const float* z, int64_t n) {
  float max = z[0];
  for (int64_t i = 1; i < n; ++i) {
    if (max < z[i]) max = z[i];
  }
  return max;
}

// s = softmax(z) over n entries; returns logsumexp(z).
MOETRAIN_HOST_DEVICE double Softmax(const float* z, int64_t n, float* s) {
  const float max = RowMax(z, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = expf(z[i] - max);
    sum += s[i];
  }
  const double inv_sum = 1.0 / sum;
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(s[i] * inv_sum);
  return max + log(sum);
}

MOETRAIN_HOST_DEVICE double LogSumExp(const float* z, int64_t n) {
  const float max = RowMax(z, n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += expf(z[i] - max);
  return max + log(sum);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_COMMON_SOFTMAX_MATH_H_
