// Argument checks every communicator shares, so that each backend rejects the same calls with
// the same messages ("gloo all_to_all_v: send_counts[2] = -1 is negative").
#ifndef MOETRAIN_ENGINE_COMM_COMM_CHECKS_H_
#define MOETRAIN_ENGINE_COMM_COMM_CHECKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/comm/communicator.h"
#include "engine/core/dtype.h"

namespace moetrain {

// Who is calling: "<backend> <op>" starts every message; rank and size check the arguments.
struct OpContext {
  absl::string_view backend;  // "local", "gloo", "nccl"
  absl::string_view op;       // "all_to_all_v", "all_reduce_sum", ...
  int rank = 0;
  int size = 1;
};

// Counts: one per rank, none negative; buffers: non-null where their count is positive, send and
// recv disjoint; this rank's own chunk the same length on both sides.
absl::Status CheckAllToAllV(const OpContext& context, const AllToAllVArgs& args);
// count ≥ 0, data non-null when count > 0, dtype f32, bf16, i32 or i64.
absl::Status CheckAllReduceSum(const OpContext& context, const void* data, int64_t count,
                               DType dtype);
// count ≥ 0; send and recv non-null when count > 0; send outside recv.
absl::Status CheckAllGather(const OpContext& context, const void* send, const void* recv,
                            int64_t count, DType dtype);
// Counts: one per rank, none negative; data non-null when they sum to more than 0; in *total their
// sum. A reduce-scatter's dtype must be f32, bf16, i32 or i64 (`summed`).
absl::Status CheckBlocks(const OpContext& context, const void* data,
                         absl::Span<const int64_t> counts, DType dtype, bool summed,
                         int64_t* total);
// count ≥ 0, data non-null when count > 0, 0 ≤ root < size.
absl::Status CheckBroadcast(const OpContext& context, const void* data, int64_t count, DType dtype,
                            int root);
// `ranks` ascending, inside [0, size), containing this rank: this rank's index in it.
absl::StatusOr<int> CheckSubgroup(const OpContext& context, const std::vector<int>& ranks);

// A request that is already complete with `status`: what a no-op or a copy returns.
std::unique_ptr<CommRequest> CompletedRequest(absl::Status status);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_COMM_CHECKS_H_
