// Token permutation: (token, slot) pairs sorted by expert, stable in (token, slot) order, so each
// expert's rows are one contiguous block of the permuted batch; plus the inverse map for combine.
#ifndef MOETRAIN_ENGINE_MOE_PERMUTATION_H_
#define MOETRAIN_ENGINE_MOE_PERMUTATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"

namespace moetrain {

struct Permutation {
  int64_t num_rows = 0;                 // R: pairs kept (T·k when dropless)
  int64_t dropped = 0;                  // pairs dropped by capacity
  std::vector<int64_t> expert_offsets;  // (E + 1): expert e owns rows [offsets[e], offsets[e+1])
  Tensor row_token;                     // (R) i32: token of each permuted row
  Tensor pair_row;                      // (T, k) i32: permuted row of pair (t, j); -1 if dropped
};

// Sorts the pairs of `topk_experts` (T, k) i32 by expert. In capacity mode (capacity_factor > 0)
// an expert keeps at most ⌈cf·T·k/E⌉ pairs by config.drop_policy, ranking by `topk_weights`
// (T, k) f32 for kProbability.
absl::Status BuildPermutation(const MoeConfig& config, TensorView topk_experts,
                              TensorView topk_weights, Permutation* out);

// The capacity of each expert for T tokens: ⌈cf·T·k/E⌉, or T·k when dropless.
int64_t ExpertCapacity(const MoeConfig& config, int64_t tokens);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MOE_PERMUTATION_H_
