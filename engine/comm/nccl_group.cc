// Compiled only into builds with NCCL (the whole file is conditional, so CPU builds skip it).
#ifdef MOETRAIN_HAVE_NCCL

#include "engine/comm/nccl_group.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

// How often a waiting host thread looks at the stream and at NCCL's error state.
constexpr absl::Duration kPollInterval = absl::Microseconds(50);
// Staged host buffers start at multiples of this (what cudaMalloc aligns to), so that NCCL gets
// addresses as aligned as a device buffer's; staging buffers are at least kMinStagingBytes, so the
// trainer's scalars and reports never make a group allocate twice.
constexpr size_t kStagingAlignment = 256;
constexpr size_t kMinStagingBytes = size_t{64} << 10;
constexpr size_t kNotStaged = ~size_t{0};

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

// Whether `data` is host memory (pageable or pinned), which NCCL cannot take, rather than memory
// the GPU `device` addresses (its own or managed memory). Memory of another GPU is an error.
absl::StatusOr<bool> IsHostMemory(const void* data, int device) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, data);
  if (error == cudaErrorInvalidValue) {
    // Runtimes before CUDA 11 call memory they do not know invalid instead of unregistered.
    cudaGetLastError();
    return true;
  }
  MOETRAIN_RETURN_IF_ERROR(CudaStatus(error, "cudaPointerGetAttributes"));
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      if (attributes.device != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("a buffer is memory of cuda:", attributes.device,
                         ", not of this rank's cuda:", device));
      }
      return false;
    case cudaMemoryTypeManaged:
      return false;
    case cudaMemoryTypeUnregistered:
    case cudaMemoryTypeHost:
      break;
  }
  return true;
}

size_t RoundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
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

absl::StatusOr<int> NcclGroup::UsableDevice(const NcclOptions& options) {
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
  return device;
}

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Init(const ncclUniqueId& id,
                                                           const NcclOptions& options) {
  const std::string what =
      absl::StrCat("nccl init of rank ", options.group.rank, " of ", options.group.size,
                   " (group '", options.group.prefix, "')");
  MOETRAIN_ASSIGN_OR_RETURN(const int device, UsableDevice(options));
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
    if (on_device && order_event_ != nullptr) cudaEventDestroy(order_event_);
    order_event_ = nullptr;
  }
  if (on_device) {
    absl::MutexLock lock(&staging_mu_);
    for (const std::unique_ptr<NcclStaging>& staging : staging_) {
      cudaFree(staging->device);
      cudaFreeHost(staging->host);
    }
    staging_.clear();
  }
  if (on_device && scratch_ != nullptr) cudaFree(scratch_);
  if (on_device && owns_stream_) cudaStreamDestroy(stream_);
}

std::string NcclGroup::Describe(absl::string_view op) const {
  return absl::StrCat("nccl ", op, " on rank ", options_.group.rank, " of ", options_.group.size,
                      " (group '", options_.group.prefix, "')");
}

