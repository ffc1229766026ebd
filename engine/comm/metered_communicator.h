// Traffic accounting for any communicator: MeteredCommunicator wraps one and tells a CommMeter, per
// operation, the bytes this rank hands to and takes from the other ranks and the time its caller
// spends in the communicator. The subgroups it makes are metered into the same meter, so wrapping
// a rank's world communicator accounts for every collective of the rank (data-parallel gradient
// sums, expert-parallel all-to-alls, the trainer's own sums).
//
//   auto world = std::make_shared<MeteredCommunicator>(std::move(gloo), meter);
//
// Bytes are the payload, not the backend's wire traffic (a ring all-reduce moves about twice its
// buffer): per call, with n ranks, e bytes per element and this rank r,
//   all-to-all   sent Σ_{j≠r} send_counts[j]·e, received Σ_{j≠r} recv_counts[j]·e
//   all-reduce   sent and received count·e
//   all-gather   sent count·e, received (n − 1)·count·e; AllGatherV: sent counts[r]·e, received
//                Σ_{j≠r} counts[j]·e
//   reduce-scatter  sent Σ_{j≠r} counts[j]·e (its values of the others' blocks), received
//                counts[r]·e (its own block, summed)
//   broadcast    the root sent count·e, every other rank received count·e
//   barrier      nothing
// and nothing at all in a world of one. Seconds are the caller's time inside Start and Wait:
// the communication it waited for, not the part that overlapped its computation.
#ifndef MOETRAIN_ENGINE_COMM_METERED_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_METERED_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace moetrain {

enum class CommOp { kAllToAll = 0, kAllReduce, kAllGather, kBroadcast, kBarrier, kReduceScatter };
inline constexpr int kNumCommOps = 6;

// "all_to_all", "all_reduce", "all_gather", "broadcast", "barrier" or "reduce_scatter".
const char* CommOpName(CommOp op);

// Where the accounting goes. Called from whichever threads use the communicators: thread-safe.
class CommMeter {
 public:
  virtual ~CommMeter() = default;
  // Once when an operation starts (its bytes and the time Start took), and once per Wait (no
  // bytes, the time Wait took).
  virtual void Add(CommOp op, int64_t bytes_sent, int64_t bytes_received, double seconds) = 0;
};

class MeteredCommunicator final : public Communicator {
 public:
  // `meter` is shared with the subgroups and the requests in flight.
  MeteredCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<CommMeter> meter);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  bool orders_after_device_work() const override { return inner_->orders_after_device_work(); }

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
  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks) override;

 private:
  // Times `started` (a call to the inner communicator's Start…), accounts it, and wraps its
  // request so that its Wait is timed too.
  template <typename StartFn>
  absl::StatusOr<std::unique_ptr<CommRequest>> Metered(CommOp op, int64_t bytes_sent,
                                                       int64_t bytes_received, StartFn start);

  const std::unique_ptr<Communicator> inner_;
  const std::shared_ptr<CommMeter> meter_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_METERED_COMMUNICATOR_H_
