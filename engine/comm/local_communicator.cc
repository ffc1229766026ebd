#include "engine/comm/local_communicator.h"

#include <cstring>
#include <memory>
#include <vector>

#include "engine/comm/comm_checks.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

OpContext Local(absl::string_view op) {
  return {.backend = "local", .op = op, .rank = 0, .size = 1};
}

// Copies `count` elements unless source and destination are the same buffer.
void CopyElements(const void* from, void* to, int64_t count, DType dtype) {
  if (count > 0 && from != to) std::memcpy(to, from, count * DTypeSize(dtype));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartAllToAllV(
    const AllToAllVArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllToAllV(Local("all_to_all_v"), args));
  CopyElements(args.send, args.recv, args.send_counts[0], args.dtype);
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartAllReduceSum(void* data,
                                                                                  int64_t count,
                                                                                  DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllReduceSum(Local("all_reduce_sum"), data, count, dtype));
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartAllGather(const void* send,
                                                                               void* recv,
                                                                               int64_t count,
                                                                               DType dtype) {
  MOETRAIN_RETURN_IF_ERROR(CheckAllGather(Local("all_gather"), send, recv, count, dtype));
  CopyElements(send, recv, count, dtype);
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartReduceScatterSum(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  int64_t total = 0;
  MOETRAIN_RETURN_IF_ERROR(
      CheckBlocks(Local("reduce_scatter_sum"), data, counts, dtype, /*summed=*/true, &total));
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartAllGatherV(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  int64_t total = 0;
  MOETRAIN_RETURN_IF_ERROR(
      CheckBlocks(Local("all_gather_v"), data, counts, dtype, /*summed=*/false, &total));
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartBroadcast(void* data,
                                                                               int64_t count,
                                                                               DType dtype,
                                                                               int root) {
  MOETRAIN_RETURN_IF_ERROR(CheckBroadcast(Local("broadcast"), data, count, dtype, root));
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<CommRequest>> LocalCommunicator::StartBarrier() {
  return CompletedRequest(absl::OkStatus());
}

absl::StatusOr<std::unique_ptr<Communicator>> LocalCommunicator::Subgroup(
    const std::vector<int>& ranks) {
  MOETRAIN_RETURN_IF_ERROR(CheckSubgroup(Local("subgroup"), ranks).status());
  return std::make_unique<LocalCommunicator>();
}

}  // namespace moetrain
