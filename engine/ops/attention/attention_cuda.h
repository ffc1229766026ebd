// The CUDA side of attention.h (attention_cuda.cu); arguments arrive validated by the dispatch in
// attention.cc, every tensor dense f32 on ctx's device. Host-safe: no CUDA headers.
//
// Plain f32 FMA on the CUDA cores (no tensor cores: TF32 would round q·k far coarser than the
// CPU), tiled like the CPU and with the same task decomposition (attention.h):
// - forward: one thread block per (b, h, query block); an online softmax over the key blocks up to
//   the diagonal, so memory is O(S) per head (the (B, H, S) lse, nothing S × S);
// - backward: D = rowsum(dO ⊙ O) in f64 exactly as the CPU sums it; then one block per
//   (b, kv head, key block) that sums d_k and d_v over the group's query heads and the query
//   blocks from the diagonal on, and one per (b, h, query block) that sums d_q over the key
//   blocks. Every output element has one writer and a fixed summation order: no atomics, results
//   bit-identical run to run.
// Each thread owns one row of the block's tile (a query in the forward and d_q, a key in d_k/d_v)
// and the row's features lane, lane + L, … (L threads per row, neighbours in one warp, so a row's
// max and sum reduce with shuffles). The per-element exponential is FastExp (core/fast_math.h),
// the CPU's own; the scale 1/√Dh is computed on the host as the CPU computes it.
// Features are padded (in shared memory only) to a width of 32, 64, 128 or 256: head_dim above
// 256 is Unimplemented on CUDA.
#ifndef MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CUDA_H_
#define MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"

namespace moetrain::ops::cuda {

// ---- The tiling: pure host arithmetic, shared by the kernels and the CPU test of the plan. ----

inline constexpr int kAttentionThreads = 256;  // per thread block, every kernel
inline constexpr int kAttentionMaxHeadDim = 256;

// The kernels' feature width for head_dim (its padded copy in shared memory), 0 above 256.
constexpr int AttentionCudaWidth(int64_t head_dim) {
  return head_dim <= 32    ? 32
         : head_dim <= 64  ? 64
         : head_dim <= 128 ? 128
         : head_dim <= 256 ? 256
                           : 0;
}

// Queries and keys per tile: 64 for narrow heads; 32 from width 128 on, so that a thread's
// accumulators (2 · width / L floats in d_k/d_v) stay in registers and shared memory fits.
constexpr int AttentionCudaBlock(int width) { return width >= 128 ? 32 : 64; }

enum class AttentionKernel { kForward, kBackwardKv, kBackwardQ };

// Dynamic shared memory of `kernel` at `width`: (block, width + 1) panels of q, k, v, dO (the odd
// row stride puts a warp's rows in different banks), (block, block + 1) tiles of P or dS, and
// the lse and D of a query block.
constexpr int64_t AttentionCudaSharedBytes(AttentionKernel kernel, int width) {
  const int64_t block = AttentionCudaBlock(width);
  const int64_t panel = block * (width + 1), square = block * (block + 1);
  switch (kernel) {
    case AttentionKernel::kForward:
      return 4 * (3 * panel + square);  // q, k, v; P
    case AttentionKernel::kBackwardKv:
      return 4 * (4 * panel + 2 * square + 2 * block);  // k, v, q, dO; Pᵀ, dSᵀ; lse, D
    case AttentionKernel::kBackwardQ:
      return 4 * (4 * panel + square);  // q, dO, k, v; dS
  }
  return 0;
}

// ---- The ops (attention.h's, same arguments). ----

absl::Status CausalAttentionForward(const ExecContext& ctx, const AttentionShape& shape,
                                    TensorView q, TensorView k, TensorView v, TensorView out,
                                    TensorView lse);
absl::Status CausalAttentionBackward(const ExecContext& ctx, const AttentionShape& shape,
                                     TensorView q, TensorView k, TensorView v, TensorView out,
                                     TensorView lse, TensorView d_out, TensorView d_q,
                                     TensorView d_k, TensorView d_v);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_CUDA_H_
