// The CPU side of rms_norm.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CPU_H_
#define MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/norm/rms_norm.h"

namespace moetrain::cpu {

void RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                    TensorView out, TensorView rstd);
void RmsNormBackward(const ExecContext& ctx, const ops::RmsNormBackwardArgs& args);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_NORM_RMS_NORM_CPU_H_
