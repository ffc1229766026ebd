// One CUDA device as the engine uses it: created once per process per device ordinal (each rank
// of a worker owns one device), never destroyed.
//
// - Streams: the compute stream runs every op, in issue order; the communication stream is for
//   the collectives of a communicator; kNumSideStreams side streams let an op run independent
//   work side by side (grouped GEMM's experts). All are non-blocking (they never wait for the
//   legacy default stream). Ordering between streams goes through StreamWait (an event).
// - Memory: a CachingAllocator over cudaMalloc, stream-ordered on the compute stream; a pinned
//   host staging buffer for what must reach the host (the expert counts, the losses).
// - cuBLASLt: one handle, and one workspace per stream that runs cuBLASLt calls (the compute
//   stream and each side stream), so that concurrent GEMMs never share scratch memory.
//
// Every method is safe from any thread; ops issued from two threads onto one compute stream run
// in whichever order they were issued.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CONTEXT_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CONTEXT_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/cuda/caching_allocator.h"
#include "engine/backend/device_runtime.h"
#include "engine/backend/exec_context.h"

namespace moetrain::cuda {

class CudaContext final : public DeviceRuntime {
 public:
  static constexpr int kNumSideStreams = 4;
  // cuBLASLt's scratch per stream: enough for its Hopper GEMM kernels (split-K included).
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

  // The process-wide context of device `ordinal` (see cuda_backend.h for the errors).
  static absl::StatusOr<CudaContext*> Get(int ordinal);
  // Only a context whose Init failed is destroyed (Get's did not): it returns what Init created.
  ~CudaContext() override;

  Device device() const override { return Device::Cuda(ordinal_); }
  Allocator& allocator() override { return *allocator_; }
  CachingAllocator& caching_allocator() { return *allocator_; }
  // Waits for the compute stream (and so for every op issued on it).
  absl::Status Synchronize() override;
  DeviceMemoryStats memory_stats() const override;
  void ResetPeakMemory() override;
  void* compute_stream_handle() const override { return compute_; }
  void* comm_stream_handle() const override { return comm_; }

  // Makes this device the calling thread's current one (each op does before it issues work: a
  // process may drive several devices from several threads).
  absl::Status MakeCurrent(std::string_view op) const;

  int ordinal() const { return ordinal_; }
  const cudaDeviceProp& properties() const { return properties_; }
  int multiprocessors() const { return properties_.multiProcessorCount; }

  cudaStream_t compute_stream() const { return compute_; }
  cudaStream_t comm_stream() const { return comm_; }
  cudaStream_t side_stream(int i) const { return side_[i]; }
  // `waiter` waits for everything issued on `signaler` so far (a recorded event; the host does
  // not wait).
  absl::Status StreamWait(cudaStream_t waiter, cudaStream_t signaler);

  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  // The cuBLASLt workspace (kCublasWorkspaceBytes) of the compute stream (index 0) or of side
  // stream i (index 1 + i).
  void* cublas_workspace(int stream_index) const { return workspaces_[stream_index]; }

  // A pinned host buffer of at least `bytes`, grown on demand, for copies that must reach the
  // host: the caller copies into it on the compute stream, synchronises, then reads it. One
  // buffer per context: callers hold staging_mutex() from the copy until they have read it.
  absl::StatusOr<void*> PinnedStaging(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(staging_mu_);
  absl::Mutex& staging_mutex() ABSL_LOCK_RETURNED(staging_mu_) { return staging_mu_; }

 private:
  explicit CudaContext(int ordinal) : ordinal_(ordinal) {}
  absl::Status Init();

  const int ordinal_;
  cudaDeviceProp properties_{};
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_ = nullptr;
  cudaStream_t side_[kNumSideStreams] = {};
  absl::Mutex event_mu_;
  cudaEvent_t order_event_ ABSL_GUARDED_BY(event_mu_) = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* workspaces_[1 + kNumSideStreams] = {};
  std::unique_ptr<CachingAllocator> allocator_;
  absl::Mutex staging_mu_;
  void* staging_ ABSL_GUARDED_BY(staging_mu_) = nullptr;
  size_t staging_bytes_ ABSL_GUARDED_BY(staging_mu_) = 0;
};

// The CUDA context of `ctx`, whose device must be a CUDA device (every CUDA op's dispatch
// checks that before it calls into the backend).
inline CudaContext& ContextOf(const ExecContext& ctx) {
  return *static_cast<CudaContext*>(ctx.runtime());
}

}  // namespace moetrain::cuda

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_CUDA_CONTEXT_H_
