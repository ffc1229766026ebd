// The next-token cross-entropy of one row of logits, for the CPU and CUDA kernels alike:
//   loss = logsumexp(z) − z_target, softmax in f32 with the row's maximum subtracted first;
//   ∂loss/∂z_v = (softmax(z)_v − [v = target]), scaled by the caller's `scale`.
// The per-element steps are functions of their own so that the CUDA kernel, which splits the
// row's loops over a block, runs the very same arithmetic (only its sum's order differs).
#ifndef MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_
#define MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"
#include "engine/ops/common/softmax_math.h"

namespace moetrain {

// e^(z − max), one term of the row's sum.
MOETRAIN_HOST_DEVICE float CrossEntropyExp(float z, float max) { return expf(z - max); }

// The loss from the row's maximum, its sum of e^(z − max) and the target's logit.
MOETRAIN_HOST_DEVICE float CrossEntropyLoss(float max, float exp_sum, float target_logit) {
  return (max + logf(exp_sum)) - target_logit;
}

// The factor that turns e^(z − max) into scale · softmax.
MOETRAIN_HOST_DEVICE float CrossEntropyProbScale(float scale, float exp_sum) {
  return scale / exp_sum;
}

// scale · softmax_v of an element from its exponential; the target's then less `scale`
// (CrossEntropyTargetGrad).
MOETRAIN_HOST_DEVICE float CrossEntropyProbGrad(float exp_z, float p_scale) {
  return exp_z * p_scale;
}
MOETRAIN_HOST_DEVICE float CrossEntropyTargetGrad(float prob_grad, float scale) {
  return prob_grad - scale;
}

// The loss of row z (V) for `target`; overwrites z with e^(z − max) and returns their sum in
// *exp_sum, from which CrossEntropyGrad makes the softmax.
MOETRAIN_HOST_DEVICE float CrossEntropyRow(float* z, int64_t v, int32_t target, float* exp_sum) {
  const float target_logit = z[target];
  const float max = RowMax(z, v);
  float sum = 0.0f;
  for (int64_t i = 0; i < v; ++i) {
    z[i] = CrossEntropyExp(z[i], max);
    sum += z[i];
  }
  *exp_sum = sum;
  return CrossEntropyLoss(max, sum, target_logit);
}

// d (V) = scale · (softmax − one_hot(target)) from CrossEntropyRow's exponentials and sum.
MOETRAIN_HOST_DEVICE void CrossEntropyGrad(const float* exp_z, int64_t v, int32_t target,
                                           float exp_sum, float scale, float* d) {
  const float p_scale = CrossEntropyProbScale(scale, exp_sum);
  for (int64_t i = 0; i < v; ++i) d[i] = CrossEntropyProbGrad(exp_z[i], p_scale);
  d[target] = CrossEntropyTargetGrad(d[target], scale);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_LOSS_CROSS_ENTROPY_MATH_H_
