// The CUDA side of the LM head loss's parts between its GEMMs (lm_head_loss_cuda.cu); the chunks
// and their GEMMs are lm_head_loss.cc's, shared with the CPU. Arguments arrive validated and ctx
// is on a CUDA device. Host-safe: no CUDA headers.
//
// - CheckTargets waits once, to return the CPU's InvalidArgument naming the first bad target.
// - CrossEntropyRows runs one block per row on cross_entropy_math.h's per-element steps: the
//   row's maximum (the same value as the CPU's), then its sum of e^(z − max) in f32 over the
//   block — per-thread strided partial sums, then a fixed shuffle tree, so the sum is
//   deterministic but not in the CPU's serial order (the loss differs from the CPU's by about
//   V·2^-24 relative to the sum at worst) — then the gradient. It does not wait. Unlike the CPU
//   it leaves z as it is (it recomputes the exponentials for the gradient, which gives the same
//   bits, instead of storing them): no caller reads z afterwards.
// - SumInOrder copies the T losses to the host (one wait; the loss is a host value anyway) and
//   sums them with the CPU's own cpu::SumInOrder: the same bits from the same losses.
#ifndef MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CUDA_H_
#define MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops::cuda {

absl::Status CheckTargets(const ExecContext& ctx, TensorView targets, int64_t vocab);

// z (rows, V) f32, targets (rows) i32, token_loss (rows) f32 written; d_logits (rows, V) act
// (f32 or bf16) = scale · (softmax − one_hot) when not empty.
absl::Status CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                              TensorView token_loss, TensorView d_logits, float scale);

// Σ token_loss (T) f32 in token order, in f64.
absl::StatusOr<double> SumInOrder(const ExecContext& ctx, TensorView token_loss);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_CUDA_H_
