// Collectives over TCP through Gloo, for CPU training: host buffers, any number of processes on
// any number of machines.
//
// Ranks meet through a KeyValueStore: each publishes the addresses it listens on under
// "<prefix>/<rank>" and connects to every other rank (a full mesh of TCP connections). Each
// communicator runs its collectives one at a time, in the order they were started, on a thread of
// its own (so Start* returns at once and compute overlaps the transfer); Gloo's own event loop
// adds one more thread. Start* may be called from any thread, but every rank must start the same
// collectives in the same order, so start them from one thread.
//
// Sums are made in rank order: a reduce-scatter sends each block to its rank (an all-to-all) and
// that rank adds the n copies as ((x_0 + x_1) + x_2) + …; an all-reduce is that reduce-scatter
// over n near-equal blocks and an all-gather. So an all-reduce and a reduce-scatter of the same
// values give the same bits, whatever the block boundaries.
#ifndef MOETRAIN_ENGINE_COMM_GLOO_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_GLOO_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/comm/comm_checks.h"
#include "engine/comm/communicator.h"
#include "engine/comm/group_options.h"
#include "engine/comm/op_queue.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace moetrain {

class GlooStoreAdapter;

struct GlooOptions {
  GroupOptions group;
  // The address (or host name) this rank listens on and tells its peers. The default serves
  // ranks on one machine only; a gang spread over machines needs each rank's routable address
  // (the worker's LocalAddressToward(coordinator) is one).
  std::string listen_host = "127.0.0.1";
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group: blocks until every rank has connected, at most group.timeout (then
  // DeadlineExceeded naming the rank that did not show up).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(const GlooOptions& options);
  // Collectives started and not yet finished end with Cancelled; the one running finishes first.
  ~GlooCommunicator() override;

  int rank() const override { return options_.group.rank; }
  int size() const override { return options_.group.size; }
  std::string backend() const override { return "gloo"; }

  // A sender's send_counts[j] must equal rank j's recv_counts[sender]; Gloo cannot tell and a
  // mismatch fails the collective.
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

  // A new Gloo group (a LocalCommunicator for a group of one) meeting under
  // "<prefix>/group<n>/<ranks joined by ','>", n counting this communicator's Subgroup calls.
  // Blocks until the group's ranks have connected.
  absl::StatusOr<std::unique_ptr<Communicator>> Subgroup(const std::vector<int>& ranks) override;

 private:
  explicit GlooCommunicator(GlooOptions options);

  // Rendezvous and connect, on the queue's thread.
  absl::Status Connect();
  // Queues `body` (given a tag no other collective of this group uses) under the name `op`.
  absl::StatusOr<std::unique_ptr<CommRequest>> Submit(absl::string_view op,
                                                      std::function<void(uint32_t tag)> body);
  // The bodies of the summing collectives, on the queue's thread (bytes, `counts` in elements).
  void ReduceScatterOn(uint32_t tag, uint8_t* data, const std::vector<int64_t>& counts,
                       DType dtype);
  void AllGatherVOn(uint32_t tag, uint8_t* data, const std::vector<int64_t>& counts, DType dtype);
  // Who calls `op`, for the argument checks.
  OpContext Op(absl::string_view op) const;
  // "gloo <op> on rank r of n (group '<prefix>')": how errors start.
  std::string Describe(absl::string_view op) const;
  // The error every call returns once a collective has failed; OK while healthy.
  absl::Status Broken(absl::string_view op) const;

  const GlooOptions options_;
  // Kept for the life of the context: Gloo may consult the store after connecting.
  std::unique_ptr<GlooStoreAdapter> store_adapter_;
  std::unique_ptr<gloo::rendezvous::Store> prefix_store_;
  std::shared_ptr<gloo::Context> context_;  // touched on the queue's thread only
  uint32_t next_tag_ = 0;                   // the queue's thread only

  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // the first failure; OK while healthy
  int subgroups_made_ ABSL_GUARDED_BY(mu_) = 0;

  // Last: destroyed first, so its thread is gone before the members it uses.
  std::unique_ptr<OpQueue> queue_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_GLOO_COMMUNICATOR_H_
