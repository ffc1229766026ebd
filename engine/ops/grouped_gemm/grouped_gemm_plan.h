// How a backend that runs one dense GEMM per group (the CUDA backend: one cuBLASLt matmul per
// expert, spread over side streams) splits a grouped GEMM: which products to issue, on which
// stream, and which parts of the output no product writes and so must be zeroed. Pure host logic
// (no CUDA types), so the CPU tests check it.
#ifndef MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_PLAN_H_
#define MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace moetrain::ops {

// Which of the three grouped products (grouped_gemm.h).
enum class GroupedGemmKind {
  kForward,         // y_g (rows_g, N) = x_g (rows_g, K) · w_gᵀ
  kBackwardData,    // dx_g (rows_g, K) = dy_g (rows_g, N) · w_g
  kBackwardWeight,  // dw_g (N, K) [+]= dy_gᵀ (N, rows_g) · x_g (rows_g, K)
};

// One dense product: group `group`, over rows [row_begin, row_begin + rows) of the activations,
// issued on side stream `stream` (0 .. streams_used - 1).
struct GroupedGemmProblem {
  int64_t group;
  int64_t row_begin;
  int64_t rows;  // > 0
  int stream;
};

// Groups [begin, end) whose weight gradient no product writes.
struct GroupRange {
  int64_t begin;
  int64_t end;
};

struct GroupedGemmPlan {
  // The products, in group order; groups with no rows have none (and nor does anything when the
  // output is empty, or when the inner dimension is 0).
  std::vector<GroupedGemmProblem> problems;
  // How many side streams the products use: min(problems, num_streams). The caller forks exactly
  // these from its main stream and joins them back.
  int streams_used = 0;
  // Forward and backward data with an inner dimension of 0 (K, resp. N): every output element is
  // an empty sum, so the whole output is zeroed and no product runs.
  bool zero_whole_output = false;
  // Backward weight without accumulation: runs of groups with no rows, whose dw_g must be zeroed
  // (with accumulation they keep their value). Empty for the other kinds.
  std::vector<GroupRange> zero_groups;
};

// The plan of `kind` over `offsets` (G + 1, validated by the op: from 0, non-decreasing), with
// weights (G, n, k), spread round-robin over `num_streams` (≥ 1) streams in group order.
GroupedGemmPlan PlanGroupedGemm(GroupedGemmKind kind, absl::Span<const int64_t> offsets, int64_t n,
                                int64_t k, bool accumulate, int num_streams);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_PLAN_H_
