// RMSNorm per element, for the CPU and CUDA kernels alike:
//   out_i = x_i · rstd · w_i,  rstd = 1 / sqrt(Σ_i x_i² / D + eps);
//   d_x_i = rstd · (g_i − x_i · c),  g = dy ⊙ w,  c = ⟨g, x⟩ · rstd² / D;
//   d_w_i += dy_i · x_i · rstd.
// The row sums (Σ x², ⟨g, x⟩) and the weight gradient's sum over rows run in the fixed orders
// below on both devices, so that a CUDA result can match the CPU's bit for bit.
#ifndef MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_MATH_H_
#define MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"

namespace moetrain {

// A row sum ⟨a, b⟩ over D columns: element i of the first D − D mod 16 goes into partial i mod 16,
// in column order; the last D mod 16 are summed in order from 0, and the 16 partials are then
// added to that in lane order. It vectorises on the CPU and maps onto 16 lanes of a warp on the
// GPU. Each term is RmsNormDotTerm, written as one expression so that every compiler fuses it
// the same way where it can (nvcc always; GCC in the FMA clones).
inline constexpr int kRmsNormDotLanes = 16;
MOETRAIN_HOST_DEVICE float RmsNormDotTerm(float acc, float a, float b) { return acc + a * b; }

// The weight gradient sums over the T rows in blocks of this many consecutive rows (at most 64
// blocks, at least 16 rows each): each block sums its rows in order from 0, and the blocks'
// sums are added in block order from 0 before being added to d_weight. The blocks depend only on
// T (not on the thread count or the device).
constexpr int64_t RmsNormWeightGradBlockRows(int64_t t) {
  constexpr int64_t kMaxBlocks = 64, kMinRows = 16;
  const int64_t rows = (t + kMaxBlocks - 1) / kMaxBlocks;
  return rows < kMinRows ? kMinRows : rows;
}

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
