// The CPU side of rope.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_CPU_H_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"

namespace moetrain::cpu {

void ApplyRope(const ExecContext& ctx, const ops::AttentionShape& shape, float theta, bool inverse,
               TensorView x);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_CPU_H_
