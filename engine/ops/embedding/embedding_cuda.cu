// The CUDA side of embedding.h; see embedding_cuda.h for what waits and why the backward is
// deterministic. Row and element offsets are int64 (T × D can pass 2^31).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/embedding/embedding_cuda.h"

namespace moetrain::ops::cuda {
namespace {

// No bad id found (the verdict's first word starts as all ones; atomicMin keeps the smallest).
constexpr unsigned long long kNoIndex = ~0ull;
// Threads of the per-row kernels (gather, segmented sum): one column each.
constexpr int kRowThreads = 256;

template <typename T>
T* Ptr(const TensorView& v) {
  return static_cast<T*>(v.raw());
}

// Device memory for the call's own use, freed when it goes out of scope: the allocator is
// stream-ordered, so the kernels queued before then still own it.
absl::StatusOr<Tensor> Scratch(const ExecContext& ctx, DType dtype, int64_t count) {
  return Tensor::Allocate(ctx.allocator(), dtype, {std::max<int64_t>(count, 1)});
}

__device__ bool OutsideVocab(int32_t id, int64_t vocab) { return id < 0 || id >= vocab; }

// verdict[0] = the smallest flat index i with ids[i] outside [0, vocab) (left at kNoIndex when
// none). Integer atomicMin: the result does not depend on which thread gets there first.
__global__ void FindBadIdKernel(const int32_t* __restrict__ ids, int64_t n, int64_t vocab,
                                unsigned long long* verdict) {
  for (int64_t i = GridStart(); i < n; i += GridStride()) {
    if (OutsideVocab(ids[i], vocab)) atomicMin(verdict, static_cast<unsigned long long>(i));
  }
}

// One thread, after FindBadIdKernel: verdict[1] = the bad id itself, for the message.
__global__ void ReadBadIdKernel(const int32_t* __restrict__ ids, unsigned long long* verdict) {
  if (verdict[0] != kNoIndex) {
    verdict[1] = static_cast<unsigned long long>(static_cast<int64_t>(ids[verdict[0]]));
  }
}

// The first bad id of ids (n) and where it is; index -1 when all lie in [0, vocab).
struct BadId {
  int64_t index = -1;
  int32_t id = 0;
};

// Queues the search for the first bad id into `verdict` (2 words): the kernels queued after it
// on op.stream may read verdict[0] to skip their work; ReadVerdict then waits for the answer.
absl::Status QueueIdCheck(const CudaOp& op, const char* name, const int32_t* ids, int64_t n,
                          int64_t vocab, unsigned long long* verdict) {
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      name, cudaMemsetAsync(verdict, 0xFF, 2 * sizeof(unsigned long long), op.stream));
  if (n == 0) return absl::OkStatus();
  FindBadIdKernel<<<static_cast<unsigned>(GridStrideBlocks(n, op.context->multiprocessors())),
                    kThreadsPerBlock, 0, op.stream>>>(ids, n, vocab, verdict);
  MOETRAIN_CUDA_CHECK_LAUNCH(name);
  ReadBadIdKernel<<<1, 1, 0, op.stream>>>(ids, verdict);
  MOETRAIN_CUDA_CHECK_LAUNCH(name);
  return absl::OkStatus();
}

absl::StatusOr<BadId> ReadVerdict(const CudaOp& op, const char* name,
                                  const unsigned long long* verdict) {
  unsigned long long words[2];
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, name, verdict, sizeof(words), words));
  if (words[0] == kNoIndex) return BadId{};
  return BadId{static_cast<int64_t>(words[0]), static_cast<int32_t>(words[1])};
}

// inputs[r, j] = windows[r, j], targets[r, j] = windows[r, j + 1] (r < B, j < S), unless the
// check found a bad id: then nothing is written, as on the CPU.
__global__ void SplitTokensKernel(const int32_t* __restrict__ windows, int64_t pairs, int64_t s,
                                  int64_t w, int64_t offset, int32_t* __restrict__ inputs,
                                  int32_t* __restrict__ targets,
                                  const unsigned long long* __restrict__ verdict) {
  if (*verdict != kNoIndex) return;
  for (int64_t i = GridStart(); i < pairs; i += GridStride()) {
    const int64_t row = i / s, col = i % s;
    const int32_t* src = windows + row * w + offset + col;
    inputs[i] = src[0];
    targets[i] = src[1];
  }
}

// out[r] = table[ids[r]], one block per row (grid-stride over rows), unless the check found a
// bad id. `vectors`: rows move as float4 (both bases and d·4 bytes 16-byte aligned).
__global__ void __launch_bounds__(kRowThreads)
    GatherRowsKernel(const float* __restrict__ table, int64_t vocab, int64_t d,
                     const int32_t* __restrict__ ids, int64_t t, float* __restrict__ out,
                     bool vectors, const unsigned long long* __restrict__ verdict) {
  if (*verdict != kNoIndex) return;
  for (int64_t r = blockIdx.x; r < t; r += gridDim.x) {
    const int32_t id = ids[r];
    if (OutsideVocab(id, vocab)) continue;  // refused by the check; keeps the reads in bounds
    const float* src = table + static_cast<int64_t>(id) * d;
    float* dst = out + r * d;
    if (vectors) {
      const float4* src4 = reinterpret_cast<const float4*>(src);
      float4* dst4 = reinterpret_cast<float4*>(dst);
      for (int64_t c = threadIdx.x; c < d / 4; c += blockDim.x) dst4[c] = src4[c];
    } else {
      for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
    }
  }
}

