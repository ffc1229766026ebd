#include "engine/comm/metered_communicator.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "engine/core/status.h"

namespace moetrain {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class MeteredRequest final : public CommRequest {
 public:
  MeteredRequest(std::unique_ptr<CommRequest> inner, CommOp op, std::shared_ptr<CommMeter> meter)
      : inner_(std::move(inner)), op_(op), meter_(std::move(meter)) {}

  absl::Status Wait() override {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = inner_->Wait();
    meter_->Add(op_, 0, 0, SecondsSince(start));
    return status;
  }

 private:
  const std::unique_ptr<CommRequest> inner_;
  const CommOp op_;
  const std::shared_ptr<CommMeter> meter_;
};

// Bytes of this rank's block and of the others' blocks together (a bad rank or count is the
// inner communicator's to reject).
std::pair<int64_t, int64_t> SplitBytes(absl::Span<const int64_t> counts, int rank, DType dtype) {
  const int64_t element = static_cast<int64_t>(DTypeSize(dtype));
  int64_t own = 0, others = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    (static_cast<int>(j) == rank ? own : others) += std::max<int64_t>(counts[j], 0) * element;
  }
  return {own, others};
}

}  // namespace

const char* CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllToAll:
      return "all_to_all";
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
  }
  return "unknown";
}

MeteredCommunicator::MeteredCommunicator(std::unique_ptr<Communicator> inner,
                                         std::shared_ptr<CommMeter> meter)
    : inner_(std::move(inner)), meter_(std::move(meter)) {}

template <typename StartFn>
absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::Metered(CommOp op,
                                                                          int64_t bytes_sent,
                                                                          int64_t bytes_received,
                                                                          StartFn start) {
  // A world of one moves nothing between ranks.
  if (size() == 1) bytes_sent = bytes_received = 0;
  const auto begin = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<CommRequest>> started = start();
  meter_->Add(op, started.ok() ? bytes_sent : 0, started.ok() ? bytes_received : 0,
              SecondsSince(begin));
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request, std::move(started));
  return std::make_unique<MeteredRequest>(std::move(request), op, meter_);
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartAllToAllV(
    const AllToAllVArgs& args) {
  const int64_t element = static_cast<int64_t>(DTypeSize(args.dtype));
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < args.send_counts.size(); ++j) {
    if (static_cast<int>(j) != rank()) sent += args.send_counts[j] * element;
  }
  for (size_t j = 0; j < args.recv_counts.size(); ++j) {
    if (static_cast<int>(j) != rank()) received += args.recv_counts[j] * element;
  }
  return Metered(CommOp::kAllToAll, sent, received, [&] { return inner_->StartAllToAllV(args); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartAllReduceSum(void* data,
                                                                                    int64_t count,
                                                                                    DType dtype) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  return Metered(CommOp::kAllReduce, bytes, bytes,
                 [&] { return inner_->StartAllReduceSum(data, count, dtype); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartAllGather(const void* send,
                                                                                 void* recv,
                                                                                 int64_t count,
                                                                                 DType dtype) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  return Metered(CommOp::kAllGather, bytes, (size() - 1) * bytes,
                 [&] { return inner_->StartAllGather(send, recv, count, dtype); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartReduceScatterSum(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  const auto [own, others] = SplitBytes(counts, rank(), dtype);
  return Metered(CommOp::kReduceScatter, others, own,
                 [&] { return inner_->StartReduceScatterSum(data, counts, dtype); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartAllGatherV(
    void* data, absl::Span<const int64_t> counts, DType dtype) {
  const auto [own, others] = SplitBytes(counts, rank(), dtype);
  return Metered(CommOp::kAllGather, own, others,
                 [&] { return inner_->StartAllGatherV(data, counts, dtype); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartBroadcast(void* data,
                                                                                 int64_t count,
                                                                                 DType dtype,
                                                                                 int root) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  const bool is_root = rank() == root;
  return Metered(CommOp::kBroadcast, is_root ? bytes : 0, is_root ? 0 : bytes,
                 [&] { return inner_->StartBroadcast(data, count, dtype, root); });
}

absl::StatusOr<std::unique_ptr<CommRequest>> MeteredCommunicator::StartBarrier() {
  return Metered(CommOp::kBarrier, 0, 0, [&] { return inner_->StartBarrier(); });
}

absl::StatusOr<std::unique_ptr<Communicator>> MeteredCommunicator::Subgroup(
    const std::vector<int>& ranks) {
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> group, inner_->Subgroup(ranks));
  return std::make_unique<MeteredCommunicator>(std::move(group), meter_);
}

}  // namespace moetrain
