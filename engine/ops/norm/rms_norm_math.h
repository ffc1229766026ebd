// RMSNorm per element, for the CPU and CUDA kernels alike:
//   out_i = x_i · rstd · w_i,  rstd = 1 / sqrt(Σ_i x_i² / D + eps);
//   d_x_i = rstd · (g_i − x_i · c),  g = dy ⊙ w,  c = ⟨g, x⟩ · rstd² / D;
//   d_w_i += dy_i · x_i · rstd.
// The row sums (Σ x², ⟨g, x⟩) are the kernels' own: each device reduces in its own fixed order.
#ifndef MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_MATH_H_
#define MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"

namespace moetrain {

MOETRAIN_HOST_DEVICE float RmsNormRstd(float sum_of_squares, int64_t d, float eps) {
  const float mean_square = sum_of_squares / static_cast<float>(d);
  return 1.0f / sqrtf(mean_square + eps);
}

MOETRAIN_HOST_DEVICE float RmsNormValue(float x, float rstd, float w) { return x * rstd * w; }

// c of the input gradient, from ⟨g, x⟩.
MOETRAIN_HOST_DEVICE float RmsNormGradScale(float g_dot_x, float rstd, int64_t d) {
  return g_dot_x * rstd * rstd / static_cast<float>(d);
}

MOETRAIN_HOST_DEVICE float RmsNormInputGrad(float x, float g, float rstd, float c) {
  return rstd * (g - x * c);
}

MOETRAIN_HOST_DEVICE float RmsNormWeightGradTerm(float dy, float x, float rstd) {
  return dy * (x * rstd);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_MATH_H_
