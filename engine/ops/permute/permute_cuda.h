// The CUDA side of permute.h; shapes and dtypes arrive validated by the dispatch in permute.cc.
//
// Values: BuildPermutation checks the routing and the offsets as the CPU does, with the same
// messages (one small device-to-host copy and a wait on the compute stream). The row ops do not
// wait for the device: an index outside its range (a gather index outside [0, T), a pair row
// outside [-1, R)) is never followed; its output row is zero (gather) or the pair counts as
// dropped (combine family), and no error is returned. Their indices come from BuildPermutation,
// which checked them.
#ifndef MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CUDA_H_
#define MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/permute/permute.h"

namespace moetrain::ops::cuda {

// The most addends SumPairRows takes on the device (their pointers travel in the kernel's
// arguments); more is an InvalidArgument.
inline constexpr int kMaxSumAddends = 8;

// Whether BuildPermutation must rank some expert's pairs by weight: kProbability in capacity mode
// with a position given as many rows as the capacity (its expert may have had more pairs, and
// dropped the lightest). Otherwise each expert keeps its first pairs in (token, slot) order, all of
// them when the offsets are right, which the device ranks without looking at the weights.
inline bool NeedsWeightRanking(const MoeConfig& config, int64_t tokens,
                               absl::Span<const int64_t> expert_offsets) {
  if (tokens == 0 || config.capacity_factor <= 0.0f ||
      config.drop_policy != DropPolicy::kProbability) {
    return false;
  }
  const int64_t capacity = ExpertCapacity(config, tokens);
  for (size_t e = 0; e + 1 < expert_offsets.size(); ++e) {
    if (expert_offsets[e + 1] - expert_offsets[e] == capacity) return true;
  }
  return false;
}

// out's tensors are on ctx's device, of the shapes BuildPermutation gives them.
absl::Status BuildPermutation(const ExecContext& ctx, const MoeConfig& config,
                              const PermutationArgs& args, Permutation* out);
absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst);
absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out);
absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights);
absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CUDA_H_
