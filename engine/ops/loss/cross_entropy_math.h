// The next-token cross-entropy of one row of logits, for the CPU and CUDA kernels alike:
//   loss = logsumexp(z) − z_target, softmax in f32 with the row's maximum subtracted first;
//   ∂loss/∂z_v = (softmax(z)_v − [v = target]), scaled by the caller's `scale`.
#ifndef MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_
#define MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"
#include "engine/ops/common/softmax_math.h"

namespace moetrain {

// The loss of row z (V) for `target`; overwrites z with e^(z − max) and returns their sum in
// *exp_sum, from which CrossEntropyGrad makes the softmax.
MOETRAIN_HOST_DEVICE float CrossEntropyRow(float* z, int64_t v, int32_t target, float* exp_sum) {
  const float target_logit = z[target];
  const float max = RowMax(z, v);
  float sum = 0.0f;
  for (int64_t i = 0; i < v; ++i) {
    z[i] = expf(z[i] - max);
    sum += z[i];
  }
  *exp_sum = sum;
  return (max + logf(sum)) - target_logit;
}

// d (V) = scale · (softmax − one_hot(target)) from CrossEntropyRow's exponentials and sum.
MOETRAIN_HOST_DEVICE void CrossEntropyGrad(const float* exp_z, int64_t v, int32_t target,
                                           float exp_sum, float scale, float* d) {
  const float p_scale = scale / exp_sum;
  for (int64_t i = 0; i < v; ++i) d[i] = exp_z[i] * p_scale;
  d[target] -= scale;
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_
