// SwiGLU, the activation of every expert and dense FFN: out = silu(gate) ⊙ up, threaded over rows
// and reading and writing each tensor once. Math in f32 (swiglu_math.h); activations ("act") in
// f32 or bf16. Each element is computed alone: results do not depend on the thread count.
#ifndef MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_H_
#define MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

// out (R, F) act = silu(gate) ⊙ up, where gate_up (R, 2F) f32 holds gate in columns [0, F) and
// up in [F, 2F).
absl::Status SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out);

// d_gate_up (R, 2F) act from d_out (R, F) f32 and the forward's gate_up (R, 2F) f32.
absl::Status SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                            TensorView d_gate_up);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_H_
