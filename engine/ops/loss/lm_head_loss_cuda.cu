// The CUDA side of lm_head_loss.h's parts between the GEMMs; see lm_head_loss_cuda.h for the
// order of the sums and what waits. No atomics.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/embedding/embedding_cuda.h"
#include "engine/ops/loss/cross_entropy_math.h"
#include "engine/ops/loss/lm_head_loss_cpu.h"
#include "engine/ops/loss/lm_head_loss_cuda.h"

namespace moetrain::ops::cuda {
namespace {

// Threads of a row's block: a row is V logits (tens of thousands), read three times.
constexpr int kRowThreads = 512;
constexpr int kRowWarps = kRowThreads / 32;

template <typename T>
T* Ptr(const TensorView& v) {
  return static_cast<T*>(v.raw());
}

// RowMax's step: the larger, a NaN never preferred over the value held.
struct MaxOp {
  __device__ float operator()(float held, float x) const { return held < x ? x : held; }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// `value` of every thread combined over the block in a fixed order (a shuffle tree within each
// warp, then the warps in order), returned to every thread: deterministic for a fixed block size.
// `slots` (kRowWarps) is free again when it returns.
template <typename Op>
__device__ float BlockReduce(float value, float* slots, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  }
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = value;
  __syncthreads();
  float total = slots[0];
  for (int w = 1; w < kRowWarps; ++w) total = op(total, slots[w]);
  __syncthreads();
  return total;
}

// Block per row (grid-stride over rows): cross_entropy_math.h's steps of CrossEntropyRow and
// CrossEntropyGrad, the loops split over the block. d_logits (Act = float or bf16 bits) is null
// for the forward only.
template <typename Act>
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyRowsKernel(const float* __restrict__ z, int64_t z_stride, int64_t rows, int64_t v,
                           const int32_t* __restrict__ targets, float* __restrict__ token_loss,
                           Act* __restrict__ d_logits, int64_t d_stride, float scale) {
  __shared__ float slots[kRowWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* const row = z + r * z_stride;
    float max = -INFINITY;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) max = MaxOp()(max, row[i]);
    max = BlockReduce(max, slots, MaxOp());
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) sum += CrossEntropyExp(row[i], max);
    sum = BlockReduce(sum, slots, SumOp());
    const int32_t target = targets[r];
    const bool valid = target >= 0 && target < v;  // CheckTargets refused the others
    if (threadIdx.x == 0) token_loss[r] = valid ? CrossEntropyLoss(max, sum, row[target]) : NAN;
    if (d_logits == nullptr) continue;
    const float p_scale = valid ? CrossEntropyProbScale(scale, sum) : NAN;
    Act* const d = d_logits + r * d_stride;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      const float g = CrossEntropyProbGrad(CrossEntropyExp(row[i], max), p_scale);
      StoreAct(d, i, i == target ? CrossEntropyTargetGrad(g, scale) : g);
    }
  }
}

}  // namespace

absl::Status CheckTargets(const ExecContext& ctx, TensorView targets, int64_t vocab) {
  return CheckTokenIds(ctx, targets, vocab, "targets");
}

absl::Status CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                              TensorView token_loss, TensorView d_logits, float scale) {
  constexpr const char* kOp = "lm_head cross-entropy";
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, kOp));
  const int64_t rows = z.dim(0), v = z.dim(1);
  if (rows == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>(BlocksFor(rows, 1, INT_MAX));
  const float* const zp = Ptr<const float>(z);
  const int32_t* const tp = Ptr<const int32_t>(targets);
  float* const lp = Ptr<float>(token_loss);
  if (d_logits.empty()) {
    CrossEntropyRowsKernel<float><<<blocks, kRowThreads, 0, op.stream>>>(zp, z.stride(0), rows, v,
                                                                         tp, lp, nullptr, 0, scale);
  } else if (d_logits.dtype() == DType::kBF16) {
    CrossEntropyRowsKernel<uint16_t><<<blocks, kRowThreads, 0, op.stream>>>(
        zp, z.stride(0), rows, v, tp, lp, Ptr<uint16_t>(d_logits), d_logits.stride(0), scale);
  } else {
    CrossEntropyRowsKernel<float><<<blocks, kRowThreads, 0, op.stream>>>(
        zp, z.stride(0), rows, v, tp, lp, Ptr<float>(d_logits), d_logits.stride(0), scale);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

absl::StatusOr<double> SumInOrder(const ExecContext& ctx, TensorView token_loss) {
  Tensor host = Tensor::Empty(DType::kF32, {token_loss.numel()});
  MOETRAIN_RETURN_IF_ERROR(::moetrain::ops::CopyTensor(ctx, token_loss, host));
  return ::moetrain::cpu::SumInOrder(host);
}

}  // namespace moetrain::ops::cuda
