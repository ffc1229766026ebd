// The CUDA side of elementwise.h: one grid-stride kernel per op over the flat element index
// (int64: a tensor may hold more than 2^31 elements), each element computed by the shared
// per-element math (dtype_math.h, philox_math.h), so results match the CPU's bits (FillNormal
// up to the device's logf/cosf, see philox_math.h). Copies that touch the host synchronise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/allocator.h"
#include "engine/core/dtype.h"
#include "engine/core/dtype_math.h"
#include "engine/core/philox_math.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/elementwise/elementwise_cpu.h"
#include "engine/ops/elementwise/elementwise_cuda.h"

namespace moetrain::ops::cuda {
namespace {

// A device-to-host copy into pageable memory goes through the context's pinned staging buffer
// in pieces of at most this size, so that a large tensor (a checkpoint's) does not grow the
// pinned buffer to its own size.
constexpr size_t kStagingChunkBytes = size_t{64} << 20;

// dst (n) bf16 bits = src (n) f32, rounded to nearest even.
__global__ void F32ToBF16Kernel(const float* __restrict__ src, uint16_t* __restrict__ dst,
                                int64_t n) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) dst[i] = FloatToBF16Bits(src[i]);
}

// dst (n) f32 = src (n) bf16 bits (exact).
__global__ void BF16ToF32Kernel(const uint16_t* __restrict__ src, float* __restrict__ dst,
                                int64_t n) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) dst[i] = BF16BitsToFloat(src[i]);
}

// out (n) f32 = a (n) f32 + b (n) act. out may be a, hence no __restrict__ on either.
template <typename B>
__global__ void AddKernel(const float* a, const B* __restrict__ b, float* out, int64_t n) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) out[i] = a[i] + LoadAct(b, i);
}

// t (n) = value: the value arrives already converted to T on the host, exactly as the CPU does.
template <typename T>
__global__ void FillKernel(T* __restrict__ t, T value, int64_t n) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) t[i] = value;
}

// t (n) f32: element j = normal value j of the stream. One thread per Philox block, which holds
// values 2b and 2b + 1 (the second absent when n is odd).
__global__ void FillNormalKernel(float* __restrict__ t, int64_t n, PhiloxStream stream, float mean,
                                 float stddev) {
  const int64_t blocks = (n + 1) / 2;
  for (int64_t b = GridStart(); b < blocks; b += GridStride()) {
    const PhiloxWords words = PhiloxStreamBlock(stream, static_cast<uint64_t>(b));
    t[2 * b] = PhiloxNormalOfBlock(words, 0, mean, stddev);
    if (2 * b + 1 < n) t[2 * b + 1] = PhiloxNormalOfBlock(words, 1, mean, stddev);
  }
}

int Blocks(const CudaOp& op, int64_t items) {
  return static_cast<int>(GridStrideBlocks(items, op.context->multiprocessors()));
}

size_t Bytes(const TensorView& t) { return static_cast<size_t>(t.numel()) * DTypeSize(t.dtype()); }

