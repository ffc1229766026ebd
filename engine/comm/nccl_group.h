// One rank's NCCL communicator with what goes with it: the stream its collectives run on, the
// lock that serialises NCCL calls on it, and the first failure, after which it is aborted and
// every later call fails. Shared by an NcclCommunicator and its requests, so a request can be
// waited for after the communicator is gone. Internal to nccl_communicator.cc; CUDA builds only.
#ifndef MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_
#define MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/comm/nccl_communicator.h"

namespace moetrain {

// OK for cudaSuccess; otherwise Internal naming `call` and the error.
absl::Status CudaStatus(cudaError_t error, absl::string_view call);
// OK for ncclSuccess and ncclInProgress (a non-blocking call under way); otherwise the code says
// what to do (Unavailable for a system or remote error: a peer or the network is gone).
absl::Status NcclStatus(ncclResult_t result, absl::string_view call, ncclComm_t comm);

class NcclGroup {
 public:
  using EnqueueFn = absl::FunctionRef<absl::Status(ncclComm_t comm, cudaStream_t stream)>;

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
  // taken the calls, and returns an event recorded after them. A failure breaks the group.
  absl::StatusOr<cudaEvent_t> Enqueue(const std::string& what, absl::Time deadline,
                                      EnqueueFn enqueue);
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
  // The stream (unless the caller gave one) and the scratch integer.
  absl::Status AllocateResources();

  const NcclOptions options_;
  const int device_;
  mutable absl::Mutex mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_) = nullptr;  // null once aborted
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  int* scratch_ = nullptr;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_NCCL_GROUP_H_
