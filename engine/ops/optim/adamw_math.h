// The AdamW update per element, for the CPU and CUDA kernels alike (train/optimizer.h defines
// the step; AdamWScalars carries its per-step numbers). The CPU's loops that inline these are
// compiled with MOETRAIN_NO_FP_CONTRACT, so no clone fuses a multiply-add and every CPU gives
// the same bits; a device kernel matches them only if it does not fuse either (nvcc --fmad=false).
//   m ← β1·m + (1 − β1)·g,  v ← β2·v + (1 − β2)·g²,
//   p ← p·decay − step_size · m / (√v · inv_sqrt_bias2 + eps).
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_

#include <math.h>

#include "engine/core/host_device.h"

namespace moetrain {

// The f32 scalars of one AdamW step.
struct AdamWScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;       // lr / (1 − β1^t)
  float inv_sqrt_bias2;  // 1 / √(1 − β2^t): √v̂ = √v · inv_sqrt_bias2
  float eps;
  float decay;  // 1 − lr·wd, or exactly 1 for parameters without weight decay
};

MOETRAIN_HOST_DEVICE void AdamWMoments(float g, float* m, float* v, const AdamWScalars& s) {
  *m = s.beta1 * *m + s.one_minus_beta1 * g;
  *v = s.beta2 * *v + s.one_minus_beta2 * (g * g);
}

// The new parameter from the updated m and √v.
MOETRAIN_HOST_DEVICE float AdamWParameter(float p, float m, float sqrt_v, const AdamWScalars& s) {
  const float denom = sqrt_v * s.inv_sqrt_bias2 + s.eps;
  return p * s.decay - s.step_size * (m / denom);
}

// The whole update of one element.
MOETRAIN_HOST_DEVICE void AdamWUpdateElement(float* p, float g, float* m, float* v,
                                             const AdamWScalars& s) {
  AdamWMoments(g, m, v, s);
  *p = AdamWParameter(*p, *m, sqrtf(*v), s);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_