// The sort's input: keys[i] = ids[i], or bad_key (above every valid id) for an id outside
// [0, vocab); positions[i] = i.
__global__ void SortInputKernel(const int32_t* __restrict__ ids, int64_t t, int64_t vocab,
                                uint32_t bad_key, uint32_t* __restrict__ keys,
                                int32_t* __restrict__ positions) {
  for (int64_t i = GridStart(); i < t; i += GridStride()) {
    const int32_t id = ids[i];
    keys[i] = OutsideVocab(id, vocab) ? bad_key : static_cast<uint32_t>(id);
    positions[i] = static_cast<int32_t>(i);
  }
}

// keys (T) sorted, positions (T) in the stable order (for equal keys, ascending). Block x = the
// sorted slot x; only the first slot of each key's run works: it finds where the run ends (the
// block scans the keys together), then for the columns of its y slice one thread per column adds
// the run's d_out rows to d_table[key] in position order, starting from d_table's value: the
// CPU's `dst[c] += src[c]`, row after row, so the same f32 roundings. The rows are loaded eight
// at a time (independent loads in flight) and added in order.
__global__ void __launch_bounds__(kRowThreads)
    SegmentedRowSumKernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ positions,
                          int64_t t, uint32_t bad_key, const float* __restrict__ d_out, int64_t d,
                          float* __restrict__ d_table) {
  constexpr int kUnroll = 8;
  __shared__ unsigned long long run_end;
  const int64_t first = blockIdx.x;
  const uint32_t key = keys[first];
  // The whole block leaves together (every thread reads the same keys): no barrier is skipped.
  if (key == bad_key || (first > 0 && keys[first - 1] == key)) return;
  if (threadIdx.x == 0) run_end = static_cast<unsigned long long>(t);
  __syncthreads();
  for (int64_t base = first + 1; base < t; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const bool other = j < t && keys[j] != key;
    // Keys are sorted: the smallest such j ends the run (an integer min, order-independent).
    if (other) atomicMin(&run_end, static_cast<unsigned long long>(j));
    if (__syncthreads_or(other)) break;
  }
  __syncthreads();
  const int64_t end = static_cast<int64_t>(run_end);
  float* const dst = d_table + static_cast<int64_t>(key) * d;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; c < d;
       c += stride) {
    float acc = dst[c];
    int64_t j = first;
    for (; j + kUnroll <= end; j += kUnroll) {
      float rows[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        rows[k] = d_out[static_cast<int64_t>(positions[j + k]) * d + c];
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) acc += rows[k];
    }
    for (; j < end; ++j) acc += d_out[static_cast<int64_t>(positions[j]) * d + c];
    dst[c] = acc;
  }
}

// OK when the verdict found no bad id; else the error naming where it is: `name`[i] for a flat
// index, or `name`[row, column] when `row_length` > 0 (rows of that many ids).
absl::Status VocabStatus(const BadId& bad, const char* name, int64_t vocab,
                         int64_t row_length = 0) {
  if (bad.index < 0) return absl::OkStatus();
  const std::string position =
      row_length > 0 ? absl::StrCat(bad.index / row_length, ", ", bad.index % row_length)
                     : absl::StrCat(bad.index);
  return absl::InvalidArgumentError(absl::StrCat(name, "[", position, "] = ", bad.id,
                                                 " is outside the vocabulary [0, ", vocab, ")"));
}

// The smallest number of low bits that hold every value up to `key`.
int BitsFor(uint32_t key) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= key) ++bits;
  return bits;
}

}  // namespace

absl::Status CheckTokenIds(const ExecContext& ctx, TensorView tokens, int64_t vocab,
                           const char* name) {
  constexpr const char* kOp = "token id check";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor verdict, Scratch(ctx, DType::kI64, 2));
  unsigned long long* const words = Ptr<unsigned long long>(verdict);
  MOETRAIN_RETURN_IF_ERROR(
      QueueIdCheck(op, kOp, Ptr<const int32_t>(tokens), tokens.numel(), vocab, words));
  MOETRAIN_ASSIGN_OR_RETURN(const BadId bad, ReadVerdict(op, kOp, words));
  return VocabStatus(bad, name, vocab);
}

absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab, int64_t offset,
                         TensorView inputs, TensorView targets) {
  constexpr const char* kOp = "split tokens";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t b = windows.dim(0), w = windows.dim(1), s = inputs.dim(0) / b;
  const int32_t* const ids = Ptr<const int32_t>(windows);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor verdict, Scratch(ctx, DType::kI64, 2));
  unsigned long long* const words = Ptr<unsigned long long>(verdict);
  MOETRAIN_RETURN_IF_ERROR(QueueIdCheck(op, kOp, ids, windows.numel(), vocab, words));
  const int64_t pairs = b * s;
  SplitTokensKernel<<<static_cast<unsigned>(GridStrideBlocks(pairs, op.context->multiprocessors())),
                      kThreadsPerBlock, 0, op.stream>>>(
      ids, pairs, s, w, offset, Ptr<int32_t>(inputs), Ptr<int32_t>(targets), words);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  MOETRAIN_ASSIGN_OR_RETURN(const BadId bad, ReadVerdict(op, kOp, words));
  return VocabStatus(bad, "tokens", vocab, w);
}

absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out) {
  constexpr const char* kOp = "embedding";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t v = table.dim(0), d = table.dim(1), t = tokens.dim(0);
  const int32_t* const ids = Ptr<const int32_t>(tokens);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor verdict, Scratch(ctx, DType::kI64, 2));
  unsigned long long* const words = Ptr<unsigned long long>(verdict);
  MOETRAIN_RETURN_IF_ERROR(QueueIdCheck(op, kOp, ids, t, v, words));
  if (t > 0 && d > 0) {
    const bool vectors =
        CanUse16ByteVectors(reinterpret_cast<uint64_t>(table.raw()), d, sizeof(float)) &&
        CanUse16ByteVectors(reinterpret_cast<uint64_t>(out.raw()), d, sizeof(float));
    const int64_t max_blocks = static_cast<int64_t>(op.context->multiprocessors()) * 32;
    GatherRowsKernel<<<static_cast<unsigned>(BlocksFor(t, 1, max_blocks)), kRowThreads, 0,
                       op.stream>>>(Ptr<const float>(table), v, d, ids, t, Ptr<float>(out), vectors,
                                    words);
    MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  }
  MOETRAIN_ASSIGN_OR_RETURN(const BadId bad, ReadVerdict(op, kOp, words));
  return VocabStatus(bad, "tokens", v);
}

absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table) {
  constexpr const char* kOp = "embedding backward";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t v = d_table.dim(0), d = d_table.dim(1), t = tokens.dim(0);
  if (t == 0 || d == 0) return absl::OkStatus();  // nothing to add
  if (t > INT_MAX) {
    // Positions are i32 in the sort (CUB's item count is an int).
    return absl::InvalidArgumentError(
        absl::StrCat("embedding backward: ", t, " tokens exceed the CUDA backend's ", INT_MAX));
  }
  // Valid ids are below 2^31 (i32), so a key of min(V, 2^31) is above all of them.
  const uint32_t bad_key = static_cast<uint32_t>(std::min<int64_t>(v, int64_t{1} << 31));
  const int end_bit = BitsFor(bad_key);
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor keys_in, Scratch(ctx, DType::kI32, t));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor keys_out, Scratch(ctx, DType::kI32, t));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor positions_in, Scratch(ctx, DType::kI32, t));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor positions_out, Scratch(ctx, DType::kI32, t));

  SortInputKernel<<<static_cast<unsigned>(GridStrideBlocks(t, op.context->multiprocessors())),
                    kThreadsPerBlock, 0, op.stream>>>(Ptr<const int32_t>(tokens), t, v, bad_key,
                                                      Ptr<uint32_t>(keys_in),
                                                      Ptr<int32_t>(positions_in));
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);

  // CUB's radix sort is stable: equal tokens keep their positions' order.
  size_t temp_bytes = 0;
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceRadixSort::SortPairs(
               nullptr, temp_bytes, Ptr<const uint32_t>(keys_in), Ptr<uint32_t>(keys_out),
               Ptr<const int32_t>(positions_in), Ptr<int32_t>(positions_out), static_cast<int>(t),
               0, end_bit, op.stream));
  MOETRAIN_ASSIGN_OR_RETURN(const Tensor temp,
                            Scratch(ctx, DType::kI64, static_cast<int64_t>((temp_bytes + 7) / 8)));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      kOp, cub::DeviceRadixSort::SortPairs(
               temp.view().raw(), temp_bytes, Ptr<const uint32_t>(keys_in), Ptr<uint32_t>(keys_out),
               Ptr<const int32_t>(positions_in), Ptr<int32_t>(positions_out), static_cast<int>(t),
               0, end_bit, op.stream));

  const int64_t column_blocks = std::min<int64_t>((d + kRowThreads - 1) / kRowThreads, 65535);
  const dim3 grid(static_cast<unsigned>(t), static_cast<unsigned>(column_blocks));
  SegmentedRowSumKernel<<<grid, kRowThreads, 0, op.stream>>>(
      Ptr<const uint32_t>(keys_out), Ptr<const int32_t>(positions_out), t, bad_key,
      Ptr<const float>(d_out), d, Ptr<float>(d_table));
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
