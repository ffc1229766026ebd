// The CPU side of mla.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_MLA_MLA_CPU_H_
#define MOETRAIN_ENGINE_OPS_MLA_MLA_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/mla/mla.h"

namespace moetrain::cpu {

void MlaQkvForward(const ExecContext& ctx, const ops::MlaShape& shape, float theta,
                   TensorView q_full, TensorView k_rope, TensorView kv, TensorView q, TensorView k,
                   TensorView v);
void MlaQkvBackward(const ExecContext& ctx, const ops::MlaShape& shape, float theta, TensorView d_q,
                    TensorView d_k, TensorView d_v, TensorView d_q_full, TensorView d_k_rope,
                    TensorView d_kv);
// widen: wide = narrow zero-padded per head; else narrow = the first v features of each head.
void MlaCopyHeads(const ExecContext& ctx, const ops::MlaShape& shape, TensorView wide,
                  TensorView narrow, bool widen);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_MLA_MLA_CPU_H_
