// RMSNorm: out_t = x_t · rstd_t ⊙ w, rstd_t = 1 / sqrt(mean_i x_{t,i}² + eps) (rms_norm_math.h).
// The residual stream x, the statistics and the gradients are f32; the output is "act" (f32 or
// bf16, the compute dtype). Every reduction runs in a fixed order that does not depend on the
// number of threads, so results are bit-reproducible.
#ifndef MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_H_
#define MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

// x (T, D) f32, weight (D) f32; out (T, D) act and rstd (T) f32 are written.
absl::Status RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                            TensorView out, TensorView rstd);

struct RmsNormBackwardArgs {
  TensorView x;         // (T, D) f32: the forward's input
  TensorView weight;    // (D) f32
  TensorView rstd;      // (T) f32: saved by the forward
  TensorView d_out;     // (T, D) act
  TensorView d_x;       // (T, D) f32: written, or added to when accumulate_d_x (a residual)
  TensorView d_weight;  // (D) f32: accumulated
  bool accumulate_d_x = false;
};
absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& args);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_H_
