// The CPU side of permute.h; shapes and dtypes arrive validated, values (indices) are checked
// here, where they are read.
#ifndef MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CPU_H_
#define MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CPU_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/permute/permute.h"

namespace moetrain::cpu {

// out's tensors are on the host, of the shapes BuildPermutation gives them.
absl::Status BuildPermutation(const MoeConfig& config, const ops::PermutationArgs& args,
                              ops::Permutation* out);
absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst);
absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out);
absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights);
absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_CPU_H_
