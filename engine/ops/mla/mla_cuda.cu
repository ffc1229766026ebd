// The CUDA side of mla.h: grid-stride kernels over the output elements, int64 indices, the
// per-element math of mla_math.h and the CPU's own RoPE table (rope_cuda_table.cuh). By design
// the results match the CPU's to about an ulp (the rotation rounds each product on the device;
// the CPU's FMA clones may fuse one) and the copies bit for bit; these kernels have only
// compiled so far: mla_cuda_test checks that on a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/mla/mla_cuda.h"
#include "engine/ops/mla/mla_math.h"
#include "engine/ops/rope/rope_cuda_table.cuh"

namespace moetrain::ops::cuda {
namespace {

struct Dims {
  int64_t tokens, seq_len, heads, nope, rope, dv;
  MOETRAIN_HOST_DEVICE int64_t dqk() const { return nope + rope; }
  MOETRAIN_HOST_DEVICE int64_t half() const { return rope / 2; }
};

// Element (t, h, j) of q, k and v.
__global__ void __launch_bounds__(kThreadsPerBlock)
    QkvForwardKernel(Dims d, const float* __restrict__ q_full, const float* __restrict__ k_rope,
                     const float* __restrict__ kv, const float* __restrict__ cos,
                     const float* __restrict__ sin, float* __restrict__ q, float* __restrict__ k,
                     float* __restrict__ v) {
  const int64_t dqk = d.dqk(), half = d.half(), kv_width = d.nope + d.dv;
  const int64_t n = d.tokens * d.heads * dqk;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    const int64_t row = e / dqk, j = e - row * dqk;  // row = t·H + h
    const int64_t t = row / d.heads;
    const float* kv_in = kv + row * kv_width;
    if (j < d.nope) {
      q[e] = q_full[e];
      k[e] = kv_in[j];
    } else {
      const int64_t at = t % d.seq_len * half;
      q[e] = MlaRopeFeature(q_full + row * dqk + d.nope, j - d.nope, half, cos + at, sin + at);
      k[e] = MlaRopeFeature(k_rope + t * d.rope, j - d.nope, half, cos + at, sin + at);
    }
    v[e] = j < d.dv ? kv_in[d.nope + j] : 0.0f;
  }
}

// Element (t, h, j) of d_q_full and d_kv (j < nope + v), and, for h = 0, d_k_rope's (t, j < rope).
__global__ void __launch_bounds__(kThreadsPerBlock)
    QkvBackwardKernel(Dims d, const float* __restrict__ d_q, const float* __restrict__ d_k,
                      const float* __restrict__ d_v, const float* __restrict__ cos,
                      const float* __restrict__ sin, float* __restrict__ d_q_full,
                      float* __restrict__ d_k_rope, float* __restrict__ d_kv) {
  const int64_t dqk = d.dqk(), half = d.half(), kv_width = d.nope + d.dv;
  const int64_t width = dqk > kv_width ? dqk : kv_width;
  const int64_t n = d.tokens * d.heads * width;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    const int64_t row = e / width, j = e - row * width;
    const int64_t t = row / d.heads, h = row - t * d.heads;
    const int64_t at = t % d.seq_len * half;
    if (j < dqk) {
      d_q_full[row * dqk + j] =
          j < d.nope
              ? d_q[row * dqk + j]
              : MlaRopeFeatureGrad(d_q + row * dqk + d.nope, j - d.nope, half, cos + at, sin + at);
    }
    if (j < kv_width) {
      d_kv[row * kv_width + j] = j < d.nope ? d_k[row * dqk + j] : d_v[row * dqk + j - d.nope];
    }
    if (h == 0 && j < d.rope) {
      d_k_rope[t * d.rope + j] = MlaSharedKeyGrad(d_k + t * d.heads * dqk, d.heads, dqk, d.nope, j,
                                                  half, cos + at, sin + at);
    }
  }
}

// Element (t, h, j) of wide: narrow's, or zero past v (widen); narrow's from it (narrow).
__global__ void __launch_bounds__(kThreadsPerBlock)
    CopyHeadsKernel(int64_t rows, int64_t dqk, int64_t dv, float* __restrict__ wide,
                    float* __restrict__ narrow, bool widen) {
  const int64_t n = rows * dqk;
  for (int64_t e = GridStart(); e < n; e += GridStride()) {
    const int64_t row = e / dqk, j = e - row * dqk;
    if (widen) {
      wide[e] = j < dv ? narrow[row * dv + j] : 0.0f;
    } else if (j < dv) {
      narrow[row * dv + j] = wide[e];
    }
  }
}

float* F(const TensorView& t) { return static_cast<float*>(t.raw()); }

Dims DimsOf(const MlaShape& s) {
  return {s.tokens(), s.seq_len, s.num_heads, s.qk_nope, s.qk_rope, s.v_head_dim};
}

int Blocks(const CudaOp& op, int64_t n) {
  return static_cast<int>(GridStrideBlocks(n, op.context->multiprocessors()));
}

}  // namespace

absl::Status MlaQkvForward(const ExecContext& ctx, const MlaShape& shape, float theta,
                           TensorView q_full, TensorView k_rope, TensorView kv, TensorView q,
                           TensorView k, TensorView v) {
  const Dims d = DimsOf(shape);
  const int64_t n = d.tokens * d.heads * d.dqk();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "mla qkv"));
  MOETRAIN_ASSIGN_OR_RETURN(const std::shared_ptr<const DeviceRopeTable> table,
                            DeviceRopeTableFor(ctx, op, shape.seq_len, shape.qk_rope, theta));
  QkvForwardKernel<<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
      d, F(q_full), F(k_rope), F(kv), table->cos(), table->sin(), F(q), F(k), F(v));
  MOETRAIN_CUDA_CHECK_LAUNCH("mla qkv");
  return absl::OkStatus();
}

absl::Status MlaQkvBackward(const ExecContext& ctx, const MlaShape& shape, float theta,
                            TensorView d_q, TensorView d_k, TensorView d_v, TensorView d_q_full,
                            TensorView d_k_rope, TensorView d_kv) {
  const Dims d = DimsOf(shape);
  const int64_t kv_width = d.nope + d.dv;
  const int64_t n = d.tokens * d.heads * (d.dqk() > kv_width ? d.dqk() : kv_width);
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "mla qkv backward"));
  MOETRAIN_ASSIGN_OR_RETURN(const std::shared_ptr<const DeviceRopeTable> table,
                            DeviceRopeTableFor(ctx, op, shape.seq_len, shape.qk_rope, theta));
  QkvBackwardKernel<<<Blocks(op, n), kThreadsPerBlock, 0, op.stream>>>(
      d, F(d_q), F(d_k), F(d_v), table->cos(), table->sin(), F(d_q_full), F(d_k_rope), F(d_kv));
  MOETRAIN_CUDA_CHECK_LAUNCH("mla qkv backward");
  return absl::OkStatus();
}

absl::Status MlaCopyHeads(const ExecContext& ctx, const MlaShape& shape, TensorView wide,
                          TensorView narrow, bool widen) {
  const int64_t rows = shape.tokens() * shape.num_heads;
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "mla heads"));
  CopyHeadsKernel<<<Blocks(op, rows * shape.qk_head_dim()), kThreadsPerBlock, 0, op.stream>>>(
      rows, shape.qk_head_dim(), shape.v_head_dim, F(wide), F(narrow), widen);
  MOETRAIN_CUDA_CHECK_LAUNCH("mla heads");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
