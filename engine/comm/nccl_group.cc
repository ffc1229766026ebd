// Compiled only into builds with NCCL (the whole file is conditional, so CPU builds skip it).
#ifdef MOETRAIN_HAVE_NCCL

#include "engine/comm/nccl_group.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

// How often a waiting host thread looks at the stream and at NCCL's error state.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);

// Makes `device` current for the scope and restores the previous one after.
class DeviceScope {
 public:
  absl::Status Enter(int device) {
    MOETRAIN_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous_), "cudaGetDevice"));
    if (previous_ == device) return absl::OkStatus();
    MOETRAIN_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
    restore_ = true;
    return absl::OkStatus();
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Calls return at once and the communicator is polled, so a missing peer is a timeout rather
  // than a hang inside NCCL.
  config.blocking = 0;
  return config;
}

absl::Status Prefixed(absl::string_view what, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view call, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const std::string message = absl::StrCat(call, " failed: ", ncclGetErrorString(result), " (",
                                           ncclGetLastError(comm), ")");
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Init(const ncclUniqueId& id,
                                                           const NcclOptions& options) {
  const std::string what =
      absl::StrCat("nccl init of rank ", options.group.rank, " of ", options.group.size,
                   " (group '", options.group.prefix, "')");
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky error for later CUDA calls
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": no usable CUDA device (",
                     counted == cudaSuccess ? "none found" : cudaGetErrorString(counted), ")"));
  }
  int device = options.cuda_device;
  if (device < 0) MOETRAIN_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  if (device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cuda_device = ", device,
                                                   " but this machine has ", devices, " devices"));
  }
  std::shared_ptr<NcclGroup> group(new NcclGroup(options, device));
  DeviceScope scope;
  MOETRAIN_RETURN_IF_ERROR(scope.Enter(device));
  {
    absl::MutexLock lock(&group->mu_);
    ncclConfig_t config = NonBlockingConfig();
    absl::Status status = NcclStatus(
        ncclCommInitRankConfig(&group->comm_, options.group.size, id, options.group.rank, &config),
        "ncclCommInitRankConfig", group->comm_);
    if (status.ok() && group->comm_ != nullptr) {
      status = group->AwaitReady(absl::Now() + options.group.timeout);
    }
    if (!status.ok()) return group->Fail(Prefixed(what, status));
  }
  MOETRAIN_RETURN_IF_ERROR(group->AllocateResources());
  return group;
}

NcclGroup::~NcclGroup() {
  DeviceScope scope;
  const bool on_device = scope.Enter(device_).ok();
  {
    absl::MutexLock lock(&mu_);
    if (comm_ != nullptr && failure_.ok()) {
      // Finalize flushes NCCL's outstanding work; it is non-blocking, so bound it too.
      absl::Status status = NcclStatus(ncclCommFinalize(comm_), "ncclCommFinalize", comm_);
      if (status.ok()) status = AwaitReady(absl::Now() + options_.group.timeout);
      if (!status.ok()) Fail(status).IgnoreError();
    }
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    comm_ = nullptr;
  }
  if (on_device && scratch_ != nullptr) cudaFree(scratch_);
  if (on_device && owns_stream_) cudaStreamDestroy(stream_);
}

std::string NcclGroup::Describe(absl::string_view op) const {
  return absl::StrCat("nccl ", op, " on rank ", options_.group.rank, " of ", options_.group.size,
                      " (group '", options_.group.prefix, "')");
}

absl::StatusOr<cudaEvent_t> NcclGroup::Enqueue(const std::string& what, absl::Time deadline,
                                               EnqueueFn enqueue) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_RETURN_IF_ERROR(Broken(what));
  DeviceScope scope;
  MOETRAIN_RETURN_IF_ERROR(scope.Enter(device_));
  absl::Status status = enqueue(comm_, stream_);
  if (status.ok()) status = AwaitReady(deadline);
  if (!status.ok()) return Fail(Prefixed(what, status));
  cudaEvent_t event = nullptr;
  MOETRAIN_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
  status = CudaStatus(cudaEventRecord(event, stream_), "cudaEventRecord");
  if (!status.ok()) {
    cudaEventDestroy(event);
    return status;
  }
  return event;
}

