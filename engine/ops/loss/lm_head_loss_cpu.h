// The CPU side of lm_head_loss.h: the per-row cross-entropy between the chunks' GEMMs.
#ifndef MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CPU_H_
#define MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CPU_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

// OK when every target lies in [0, vocab).
absl::Status CheckTargets(TensorView targets, int64_t vocab);

// For each row r of logits z (rows, V) f32: token_loss[r] (f32) = its cross-entropy against
// targets[r]; z is overwritten with its exponentials. With d_logits (rows, V) act, also
// d_logits[r] = scale · (softmax − one_hot).
void CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                      TensorView token_loss, TensorView d_logits, float scale);

// Σ token_loss (T) f32 in token order, in f64.
double SumInOrder(TensorView token_loss);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CPU_H_
