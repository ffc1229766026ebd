// Rotary position embedding per pair, for the CPU and CUDA kernels alike, in the rotate-half
// convention (Llama): position p rotates pair i < Dh/2, (x_i, x_{i+Dh/2}), by the angle
// p·θ^(−2i/Dh), computed in double.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_MATH_H_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"

namespace moetrain {

MOETRAIN_HOST_DEVICE double RopeAngle(int64_t position, int64_t pair, int64_t head_dim,
                                      float theta) {
  return static_cast<double>(position) * pow(static_cast<double>(theta), -2.0 * pair / head_dim);
}

// (x1, x2) rotated by the angle of cosine c and sine s (s negated rotates back). On the device
// every product rounds before the sum (__fmul_rn, which nvcc never fuses), so its result does
// not depend on which product a compiler would fuse. The CPU keeps its compiler's contraction:
// its results are pinned bit for bit (pinned_losses_test), and its clones for CPUs with FMA fuse
// where the device does not, so the two agree to about an ulp of the inputs, not bit for bit.
MOETRAIN_HOST_DEVICE void RopeRotate(float x1, float x2, float c, float s, float* out1,
                                     float* out2) {
#if defined(__CUDA_ARCH__)
  *out1 = __fmul_rn(x1, c) - __fmul_rn(x2, s);
  *out2 = __fmul_rn(x2, c) + __fmul_rn(x1, s);
#else
  *out1 = x1 * c - x2 * s;
  *out2 = x2 * c + x1 * s;
#endif
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_MATH_H_
