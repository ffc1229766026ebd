// Collectives among the ranks of one job: the Communicator interface and the rendezvous store the
// ranks find each other through.
//
// Every rank of a group calls the same collectives in the same order (an asynchronous one counts
// where it is started, not where it is waited for). Buffers are host memory for the local and Gloo
// communicators; NCCL takes device memory on its rank's GPU and host memory too (small host buffers
// such as scalars and counts: it stages them through device memory of its own). Every buffer must
// stay alive and untouched until the operation's Wait returns. A failed or timed-out collective
// fails with a Status (DeadlineExceeded for a timeout, Unavailable for a lost peer); the
// communicator is then broken and every later call fails too, so a gang whose rank died fails
// within the timeout instead of hanging.
#ifndef MOETRAIN_ENGINE_COMM_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/core/dtype.h"

namespace moetrain {

// Where ranks meet: the coordinator's per-attempt key/value API in a job, a directory in tests.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to `timeout` for some rank to set it (DeadlineExceeded naming
  // the key when none does).
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

// An operation in flight. Wait returns once it is complete (its output readable, its input
// reusable) or has failed; a second Wait returns the same status.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual absl::Status Wait() = 0;
};

struct AllToAllVArgs {
  const void* send = nullptr;        // Σ send_counts elements, rank by rank
  std::vector<int64_t> send_counts;  // (size) elements for each destination rank
  void* recv = nullptr;              // Σ recv_counts elements, rank by rank
  std::vector<int64_t> recv_counts;  // (size) elements from each source rank
  DType dtype = DType::kF32;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "local", "gloo" or "nccl"

  // Whether a collective started on this communicator reads its device buffers only after the
  // device work queued before the Start call has written them (NCCL with an order_after_stream:
  // the collective's stream waits for an event on the compute stream). When false, the caller
  // synchronises its ExecContext before starting a collective on device memory. Either way, Wait
  // returns only once the collective is done, so ops issued after Wait see its results.
  virtual bool orders_after_device_work() const { return false; }

  // All-to-all with per-rank counts; send and recv must not overlap.
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartAllToAllV(
      const AllToAllVArgs& args) = 0;
  // Sum of `count` elements over all ranks, in place. dtype: f32, bf16, i32 or i64. A bf16 sum's
  // precision is the backend's: Gloo widens every rank's values to f32, adds them in rank order
  // and rounds the sum once to bf16 (to nearest even); NCCL adds in bf16 in its own order.
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartAllReduceSum(void* data, int64_t count,
                                                                         DType dtype) = 0;
  // recv (size · count elements) ← every rank's send (count elements), in rank order.
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGather(const void* send, void* recv,
                                                                      int64_t count,
                                                                      DType dtype) = 0;
  // A sum over the ranks that each rank keeps a block of. `data` holds Σ counts elements, block r
  // (rank r's) at offset Σ_{q<r} counts[q]; `counts` has one entry per rank, none negative, the
  // same on every rank. After Wait this rank's block holds the sum over the ranks of their values
  // of that block; the other blocks hold unspecified values (scratch). dtype: f32, bf16, i32 or
  // i64, summed as StartAllReduceSum sums them.
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartReduceScatterSum(
      void* data, absl::Span<const int64_t> counts, DType dtype) = 0;
  // Its inverse, in place: `data` and `counts` as above; after Wait every block holds what its
  // rank had in it at Start (this rank's block is only read).
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartAllGatherV(
      void* data, absl::Span<const int64_t> counts, DType dtype) = 0;
  // data (count elements) ← root's data.
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartBroadcast(void* data, int64_t count,
                                                                      DType dtype, int root) = 0;
  virtual absl::StatusOr<std::unique_ptr<CommRequest>> StartBarrier() = 0;

  // A communicator over the ranks `ranks` (ascending ranks of this one, this rank among them),
  // called by every rank of this communicator in the same order, each naming the group it joins.
  // The new group's rank r is ranks[r]. Groups made this way are independent of this one.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks) = 0;

  // Blocking forms: start, then wait.
  absl::Status AllToAllV(const AllToAllVArgs& args);
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype);
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype);
  absl::Status ReduceScatterSum(void* data, absl::Span<const int64_t> counts, DType dtype);
  absl::Status AllGatherV(void* data, absl::Span<const int64_t> counts, DType dtype);
  absl::Status Broadcast(void* data, int64_t count, DType dtype, int root);
  absl::Status Barrier();
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_COMMUNICATOR_H_
