#include <algorithm>
#include <array>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cublaslt_api.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/core/status.h"

namespace moetrain::cuda {
namespace {

constexpr int kMaxDevices = 64;

// Makes `ordinal` the calling thread's current device for its lifetime, then restores the one
// before: the allocator may be called from a thread that drives another device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    error_ = previous_ == ordinal ? cudaSuccess : cudaSetDevice(ordinal);
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && error_ == cudaSuccess) cudaSetDevice(previous_);
  }
  cudaError_t error() const { return error_; }

 private:
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

// cudaMalloc on one device; ResourceExhausted for out-of-memory so that the allocator frees its
// cache and retries.
class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int ordinal) : ordinal_(ordinal) {}

  absl::StatusOr<void*> Malloc(size_t bytes) override {
    const ScopedDevice device(ordinal_);
    MOETRAIN_CUDA_RETURN_IF_ERROR("device allocation", device.error());
    void* p = nullptr;
    const cudaError_t error = cudaMalloc(&p, bytes);
    if (error != cudaSuccess) {
      return CudaStatus(error, "device allocation", absl::StrCat("cudaMalloc(", bytes, ")"));
    }
    return p;
  }
  void Free(void* p) override {
    const ScopedDevice device(ordinal_);
    cudaFree(p);  // an error here is one of an earlier kernel: it shows at the next sync
  }
  size_t FreeBytes() override {
    const ScopedDevice device(ordinal_);
    size_t free_bytes = 0, total_bytes = 0;
    if (device.error() != cudaSuccess || cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return free_bytes;
  }
  void WaitForDevice() override {
    const ScopedDevice device(ordinal_);
    cudaDeviceSynchronize();  // an error is a kernel's: it shows at the next sync
  }

 private:
  const int ordinal_;
};

absl::Mutex contexts_mu(absl::kConstInit);

}  // namespace

absl::StatusOr<CudaContext*> CudaContext::Get(int ordinal) {
  static std::array<CudaContext*, kMaxDevices> contexts ABSL_GUARDED_BY(contexts_mu) = {};
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", ordinal, " is out of range [0, ", kMaxDevices, ")"));
  }
  absl::MutexLock lock(&contexts_mu);
  if (contexts[ordinal] != nullptr) return contexts[ordinal];
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("device cuda:", ordinal,
                     ": no usable GPU (cudaGetDeviceCount failed: ", cudaGetErrorName(error), ")"));
  }
  if (ordinal >= count) {
    return absl::UnavailableError(
        absl::StrCat("device cuda:", ordinal, ": this machine has ", count, " CUDA device(s)"));
  }
  std::unique_ptr<CudaContext> context(new CudaContext(ordinal));
  MOETRAIN_RETURN_IF_ERROR(context->Init());
  contexts[ordinal] = context.release();
  return contexts[ordinal];
}

absl::Status CudaContext::Init() {
  constexpr const char* kOp = "CUDA context";
  MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaSetDevice(ordinal_));
  MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaGetDeviceProperties(&properties_, ordinal_));
  MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  for (cudaStream_t& side : side_) {
    MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  }
  {
    absl::MutexLock lock(&event_mu_);
    MOETRAIN_CUDA_RETURN_IF_ERROR(kOp,
                                  cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  }
  MOETRAIN_RETURN_IF_ERROR(LoadCublasLt());
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(kOp, Lt().cublasLtCreate(&cublaslt_));
  for (void*& workspace : workspaces_) {
    MOETRAIN_CUDA_RETURN_IF_ERROR(kOp, cudaMalloc(&workspace, kCublasWorkspaceBytes));
  }
  allocator_ =
      std::make_unique<CachingAllocator>(device(), std::make_unique<CudaDeviceMemory>(ordinal_));
  return absl::OkStatus();
}

CudaContext::~CudaContext() {
  cudaSetDevice(ordinal_);
  allocator_.reset();
  for (void* workspace : workspaces_) {
    if (workspace != nullptr) cudaFree(workspace);
  }
  if (cublaslt_ != nullptr) Lt().cublasLtDestroy(cublaslt_);
  {
    absl::MutexLock lock(&event_mu_);
    if (order_event_ != nullptr) cudaEventDestroy(order_event_);
  }
  for (cudaStream_t stream : side_) {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  if (comm_ != nullptr) cudaStreamDestroy(comm_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
  {
    absl::MutexLock lock(&staging_mu_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
  }
  cudaGetLastError();
}

absl::Status CudaContext::MakeCurrent(std::string_view op) const {
  int current = -1;
  MOETRAIN_CUDA_RETURN_IF_ERROR(op, cudaGetDevice(&current));
  if (current != ordinal_) MOETRAIN_CUDA_RETURN_IF_ERROR(op, cudaSetDevice(ordinal_));
  return absl::OkStatus();
}

absl::Status CudaContext::Synchronize() {
  MOETRAIN_RETURN_IF_ERROR(MakeCurrent("synchronize"));
  MOETRAIN_CUDA_RETURN_IF_ERROR("synchronize", cudaStreamSynchronize(compute_));
  return absl::OkStatus();
}

DeviceMemoryStats CudaContext::memory_stats() const {
  const CachingAllocatorStats stats = allocator_->stats();
  return {.in_use_bytes = stats.allocated_bytes,
          .peak_bytes = stats.peak_allocated_bytes,
          .reserved_bytes = stats.reserved_bytes,
          .total_bytes = static_cast<int64_t>(properties_.totalGlobalMem)};
}

void CudaContext::ResetPeakMemory() { allocator_->ResetPeak(); }

absl::Status CudaContext::StreamWait(cudaStream_t waiter, cudaStream_t signaler) {
  absl::MutexLock lock(&event_mu_);
  // The wait captures the event's state at this call, so one event serves every ordering.
  MOETRAIN_CUDA_RETURN_IF_ERROR("stream wait", cudaEventRecord(order_event_, signaler));
  MOETRAIN_CUDA_RETURN_IF_ERROR("stream wait", cudaStreamWaitEvent(waiter, order_event_, 0));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaContext::PinnedStaging(size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  const size_t grown = std::max(bytes, std::max<size_t>(2 * staging_bytes_, 4096));
  if (staging_ != nullptr) {
    // A copy into the old buffer may still be queued.
    MOETRAIN_RETURN_IF_ERROR(Synchronize());
    MOETRAIN_CUDA_RETURN_IF_ERROR("pinned staging", cudaFreeHost(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  MOETRAIN_CUDA_RETURN_IF_ERROR("pinned staging", cudaMallocHost(&staging_, grown));
  staging_bytes_ = grown;
  return staging_;
}

absl::StatusOr<DeviceRuntime*> OpenCudaRuntime(int ordinal) {
  absl::StatusOr<CudaContext*> context = CudaContext::Get(ordinal);
  if (!context.ok()) return context.status();
  return *context;
}

}  // namespace moetrain::cuda
