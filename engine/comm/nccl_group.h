// One rank's NCCL communicator with what goes with it: the stream its collectives run on, the
// lock that serialises NCCL calls on it, and the first failure, after which it is aborted and
// every later call fails. Shared by an NcclCommunicator and its requests, so a request can be
// waited for after the communicator is gone. Internal to nccl_communicator.cc; CUDA builds only.
#ifndef MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_
#define MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/comm/nccl_communicator.h"

namespace moetrain {

// OK for cudaSuccess; otherwise Internal naming `call` and the error.
absl::Status CudaStatus(cudaError_t error, absl::string_view call);
// OK for ncclSuccess and ncclInProgress (a non-blocking call under way); otherwise the code says
// what to do (Unavailable for a system or remote error: a peer or the network is gone).
absl::Status NcclStatus(ncclResult_t result, absl::string_view call, ncclComm_t comm);

// A buffer of one collective as the caller gave it.
struct NcclBuffer {
  const void* data = nullptr;
  size_t bytes = 0;
  bool read = false;     // the collective reads it
  bool written = false;  // the collective writes it
};

// Pinned host and device memory of equal size, for the host buffers of one collective at a time.
struct NcclStaging {
  void* host = nullptr;
  void* device = nullptr;
  size_t bytes = 0;
  bool in_use = false;
};

// A collective enqueued: the event after it, and where its written host buffers' results are.
struct NcclEnqueued {
  struct CopyOut {
    void* host;     // the caller's buffer
    size_t offset;  // in staging->host
    size_t bytes;
  };
  cudaEvent_t event = nullptr;
  NcclStaging* staging = nullptr;  // null when no buffer was host memory
  std::vector<CopyOut> copy_out;
};

class NcclGroup {
 public:
  // `device` holds the address to use for each buffer given to Enqueue, in order: the buffer's own
  // for device memory, its staging copy for host memory.
  using EnqueueFn = absl::FunctionRef<absl::Status(ncclComm_t comm, cudaStream_t stream,
                                                   absl::Span<void* const> device)>;

  // The CUDA device `options` name (the current one for -1): FailedPrecondition when there is no
  // usable CUDA device, InvalidArgument for an ordinal the machine does not have.
  static absl::StatusOr<int> UsableDevice(const NcclOptions& options);
  // This rank's communicator of the group whose unique id is `id`; waits for every rank to join.
  static absl::StatusOr<std::shared_ptr<NcclGroup>> Init(const ncclUniqueId& id,
                                                         const NcclOptions& options);
  // Finalises the communicator (aborts it after a failure or when that overruns the timeout).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // "nccl <op> on rank r of n (group '<prefix>')".
  std::string Describe(absl::string_view op) const;

  // Calls `enqueue` with the communicator and stream (the device current), waits until NCCL has
  // taken the calls, and returns an event recorded after them. Before the calls, the stream waits
  // for order_after_stream when any buffer is device memory, and host buffers are staged in;
  // after them, the written ones are copied back to pinned memory (Complete copies them on). A
  // failure of NCCL breaks the group.
  absl::StatusOr<NcclEnqueued> Enqueue(const std::string& what, absl::Time deadline,
                                       absl::Span<const NcclBuffer> buffers, EnqueueFn enqueue);
  // Waits for `enqueued` (AwaitEvent), then copies its written host buffers to the caller's and
  // frees its event and staging. Call once per Enqueue.
  absl::Status Complete(NcclEnqueued& enqueued, absl::Time deadline, const std::string& what);
  // Waits until `event` has passed, NCCL reports an error, or `deadline` (then the communicator
  // is aborted and the status is DeadlineExceeded).
  absl::Status AwaitEvent(cudaEvent_t event, absl::Time deadline, const std::string& what);

  // ncclCommSplit: the members of one subgroup pass the same `color`; `key` orders them.
  absl::StatusOr<std::shared_ptr<NcclGroup>> Split(int color, int key,
                                                   const NcclOptions& child_options);

  // (1) i32 on the device: what a barrier all-reduces.
  int* scratch() const { return scratch_; }

 private:
  explicit NcclGroup(NcclOptions options, int device)
      : options_(std::move(options)), device_(device) {}

  // Polls until NCCL has finished the last non-blocking call on the communicator (or reports
  // its error, or `deadline` passes).
  absl::Status AwaitReady(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `status` as the group's failure (if it is the first), aborts the communicator, and
  // returns `status`.
  absl::Status Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a call on a failed group; OK while healthy.
  absl::Status Broken(const std::string& what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stream (unless the caller gave one), the ordering event and the scratch integer.
  absl::Status AllocateResources();
  // A free staging buffer of at least `bytes` (a new one when none is), marked in use.
  absl::StatusOr<NcclStaging*> AcquireStaging(size_t bytes) ABSL_LOCKS_EXCLUDED(staging_mu_);
  void ReleaseStaging(NcclStaging* staging) ABSL_LOCKS_EXCLUDED(staging_mu_);

  const NcclOptions options_;
  const int device_;
  mutable absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;  // null once aborted
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  // Recorded on options_.order_after_stream and waited for on stream_ (null without one).
  cudaEvent_t order_event_ ABSL_GUARDED_BY(mu_) = nullptr;
  int* scratch_ = nullptr;
  // Never freed before the group: a buffer is reused once the collective that used it completed,
  // so cudaFree (which waits for the whole device) never runs while collectives are in flight.
  absl::Mutex staging_mu_;
  std::vector<std::unique_ptr<NcclStaging>> staging_ ABSL_GUARDED_BY(staging_mu_);
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_
