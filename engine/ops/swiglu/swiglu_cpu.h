// The CPU side of swiglu.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CPU_H_
#define MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

void SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out);
void SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                    TensorView d_gate_up);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_CPU_H_
