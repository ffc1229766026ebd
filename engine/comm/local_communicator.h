// A world of one: every collective is a copy within this process or nothing at all. What a
// single-process CPU run uses, so that the trainer has one code path for every world size.
// Buffers are host memory.
#ifndef MOETRAIN_ENGINE_COMM_LOCAL_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_LOCAL_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace moetrain {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }

  // Each completes before it returns; the request only reports the status.
  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllToAllV(const AllToAllVArgs& args) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllReduceSum(void* data, int64_t count,
                                                                 DType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGather(const void* send, void* recv,
                                                              int64_t count, DType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartReduceScatterSum(
      void* data, absl::Span<const int64_t> counts, DType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGatherV(void* data,
                                                               absl::Span<const int64_t> counts,
                                                               DType dtype) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartBroadcast(void* data, int64_t count,
                                                              DType dtype, int root) override;
  absl::StatusOr<std::unique_ptr<CommRequest>> StartBarrier() override;

  // Subgroup({0}): another LocalCommunicator.
  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks) override;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_LOCAL_COMMUNICATOR_H_