absl::Status NcclGroup::AwaitEvent(cudaEvent_t event, absl::Time deadline,
                                   const std::string& what) {
  for (;;) {
    const cudaError_t queried = cudaEventQuery(event);
    if (queried == cudaSuccess) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      if (queried != cudaErrorNotReady) {
        return Fail(CudaStatus(queried, absl::StrCat(what, ": cudaEventQuery")));
      }
      // Another request's failure aborted the communicator: this one will not finish either.
      MOETRAIN_RETURN_IF_ERROR(Broken(what));
      ncclResult_t async = ncclSuccess;
      absl::Status status =
          NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
      if (status.ok()) status = NcclStatus(async, "NCCL's asynchronous error check", comm_);
      if (status.ok() && absl::Now() > deadline) {
        status = absl::DeadlineExceededError(
            absl::StrCat("did not complete within ", absl::FormatDuration(options_.group.timeout),
                         " (a peer stopped or never started it); the communicator is aborted"));
      }
      if (!status.ok()) return Fail(Prefixed(what, status));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Split(int color, int key,
                                                            const NcclOptions& child_options) {
  const std::string what = Describe("subgroup");
  std::shared_ptr<NcclGroup> child(new NcclGroup(child_options, device_));
  {
    absl::MutexLock lock(&mu_);
    MOETRAIN_RETURN_IF_ERROR(Broken(what));
    DeviceScope scope;
    MOETRAIN_RETURN_IF_ERROR(scope.Enter(device_));
    const absl::Time deadline = absl::Now() + options_.group.timeout;
    ncclConfig_t config = NonBlockingConfig();
    absl::MutexLock child_lock(&child->mu_);
    absl::Status status = NcclStatus(ncclCommSplit(comm_, color, key, &child->comm_, &config),
                                     "ncclCommSplit", comm_);
    if (status.ok()) status = AwaitReady(deadline);
    if (status.ok() && child->comm_ != nullptr) status = child->AwaitReady(deadline);
    if (!status.ok()) {
      child->Fail(Prefixed(what, status)).IgnoreError();
      return Fail(Prefixed(what, status));
    }
    int count = 0, user_rank = -1;
    MOETRAIN_RETURN_IF_ERROR(
        NcclStatus(ncclCommCount(child->comm_, &count), "ncclCommCount", comm_));
    MOETRAIN_RETURN_IF_ERROR(
        NcclStatus(ncclCommUserRank(child->comm_, &user_rank), "ncclCommUserRank", comm_));
    if (count != child_options.group.size || user_rank != child_options.group.rank) {
      return child->Fail(absl::InternalError(absl::StrCat(
          what, ": ncclCommSplit made rank ", user_rank, " of ", count, ", expected rank ",
          child_options.group.rank, " of ", child_options.group.size,
          " (did every rank call Subgroup in the same order?)")));
    }
  }
  MOETRAIN_RETURN_IF_ERROR(child->AllocateResources());
  return child;
}

absl::Status NcclGroup::AwaitReady(absl::Time deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    MOETRAIN_RETURN_IF_ERROR(
        NcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", comm_));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, "a non-blocking NCCL call", comm_);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("did not complete within ", absl::FormatDuration(options_.group.timeout),
                       " (did every rank join and start the same collectives?)"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::Status NcclGroup::Fail(absl::Status status) {
  if (failure_.ok()) failure_ = status;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return status;
}

absl::Status NcclGroup::Broken(const std::string& what) const {
  if (failure_.ok()) return absl::OkStatus();
  return absl::Status(
      failure_.code(),
      absl::StrCat(what, ": the communicator failed earlier: ", failure_.message()));
}

absl::Status NcclGroup::AllocateResources() {
  DeviceScope scope;
  MOETRAIN_RETURN_IF_ERROR(scope.Enter(device_));
  if (options_.cuda_stream != nullptr) {
    stream_ = static_cast<cudaStream_t>(options_.cuda_stream);
  } else {
    MOETRAIN_RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream_), "cudaStreamCreate"));
    owns_stream_ = true;
  }
  MOETRAIN_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(int)), "cudaMalloc"));
  return CudaStatus(cudaMemset(scratch_, 0, sizeof(int)), "cudaMemset");
}

}  // namespace moetrain

#endif  // MOETRAIN_HAVE_NCCL
