// The per-element math of the MLA layout ops (mla.h), for the CPU and CUDA kernels alike. The
// rotation is RopeRotate (ops/rope/rope_math.h) with the RoPE table's cos and sin of the token's
// position, (rope/2) values each.
#ifndef MOETRAIN_ENGINE_OPS_MLA_MLA_MATH_H_
#define MOETRAIN_ENGINE_OPS_MLA_MLA_MATH_H_

#include <cstdint>

#include "engine/core/host_device.h"
#include "engine/ops/rope/rope_math.h"

namespace moetrain {

// Feature r of RoPE applied to the interleaved rope features x (rope = 2·half of them), written
// de-interleaved: pair i = (x_2i, x_2i+1) rotated becomes features i and i + half.
MOETRAIN_HOST_DEVICE float MlaRopeFeature(const float* x, int64_t r, int64_t half, const float* cos,
                                          const float* sin) {
  const int64_t i = r < half ? r : r - half;
  float first, second;
  RopeRotate(x[2 * i], x[2 * i + 1], cos[i], sin[i], &first, &second);
  return r < half ? first : second;
}

// The backward of MlaRopeFeature: the gradient of interleaved feature m from the gradient d of
// the de-interleaved rotated features (the inverse rotation).
MOETRAIN_HOST_DEVICE float MlaRopeFeatureGrad(const float* d, int64_t m, int64_t half,
                                              const float* cos, const float* sin) {
  const int64_t i = m / 2;
  float first, second;
  RopeRotate(d[i], d[i + half], cos[i], -sin[i], &first, &second);
  return m % 2 == 0 ? first : second;
}

// The gradient of the shared key's interleaved rope feature m: the rotated features' gradients
// summed over the heads in order (heads of dqk features each, rope features from `nope` on), then
// rotated back.
MOETRAIN_HOST_DEVICE float MlaSharedKeyGrad(const float* d_k, int64_t heads, int64_t dqk,
                                            int64_t nope, int64_t m, int64_t half, const float* cos,
                                            const float* sin) {
  const int64_t i = m / 2;
  float sum_first = 0.0f, sum_second = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    sum_first += d_k[h * dqk + nope + i];
    sum_second += d_k[h * dqk + nope + half + i];
  }
  float first, second;
  RopeRotate(sum_first, sum_second, cos[i], -sin[i], &first, &second);
  return m % 2 == 0 ? first : second;
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_MLA_MLA_MATH_H_
