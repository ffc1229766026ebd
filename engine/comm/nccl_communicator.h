// Collectives over NCCL, for GPU training: buffers are device memory on the rank's GPU, or host
// memory, which is staged through device memory (see CreateNcclCommunicator).
//
// Rank 0 makes the NCCL unique id and publishes it (hex) in the KeyValueStore under
// "<prefix>/nccl_unique_id"; the others read it there and every rank initialises its NCCL
// communicator. A world of one makes its id locally and needs no store. Communicators are
// non-blocking NCCL ones, polled against the group's timeout: a peer that never joins or stops
// mid-collective makes the others fail with DeadlineExceeded (the NCCL communicator is aborted)
// instead of hanging a kernel forever. NCCL picks its network interface itself (NCCL_SOCKET_IFNAME
// and friends).
//
// This header exists in every build; without CUDA or NCCL the factory returns Unimplemented, so
// callers need no #ifdefs.
#ifndef MOETRAIN_ENGINE_COMM_NCCL_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/comm/group_options.h"

namespace moetrain {

struct NcclOptions {
  GroupOptions group;
  // The CUDA device of this rank; -1: the calling thread's current device.
  int cuda_device = -1;
  // A cudaStream_t to run the collectives on, ordered after the work already queued there; null:
  // a stream of the communicator's own (a blocking stream, so it orders after work on the legacy
  // default stream but not after other streams: synchronise those before starting a collective).
  void* cuda_stream = nullptr;
  // A cudaStream_t whose queued work every collective on device buffers waits for (the engine's
  // compute stream), through an event recorded there when the collective starts: the collective
  // reads what the ops issued before it wrote, with no host synchronisation. Null: none (the
  // caller synchronises first). Subgroups keep it.
  void* order_after_stream = nullptr;
};

// Joins the group; blocks until every rank has, at most group.timeout. Unimplemented when this
// build has no NCCL; FailedPrecondition when there is no usable CUDA device.
//
// Collectives are enqueued on the stream when started (after an event wait on
// order_after_stream when they touch device buffers); Wait blocks the host until the stream has
// passed them (or the timeout, counted from the start, has run out; then the NCCL communicator is
// aborted). AllToAllV is grouped ncclSend/ncclRecv (zero counts send nothing); AllReduceSum,
// AllGather and Broadcast are NCCL's; ReduceScatterSum and AllGatherV are ncclReduceScatter and
// ncclAllGather in place when the blocks are equal, else grouped ncclReduce / ncclBroadcast, one
// per block. NCCL chooses its own summation order: an all-reduce and a reduce-scatter of the same
// values may differ in the last bits (Gloo's do not). Subgroup is ncclCommSplit, so every rank of
// the parent must call it (as the interface requires).
//
// Host buffers (pageable or pinned, told apart by cudaPointerGetAttributes) are copied into a
// pinned staging buffer at Start, to device memory on the collective's stream, and back after it;
// Wait copies the result into the caller's buffer. They do not wait for order_after_stream: the
// host already holds their values. Meant for small buffers (scalars, counts, reports); the staging
// buffers, owned by the communicator, grow to the largest ones in flight at once.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options);

// Whether this build has the NCCL communicator.
bool NcclCommunicatorBuilt();

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_NCCL_COMMUNICATOR_H_
