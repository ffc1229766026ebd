#include "engine/comm/communicator.h"

#include <memory>

#include "engine/core/status.h"

namespace moetrain {
namespace {

absl::Status WaitFor(absl::StatusOr<std::unique_ptr<CommRequest>> started) {
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request, std::move(started));
  return request->Wait();
}

}  // namespace

absl::Status Communicator::AllToAllV(const AllToAllVArgs& args) {
  return WaitFor(StartAllToAllV(args));
}

absl::Status Communicator::AllReduceSum(void* data, int64_t count, DType dtype) {
  return WaitFor(StartAllReduceSum(data, count, dtype));
}

absl::Status Communicator::AllGather(const void* send, void* recv, int64_t count, DType dtype) {
  return WaitFor(StartAllGather(send, recv, count, dtype));
}

absl::Status Communicator::ReduceScatterSum(void* data, absl::Span<const int64_t> counts,
                                            DType dtype) {
  return WaitFor(StartReduceScatterSum(data, counts, dtype));
}

absl::Status Communicator::AllGatherV(void* data, absl::Span<const int64_t> counts, DType dtype) {
  return WaitFor(StartAllGatherV(data, counts, dtype));
}

absl::Status Communicator::Broadcast(void* data, int64_t count, DType dtype, int root) {
  return WaitFor(StartBroadcast(data, count, dtype, root));
}

absl::Status Communicator::Barrier() { return WaitFor(StartBarrier()); }

}  // namespace moetrain
