// The CPU side of attention.h: tiles of 64 queries × 64 keys in vector registers (see
// attention.h for the task layout). Arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CPU_H_
#define MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"

namespace moetrain::cpu {

void CausalAttentionForward(const ExecContext& ctx, const ops::AttentionShape& shape, TensorView q,
                            TensorView k, TensorView v, TensorView out, TensorView lse);
void CausalAttentionBackward(const ExecContext& ctx, const ops::AttentionShape& shape, TensorView q,
                             TensorView k, TensorView v, TensorView out, TensorView lse,
                             TensorView d_out, TensorView d_q, TensorView d_k, TensorView d_v);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CPU_H_
