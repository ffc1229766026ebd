// Fused row-wise kernels of the MoE layer on the CPU, threaded over rows. Each reads and writes
// its tensors once: activations in f32 or bf16 ("act"), math in f32.
#ifndef MOETRAIN_ENGINE_BACKEND_CPU_ELEMENTWISE_H_
#define MOETRAIN_ENGINE_BACKEND_CPU_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

// out (R, F) act = silu(gate) ⊙ up, where gate_up (R, 2F) f32 holds gate in columns [0, F) and
// up in [F, 2F).
absl::Status SwigluForward(TensorView gate_up, TensorView out);

// d_gate_up (R, 2F) act from d_out (R, F) f32 and the forward's gate_up (R, 2F) f32.
absl::Status SwigluBackward(TensorView gate_up, TensorView d_out, TensorView d_gate_up);

// dst (R, D) = src[index[r]] for each row r; src (T, D) and dst in one dtype, index (R) i32.
absl::Status GatherRows(TensorView src, TensorView index, TensorView dst);

// The combine of routed outputs: out_t = Σ_j weights[t, j] · rows[pair_row[t, j]] (+ extra_t),
// skipping pairs whose row is -1. rows (R, D) f32, pair_row (T, k) i32, weights (T, k) f32,
// extra (T, D) f32 or empty, out (T, D) act.
absl::Status CombineRows(TensorView rows, TensorView pair_row, TensorView weights, TensorView extra,
                         TensorView out);

// Backward of CombineRows: d_rows[pair_row[t, j]] = weights[t, j] · d_out_t (act) and
// d_weights[t, j] = ⟨d_out_t, rows[pair_row[t, j]]⟩ (0 for a dropped pair). d_out (T, D) act,
// rows (R, D) f32, d_rows (R, D) act, d_weights (T, k) f32. Each row must belong to exactly one
// pair, as BuildPermutation makes them (so that d_rows is written once per row).
absl::Status CombineRowsBackward(TensorView d_out, TensorView rows, TensorView pair_row,
                                 TensorView weights, TensorView d_rows, TensorView d_weights);

// out_t = Σ_j rows[pair_row[t, j]] + Σ_a addends[a]_t: the backward of a gather that fanned each
// token out to its pairs. rows (R, D) f32, addends (T, D) f32 each, out (T, D) act.
absl::Status SumPairRows(TensorView rows, TensorView pair_row, absl::Span<const TensorView> addends,
                         TensorView out);

// dst = src converted elementwise (f32 ↔ bf16, or a copy); same shape, contiguous.
absl::Status ConvertTensor(TensorView src, TensorView dst);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_BACKEND_CPU_ELEMENTWISE_H_
