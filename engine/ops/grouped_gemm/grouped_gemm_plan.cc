#include "engine/ops/grouped_gemm/grouped_gemm_plan.h"

#include <algorithm>

namespace moetrain::ops {

GroupedGemmPlan PlanGroupedGemm(GroupedGemmKind kind, absl::Span<const int64_t> offsets, int64_t n,
                                int64_t k, bool accumulate, int num_streams) {
  GroupedGemmPlan plan;
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t rows = offsets.empty() ? 0 : offsets.back();
  // Each product's output columns and inner dimension (its rows are the group's, except for the
  // weight gradient, whose output is (n, k) and whose inner dimension is the group's rows).
  switch (kind) {
    case GroupedGemmKind::kForward:  // (rows_g, n) over k
      if (rows == 0 || n == 0) return plan;
      if (k == 0) {
        plan.zero_whole_output = true;
        return plan;
      }
      break;
    case GroupedGemmKind::kBackwardData:  // (rows_g, k) over n
      if (rows == 0 || k == 0) return plan;
      if (n == 0) {
        plan.zero_whole_output = true;
        return plan;
      }
      break;
    case GroupedGemmKind::kBackwardWeight:  // (n, k) over rows_g
      if (n == 0 || k == 0) return plan;
      break;
  }
  const int streams = std::max(num_streams, 1);
  int64_t issued = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t group_rows = offsets[g + 1] - offsets[g];
    if (group_rows > 0) {
      plan.problems.push_back({.group = g,
                               .row_begin = offsets[g],
                               .rows = group_rows,
                               .stream = static_cast<int>(issued % streams)});
      ++issued;
    } else if (kind == GroupedGemmKind::kBackwardWeight && !accumulate) {
      // Extend the previous run when it ends here: one memset per run of empty groups.
      if (!plan.zero_groups.empty() && plan.zero_groups.back().end == g) {
        plan.zero_groups.back().end = g + 1;
      } else {
        plan.zero_groups.push_back({.begin = g, .end = g + 1});
      }
    }
  }
  plan.streams_used = static_cast<int>(std::min<int64_t>(issued, streams));
  return plan;
}

}  // namespace moetrain::ops