// Whether `p` is page-locked host memory (cudaMallocHost or registered), which the DMA engines
// can write directly. It only picks the faster path: both paths synchronise before returning.
bool IsPinnedHost(const void* p) {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    // Not fatal (we then stage), but do not leave the error for the next launch check to find.
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

// `bytes` from device `src` to host `dst`, complete on return (the caller reads dst next).
absl::Status CopyDeviceToHost(const CudaOp& op, const void* src, void* dst, size_t bytes) {
  if (IsPinnedHost(dst)) {
    MOETRAIN_CUDA_RETURN_IF_ERROR(
        "copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, op.stream));
    MOETRAIN_CUDA_RETURN_IF_ERROR("copy", cudaStreamSynchronize(op.stream));
    return absl::OkStatus();
  }
  ::moetrain::cuda::CudaContext& context = *op.context;
  // Held until the last piece is out of the staging buffer: it is the context's only one.
  absl::MutexLock lock(&context.staging_mutex());
  const size_t chunk = std::min(bytes, kStagingChunkBytes);
  MOETRAIN_ASSIGN_OR_RETURN(void* staging, context.PinnedStaging(chunk));
  for (size_t done = 0; done < bytes; done += chunk) {
    const size_t part = std::min(chunk, bytes - done);
    MOETRAIN_CUDA_RETURN_IF_ERROR(
        "copy", cudaMemcpyAsync(staging, static_cast<const char*>(src) + done, part,
                                cudaMemcpyDeviceToHost, op.stream));
    MOETRAIN_CUDA_RETURN_IF_ERROR("copy", cudaStreamSynchronize(op.stream));
    std::memcpy(static_cast<char*>(dst) + done, staging, part);
  }
  return absl::OkStatus();
}

// Host `src` (any strides) to dense device `dst`. Synchronises before returning: the caller may
// free or overwrite src at once (a pageable source, and the gathered copy of a strided one,
// would otherwise still be read by the DMA after this returns).
absl::Status CopyHostToDevice(const CudaOp& op, const TensorView& src, void* dst) {
  Tensor gathered;
  const void* host = src.raw();
  if (!src.is_contiguous()) {
    MOETRAIN_ASSIGN_OR_RETURN(gathered, Tensor::Allocate(CpuAllocator(), src.dtype(), src.shape()));
    ::moetrain::cpu::CopyToDense(src, gathered);
    host = gathered.view().raw();
  }
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "copy", cudaMemcpyAsync(dst, host, Bytes(src), cudaMemcpyHostToDevice, op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR("copy", cudaStreamSynchronize(op.stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status FillWith(const CudaOp& op, const TensorView& t, T value) {
  const int64_t n = t.numel();
  // Zeroing (the gradients, every step) is a memset, the fastest fill there is.
  const T zero{};
  if (std::memcmp(&value, &zero, sizeof(T)) == 0) {
    MOETRAIN_CUDA_RETURN_IF_ERROR("fill", cudaMemsetAsync(t.raw(), 0, Bytes(t), op.stream));
    return absl::OkStatus();
  }
  FillKernel<T>
      <<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(static_cast<T*>(t.raw()), value, n);
  MOETRAIN_CUDA_CHECK_LAUNCH("fill");
  return absl::OkStatus();
}

}  // namespace

absl::Status ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst) {
  const int64_t n = src.numel();
  if (n == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "convert"));
  if (src.dtype() == dst.dtype()) {
    if (src.raw() == dst.raw()) return absl::OkStatus();
    MOETRAIN_CUDA_RETURN_IF_ERROR("convert", cudaMemcpyAsync(dst.raw(), src.raw(), Bytes(src),
                                                             cudaMemcpyDeviceToDevice, op.stream));
    return absl::OkStatus();
  }
  if (src.dtype() == DType::kF32) {
    F32ToBF16Kernel<<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
        static_cast<const float*>(src.raw()), static_cast<uint16_t*>(dst.raw()), n);
  } else {
    BF16ToF32Kernel<<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
        static_cast<const uint16_t*>(src.raw()), static_cast<float*>(dst.raw()), n);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("convert");
  return absl::OkStatus();
}

absl::Status CopyTensor(const ExecContext& ctx, TensorView src, TensorView dst) {
  if (src.numel() == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "copy"));
  const bool src_host = src.device().is_cpu(), dst_host = dst.device().is_cpu();
  if (src_host && dst_host) {
    ::moetrain::cpu::CopyToDense(src, dst);
    return absl::OkStatus();
  }
  if (src_host) return CopyHostToDevice(op, src, dst.raw());
  if (dst_host) return CopyDeviceToHost(op, src.raw(), dst.raw(), Bytes(src));
  if (src.raw() == dst.raw()) return absl::OkStatus();
  MOETRAIN_CUDA_RETURN_IF_ERROR("copy", cudaMemcpyAsync(dst.raw(), src.raw(), Bytes(src),
                                                        cudaMemcpyDeviceToDevice, op.stream));
  return absl::OkStatus();
}

absl::Status CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                         int64_t dst_col, int64_t cols) {
  const int64_t rows = src.dim(0), bytes = DTypeSize(src.dtype());
  if (rows == 0 || cols == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "copy columns"));
  // One strided copy: `rows` rows of cols·bytes, each at its tensor's row pitch.
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "copy columns",
      cudaMemcpy2DAsync(static_cast<char*>(dst.raw()) + dst_col * bytes,
                        static_cast<size_t>(dst.dim(1) * bytes),
                        static_cast<const char*>(src.raw()) + src_col * bytes,
                        static_cast<size_t>(src.dim(1) * bytes), static_cast<size_t>(cols * bytes),
                        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, op.stream));
  return absl::OkStatus();
}

absl::Status Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out) {
  const int64_t n = a.numel();
  if (n == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "add"));
  const float* a_data = static_cast<const float*>(a.raw());
  float* out_data = static_cast<float*>(out.raw());
  if (b.dtype() == DType::kBF16) {
    AddKernel<uint16_t><<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
        a_data, static_cast<const uint16_t*>(b.raw()), out_data, n);
  } else {
    AddKernel<float><<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
        a_data, static_cast<const float*>(b.raw()), out_data, n);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("add");
  return absl::OkStatus();
}

absl::Status Fill(const ExecContext& ctx, TensorView t, float value) {
  if (t.numel() == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "fill"));
  // The conversions of cpu::Fill, on the host, so that the device stores the same bits.
  switch (t.dtype()) {
    case DType::kF32:
      return FillWith<float>(op, t, value);
    case DType::kBF16:
      return FillWith<uint16_t>(op, t, FloatToBF16(value).bits);
    case DType::kI32:
      return FillWith<int32_t>(op, t, static_cast<int32_t>(value));
    case DType::kI64:
      return FillWith<int64_t>(op, t, static_cast<int64_t>(value));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("fill: no CUDA fill for ", t.DebugString()));  // refused by ops::Fill
  }
}

absl::Status FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean,
                        float stddev) {
  const int64_t n = t.numel();
  if (n == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "fill normal"));
  const int64_t philox_blocks = (n + 1) / 2;
  FillNormalKernel<<<Blocks(op, philox_blocks), kThreadsPerBlock, 0, op.stream>>>(
      static_cast<float*>(t.raw()), n, rng.philox_stream(), mean, stddev);
  MOETRAIN_CUDA_CHECK_LAUNCH("fill normal");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
