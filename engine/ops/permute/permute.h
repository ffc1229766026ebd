// Token permutation and its inverse, the combine. The (token, slot) pairs the router chose are
// sorted by expert, stable in (token, slot) order, so each expert's rows are one contiguous block
// of the permuted batch (what the grouped GEMMs run on); the combine weighs the experts' rows and
// sums them back into tokens.
//
// T tokens, k slots, E experts, R permuted rows (T·k when dropless; fewer when a capacity drops
// pairs), D columns. "act" = f32 or bf16. Row maps are i32, offsets i64. Every op writes each
// output element once, in a fixed order: results do not depend on the thread count.
#ifndef MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_H_
#define MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"

namespace moetrain::ops {

// The permuted layout, on the device of the op that built it. Its tensors are reused (not
// reallocated) by the next BuildPermutation of the same shapes.
struct Permutation {
  Tensor expert_offsets;  // (E + 1) i64: expert (or order position) e owns rows
                          // [expert_offsets[e], expert_offsets[e + 1])
  Tensor row_token;       // (R) i32: token of each permuted row
  Tensor pair_row;        // (T, k) i32: permuted row of pair (t, j); -1 if dropped
};

struct PermutationArgs {
  TensorView topk_experts;  // (T, k) i32 in [0, E)
  TensorView topk_weights;  // (T, k) f32: ranks an over-full expert's pairs for kProbability
  // (E + 1) host numbers: the rows of each expert in the permuted batch, as the host planned them
  // from the router's counts (PermutedExpertOffsets) or the expert-parallel exchange. They size
  // everything the host runs on the rows (the grouped GEMMs, the exchange), so the op lays the
  // pairs out by them and refuses offsets that the pairs do not fill exactly.
  absl::Span<const int64_t> expert_offsets = {};
  // (E) i32, a permutation of [0, E), or empty: sorts the pairs by expert_order[expert] instead
  // of by expert (the expert-parallel send order); expert_offsets then follow that order.
  TensorView expert_order = {};
};

// Sorts the pairs by expert. In capacity mode (capacity_factor > 0) an expert keeps at most
// ⌈cf·T·k/E⌉ pairs by config.drop_policy, ranking by topk_weights for kProbability (ties to the
// earlier pair); the kept pairs stay in (token, slot) order. R = expert_offsets[E].
absl::Status BuildPermutation(const ExecContext& ctx, const MoeConfig& config,
                              const PermutationArgs& args, Permutation* out);

// The capacity of each expert for T tokens: ⌈cf·T·k/E⌉, or T·k when dropless.
int64_t ExpertCapacity(const MoeConfig& config, int64_t tokens);

// The rows each expert keeps of the `tokens_per_expert` (E) pairs its router chose among T
// tokens: min(n_e, capacity).
std::vector<int64_t> KeptRowsPerExpert(const MoeConfig& config, int64_t tokens,
                                       absl::Span<const int64_t> tokens_per_expert);

// The expert_offsets (E + 1) of BuildPermutation for those counts: the prefix sums of
// KeptRowsPerExpert. So the host knows R = offsets[E] and the group sizes from the counts alone.
std::vector<int64_t> PermutedExpertOffsets(const MoeConfig& config, int64_t tokens,
                                           absl::Span<const int64_t> tokens_per_expert);

// dst (R, D) = src[index[r]] for each row r; src (T, D) and dst in one act dtype, index (R) i32
// in [0, T).
absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst);

// The combine of routed outputs: out_t = Σ_j weights[t, j] · rows[pair_row[t, j]] (+ extra_t),
// summed in f32 in slot order, skipping pairs whose row is -1. rows (R, D) f32, pair_row (T, k)
// i32 in [-1, R), weights (T, k) f32, extra (T, D) f32 or empty, out (T, D) act.
absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out);

// Backward of CombineRows: d_rows[pair_row[t, j]] = weights[t, j] · d_out_t and
// d_weights[t, j] = ⟨d_out_t, rows[pair_row[t, j]]⟩ (0 for a dropped pair): the router weights'
// gradient comes out here. d_out (T, D) act, rows (R, D) f32, d_rows (R, D) act, d_weights (T, k)
// f32. Each row must belong to exactly one pair, as BuildPermutation makes them (so that d_rows
// is written once per row).
absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights);

// out_t = Σ_j rows[pair_row[t, j]] + Σ_a addends[a]_t, in that order: the backward of the gather
// that fanned each token out to its pairs (a scatter-add without atomics). rows (R, D) f32,
// addends (T, D) f32 each, out (T, D) act.
absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_H_
