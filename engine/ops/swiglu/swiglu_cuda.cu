// The CUDA side of swiglu.h: one grid-stride kernel per direction over the R·F (gate, up) pairs,
// int64 indices throughout (R·2F can pass 2^31), each pair computed by swiglu_math.h, the CPU's
// own per-element math.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/core/dtype.h"
#include "engine/core/dtype_math.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/swiglu/swiglu_cuda.h"
#include "engine/ops/swiglu/swiglu_math.h"

namespace moetrain::ops::cuda {
namespace {

// out (R, F) act = silu(gate) ⊙ up; gate_up (R, 2F) f32. Pair i is row i / F, column i % F.
template <typename Out>
__global__ void SwigluForwardKernel(const float* __restrict__ gate_up, Out* __restrict__ out,
                                    int64_t rows, int64_t f) {
  const int64_t pairs = rows * f;
  for (int64_t i = GridStart(); i < pairs; i += GridStride()) {
    const int64_t row = i / f, col = i - row * f;
    const float* gate = gate_up + row * 2 * f;
    StoreAct(out, i, SwigluForwardValue(gate[col], gate[f + col]));
  }
}

// d_gate_up (R, 2F) act from d_out (R, F) f32 and gate_up (R, 2F) f32.
template <typename Out>
__global__ void SwigluBackwardKernel(const float* __restrict__ gate_up,
                                     const float* __restrict__ d_out, Out* __restrict__ d_gate_up,
                                     int64_t rows, int64_t f) {
  const int64_t pairs = rows * f;
  for (int64_t i = GridStart(); i < pairs; i += GridStride()) {
    const int64_t row = i / f, col = i - row * f;
    const int64_t gate_at = row * 2 * f + col;
    float d_gate, d_up;
    SwigluBackwardValue(gate_up[gate_at], gate_up[gate_at + f], d_out[i], &d_gate, &d_up);
    StoreAct(d_gate_up, gate_at, d_gate);
    StoreAct(d_gate_up, gate_at + f, d_up);
  }
}

int Blocks(const CudaOp& op, int64_t items) {
  return static_cast<int>(GridStrideBlocks(items, op.context->multiprocessors()));
}

}  // namespace

absl::Status SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out) {
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (rows * f == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "swiglu"));
  const float* in = static_cast<const float*>(gate_up.raw());
  if (out.dtype() == DType::kBF16) {
    SwigluForwardKernel<uint16_t><<<Blocks(op, rows * f), kThreadsPerBlock, 0, op.stream>>>(
        in, static_cast<uint16_t*>(out.raw()), rows, f);
  } else {
    SwigluForwardKernel<float><<<Blocks(op, rows * f), kThreadsPerBlock, 0, op.stream>>>(
        in, static_cast<float*>(out.raw()), rows, f);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("swiglu");
  return absl::OkStatus();
}

absl::Status SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                            TensorView d_gate_up) {
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (rows * f == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "swiglu backward"));
  const float* in = static_cast<const float*>(gate_up.raw());
  const float* d = static_cast<const float*>(d_out.raw());
  if (d_gate_up.dtype() == DType::kBF16) {
    SwigluBackwardKernel<uint16_t><<<Blocks(op, rows * f), kThreadsPerBlock, 0, op.stream>>>(
        in, d, static_cast<uint16_t*>(d_gate_up.raw()), rows, f);
  } else {
    SwigluBackwardKernel<float><<<Blocks(op, rows * f), kThreadsPerBlock, 0, op.stream>>>(
        in, d, static_cast<float*>(d_gate_up.raw()), rows, f);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("swiglu backward");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