absl::StatusOr<NcclEnqueued> NcclGroup::Enqueue(const std::string& what, absl::Time deadline,
                                                absl::Span<const NcclBuffer> buffers,
                                                EnqueueFn enqueue) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_RETURN_IF_ERROR(Broken(what));
  DeviceScope scope;
  MOETRAIN_RETURN_IF_ERROR(scope.Enter(device_));

  // Where each buffer lives: device buffers are used as they are, host ones get a place in one
  // staging buffer.
  std::vector<void*> device(buffers.size());
  std::vector<size_t> offsets(buffers.size(), kNotStaged);
  bool any_device = false, any_read = false;
  size_t staged = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const NcclBuffer& buffer = buffers[i];
    device[i] = const_cast<void*>(buffer.data);
    if (buffer.bytes == 0) continue;
    absl::StatusOr<bool> host = IsHostMemory(buffer.data, device_);
    if (!host.ok()) return Prefixed(what, host.status());
    if (!*host) {
      any_device = true;
      continue;
    }
    offsets[i] = staged;
    staged += RoundUp(buffer.bytes, kStagingAlignment);
    any_read = any_read || buffer.read;
  }
  NcclEnqueued enqueued;
  if (staged > 0) {
    absl::StatusOr<NcclStaging*> staging = AcquireStaging(staged);
    if (!staging.ok()) return Prefixed(what, staging.status());
    enqueued.staging = *staging;
  }

  // From here on the stream gets work: a failure breaks the group, since this rank's collective
  // may be half issued. The staging buffer goes back, as no later collective of a broken group
  // uses it.
  auto failed = [&](const absl::Status& status) -> absl::Status {
    if (enqueued.staging != nullptr) ReleaseStaging(enqueued.staging);
    if (enqueued.event != nullptr) cudaEventDestroy(enqueued.event);
    return Fail(Prefixed(what, status));
  };
  // Device buffers are read (and written) only after the ops queued on order_after_stream so far;
  // host buffers already hold their values, so they need not wait for the device.
  const auto order = static_cast<cudaStream_t>(options_.order_after_stream);
  if (any_device && order_event_ != nullptr && order != stream_) {
    absl::Status status =
        CudaStatus(cudaEventRecord(order_event_, order), "cudaEventRecord(order_after_stream)");
    if (status.ok()) {
      status = CudaStatus(cudaStreamWaitEvent(stream_, order_event_, 0), "cudaStreamWaitEvent");
    }
    if (!status.ok()) return failed(status);
  }
  // Host buffers: into pinned memory now (a copy from pageable memory on the stream would wait for
  // the stream), then one copy to the device on the stream.
  if (enqueued.staging != nullptr) {
    auto* host = static_cast<char*>(enqueued.staging->host);
    auto* dev = static_cast<char*>(enqueued.staging->device);
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (offsets[i] == kNotStaged) continue;
      device[i] = dev + offsets[i];
      if (buffers[i].read) std::memcpy(host + offsets[i], buffers[i].data, buffers[i].bytes);
      if (buffers[i].written) {
        enqueued.copy_out.push_back(
            {const_cast<void*>(buffers[i].data), offsets[i], buffers[i].bytes});
      }
    }
    if (any_read) {
      const absl::Status status = CudaStatus(
          cudaMemcpyAsync(dev, host, staged, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      if (!status.ok()) return failed(status);
    }
  }
  absl::Status status = enqueue(comm_, stream_, device);
  // NCCL must have taken the calls before anything else goes on the stream.
  if (status.ok()) status = AwaitReady(deadline);
  if (!status.ok()) return failed(status);
  if (!enqueued.copy_out.empty()) {
    status = CudaStatus(cudaMemcpyAsync(enqueued.staging->host, enqueued.staging->device, staged,
                                        cudaMemcpyDeviceToHost, stream_),
                        "cudaMemcpyAsync");
    if (!status.ok()) return failed(status);
  }
  status = CudaStatus(cudaEventCreateWithFlags(&enqueued.event, cudaEventDisableTiming),
                      "cudaEventCreate");
  if (status.ok()) status = CudaStatus(cudaEventRecord(enqueued.event, stream_), "cudaEventRecord");
  if (!status.ok()) return failed(status);
  return enqueued;
}

absl::Status NcclGroup::Complete(NcclEnqueued& enqueued, absl::Time deadline,
                                 const std::string& what) {
  absl::Status status = AwaitEvent(enqueued.event, deadline, what);
  cudaEventDestroy(enqueued.event);
  enqueued.event = nullptr;
  if (status.ok()) {
    for (const NcclEnqueued::CopyOut& copy : enqueued.copy_out) {
      std::memcpy(copy.host, static_cast<const char*>(enqueued.staging->host) + copy.offset,
                  copy.bytes);
    }
  }
  enqueued.copy_out.clear();
  // After a failure a copy into the staging buffer may still be queued behind the aborted
  // collective: the buffer stays taken (the broken group makes no more collectives anyway).
  if (enqueued.staging != nullptr && status.ok()) ReleaseStaging(enqueued.staging);
  enqueued.staging = nullptr;
  return status;
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
  if (options_.order_after_stream != nullptr) {
    absl::MutexLock lock(&mu_);
    MOETRAIN_RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming), "cudaEventCreate"));
  }
  MOETRAIN_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(int)), "cudaMalloc"));
  return CudaStatus(cudaMemset(scratch_, 0, sizeof(int)), "cudaMemset");
}

absl::StatusOr<NcclStaging*> NcclGroup::AcquireStaging(size_t bytes) {
  absl::MutexLock lock(&staging_mu_);
  NcclStaging* best = nullptr;
  for (const std::unique_ptr<NcclStaging>& staging : staging_) {
    if (staging->in_use || staging->bytes < bytes) continue;
    if (best == nullptr || staging->bytes < best->bytes) best = staging.get();
  }
  if (best == nullptr) {
    auto fresh = std::make_unique<NcclStaging>();
    fresh->bytes = std::max(kMinStagingBytes, std::bit_ceil(bytes));
    MOETRAIN_RETURN_IF_ERROR(
        CudaStatus(cudaMallocHost(&fresh->host, fresh->bytes), "cudaMallocHost(staging)"));
    const absl::Status allocated =
        CudaStatus(cudaMalloc(&fresh->device, fresh->bytes), "cudaMalloc(staging)");
    if (!allocated.ok()) {
      cudaFreeHost(fresh->host);
      return allocated;
    }
    best = fresh.get();
    staging_.push_back(std::move(fresh));
  }
  best->in_use = true;
  return best;
}

void NcclGroup::ReleaseStaging(NcclStaging* staging) {
  absl::MutexLock lock(&staging_mu_);
  staging->in_use = false;
}

}  // namespace moetrain

#endif  // MOETRAIN_HAVE_NCCL
