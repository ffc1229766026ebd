// The CUDA side of rms_norm.h, summing in the CPU's orders (rms_norm_math.h) so that a result
// matches rms_norm_cpu.cc bit for bit wherever both fuse multiply-adds alike (the CPU's FMA
// clones do; its baseline clone rounds a·b and acc + a·b apart):
// - the row kernels give each row to the 16 lanes of a half-warp: lane l sums the CPU's partial
//   l of the row sum (Σ x², ⟨g, x⟩), then the lanes write the row's elements;
// - the weight gradient sums the CPU's blocks of rows into a (blocks, D) workspace, one thread
//   per (block, column) adding its rows in order, then one thread per column adds the blocks in
//   order to d_weight. No atomics: two runs give the same bits.
// Offsets are int64 (T·D can pass 2^31).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/norm/rms_norm_cuda.h"
#include "engine/ops/norm/rms_norm_math.h"

namespace moetrain::ops::cuda {
namespace {

constexpr int kLanes = kRmsNormDotLanes;
constexpr int kRowsPerBlock = kThreadsPerBlock / kLanes;
static_assert(kThreadsPerBlock % 32 == 0 && 32 % kLanes == 0,
              "a row's lanes are a whole part of one warp");

// The 16 lanes of a half-warp that share a row: this thread's lane and the half-warp's mask.
struct RowLanes {
  int lane;
  unsigned mask;
};

__device__ __forceinline__ RowLanes ThisRowLanes() {
  return {static_cast<int>(threadIdx.x % kLanes), ((1u << kLanes) - 1u)
                                                      << (threadIdx.x % 32 / kLanes * kLanes)};
}

// Rows are handed out grid-stride, one per half-warp at a time; every lane of a half-warp takes
// the same rows, so the half-warp stays together through RowDot's shuffles.
__device__ __forceinline__ int64_t FirstRow() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
}
__device__ __forceinline__ int64_t RowStride() {
  return static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
}

// Σ_i a_i·b_i over a row of d columns in the order of rms_norm_math.h, where factors(i, &a, &b)
// gives column i's a and b. Lane l sums columns l, l + 16, ... of the first d − d mod 16 (the
// CPU's partial l); every lane sums the tail itself and then adds the 16 partials in lane order,
// so all 16 return the same total. All 16 lanes of the half-warp must call it together.
template <typename Factors>
__device__ __forceinline__ float RowDot(const RowLanes& lanes, int64_t d, Factors factors) {
  const int64_t full = d - d % kLanes;
  float partial = 0.0f;
  for (int64_t i = lanes.lane; i < full; i += kLanes) {
    float a, b;
    factors(i, &a, &b);
    partial = RmsNormDotTerm(partial, a, b);
  }
  float sum = 0.0f;
#pragma unroll 1
  for (int64_t i = full; i < d; ++i) {  // at most 15 columns
    float a, b;
    factors(i, &a, &b);
    sum = RmsNormDotTerm(sum, a, b);
  }
#pragma unroll
  for (int l = 0; l < kLanes; ++l) sum += __shfl_sync(lanes.mask, partial, l, kLanes);
  return sum;
}

// out (T, D) act and rstd (T) f32 from x (T, D) f32 and weight (D) f32. x and out are not
// declared unaliased (an f32 out may be x, as on the CPU): every lane has read the whole row
// for the sum before any lane passes the __syncwarp, and each element is then read by the lane
// that writes it.
template <typename Out>
__global__ void __launch_bounds__(kThreadsPerBlock)
    RmsNormForwardKernel(const float* x, const float* __restrict__ weight, float eps, Out* out,
                         float* __restrict__ rstd, int64_t t, int64_t d) {
  const RowLanes lanes = ThisRowLanes();
  for (int64_t row = FirstRow(); row < t; row += RowStride()) {
    const float* x_row = x + row * d;
    const float sum_of_squares = RowDot(lanes, d, [x_row](int64_t i, float* a, float* b) {
      *a = x_row[i];
      *b = x_row[i];
    });
    const float s = RmsNormRstd(sum_of_squares, d, eps);
    // The shuffles exchange values, not memory order: an aliased out may be written only once
    // every lane's reads of the row (the tail columns are read by all 16) are done.
    __syncwarp(lanes.mask);
    if (lanes.lane == 0) rstd[row] = s;
    Out* out_row = out + row * d;
    for (int64_t i = lanes.lane; i < d; i += kLanes) {
      StoreAct(out_row, i, RmsNormValue(x_row[i], s, weight[i]));
    }
  }
}

// d_x (T, D) f32, written or (kAccumulate) added to, from x (T, D) f32, weight (D) f32, rstd (T)
// f32 and d_out (T, D) act. The two cases are separate loops, as on the CPU, so that the add
// of the accumulating one fuses with the gradient's last product on both devices alike.
template <typename In, bool kAccumulate>
__global__ void __launch_bounds__(kThreadsPerBlock)
    RmsNormInputGradKernel(const float* __restrict__ x, const float* __restrict__ weight,
                           const float* __restrict__ rstd, const In* __restrict__ d_out,
                           float* __restrict__ d_x, int64_t t, int64_t d) {
  const RowLanes lanes = ThisRowLanes();
  for (int64_t row = FirstRow(); row < t; row += RowStride()) {
    const float* x_row = x + row * d;
    const In* dy = d_out + row * d;
    float* d_x_row = d_x + row * d;
    const float s = rstd[row];
    // g = dy ⊙ w rounded, as the CPU's scratch row holds it: __fmul_rn, so that ptxas cannot
    // fuse it into g − x·c below (where the CPU, reading g from memory, can fuse only x·c).
    const float g_dot_x = RowDot(lanes, d, [x_row, dy, weight](int64_t i, float* a, float* b) {
      *a = __fmul_rn(LoadAct(dy, i), weight[i]);
      *b = x_row[i];
    });
    const float c = RmsNormGradScale(g_dot_x, s, d);
    for (int64_t i = lanes.lane; i < d; i += kLanes) {
      const float g = __fmul_rn(LoadAct(dy, i), weight[i]);
      if constexpr (kAccumulate) {
        d_x_row[i] += RmsNormInputGrad(x_row[i], g, s, c);
      } else {
        d_x_row[i] = RmsNormInputGrad(x_row[i], g, s, c);
      }
    }
  }
}

// partials (blocks, D) f32: entry (b, i) is the sum, over block b's rows in order, of column i's
// weight-gradient terms (the blocks of RmsNormWeightGradBlockRows). Grid: (column blocks of
// kThreadsPerBlock, row blocks).
template <typename In>
__global__ void __launch_bounds__(kThreadsPerBlock)
    RmsNormWeightGradPartialKernel(const float* __restrict__ x, const float* __restrict__ rstd,
                                   const In* __restrict__ d_out, float* __restrict__ partials,
                                   int64_t t, int64_t d, int64_t block_rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= d) return;
  const int64_t block = blockIdx.y;
  const int64_t begin = block * block_rows;
  const int64_t end = begin + block_rows < t ? begin + block_rows : t;
  float sum = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    sum += RmsNormWeightGradTerm(LoadAct(d_out, r * d + i), x[r * d + i], rstd[r]);
  }
  partials[block * d + i] = sum;
}

// d_weight (D) f32 += the sum of partials' rows in block order.
__global__ void __launch_bounds__(kThreadsPerBlock)
    RmsNormWeightGradSumKernel(const float* __restrict__ partials, int64_t blocks,
                               float* __restrict__ d_weight, int64_t d) {
  for (int64_t i = GridStart(); i < d; i += GridStride()) {
    float sum = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) sum += partials[b * d + i];
    d_weight[i] += sum;
  }
}

// Blocks of the row kernels: a half-warp per row, at most a grid-stride kernel's worth.
int RowBlocks(const CudaOp& op, int64_t rows) {
  return static_cast<int>(
      BlocksFor(rows, kRowsPerBlock,
                static_cast<int64_t>(op.context->multiprocessors()) * kGridStrideBlocksPerSm));
}

template <typename In>
absl::Status LaunchInputGrad(const CudaOp& op, const RmsNormBackwardArgs& args) {
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  const auto* x = static_cast<const float*>(args.x.raw());
  const auto* weight = static_cast<const float*>(args.weight.raw());
  const auto* rstd = static_cast<const float*>(args.rstd.raw());
  const auto* d_out = static_cast<const In*>(args.d_out.raw());
  auto* d_x = static_cast<float*>(args.d_x.raw());
  if (args.accumulate_d_x) {
    RmsNormInputGradKernel<In, true>
        <<<RowBlocks(op, t), kThreadsPerBlock, 0, op.stream>>>(x, weight, rstd, d_out, d_x, t, d);
  } else {
    RmsNormInputGradKernel<In, false>
        <<<RowBlocks(op, t), kThreadsPerBlock, 0, op.stream>>>(x, weight, rstd, d_out, d_x, t, d);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("rms_norm backward");
  return absl::OkStatus();
}

template <typename In>
absl::Status LaunchWeightGradPartials(const CudaOp& op, const RmsNormBackwardArgs& args,
                                      int64_t block_rows, int64_t blocks, float* partials) {
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  const dim3 grid(static_cast<unsigned>((d + kThreadsPerBlock - 1) / kThreadsPerBlock),
                  static_cast<unsigned>(blocks));
  RmsNormWeightGradPartialKernel<In><<<grid, kThreadsPerBlock, 0, op.stream>>>(
      static_cast<const float*>(args.x.raw()), static_cast<const float*>(args.rstd.raw()),
      static_cast<const In*>(args.d_out.raw()), partials, t, d, block_rows);
  MOETRAIN_CUDA_CHECK_LAUNCH("rms_norm backward");
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                            TensorView out, TensorView rstd) {
  const int64_t t = x.dim(0), d = x.dim(1);
  if (t == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "rms_norm"));
  const auto* x_data = static_cast<const float*>(x.raw());
  const auto* w = static_cast<const float*>(weight.raw());
  auto* rstd_data = static_cast<float*>(rstd.raw());
  if (out.dtype() == DType::kBF16) {
    RmsNormForwardKernel<uint16_t><<<RowBlocks(op, t), kThreadsPerBlock, 0, op.stream>>>(
        x_data, w, eps, static_cast<uint16_t*>(out.raw()), rstd_data, t, d);
  } else {
    RmsNormForwardKernel<float><<<RowBlocks(op, t), kThreadsPerBlock, 0, op.stream>>>(
        x_data, w, eps, static_cast<float*>(out.raw()), rstd_data, t, d);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("rms_norm");
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const ExecContext& ctx, const RmsNormBackwardArgs& args) {
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  if (t == 0 || d == 0) return absl::OkStatus();  // nothing to write, as on the CPU
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "rms_norm backward"));
  const bool bf16 = args.d_out.dtype() == DType::kBF16;
  MOETRAIN_RETURN_IF_ERROR(bf16 ? LaunchInputGrad<uint16_t>(op, args)
                                : LaunchInputGrad<float>(op, args));

  const int64_t block_rows = RmsNormWeightGradBlockRows(t);
  const int64_t blocks = (t + block_rows - 1) / block_rows;
  // Freed when this returns, while the kernels below may still run: the allocator's reuse is
  // ordered on the compute stream (caching_allocator.h), so whatever gets it next runs after them.
  MOETRAIN_ASSIGN_OR_RETURN(Tensor partials,
                            Tensor::Allocate(ctx.allocator(), DType::kF32, {blocks, d}));
  auto* partial_data = static_cast<float*>(partials.view().raw());
  MOETRAIN_RETURN_IF_ERROR(
      bf16 ? LaunchWeightGradPartials<uint16_t>(op, args, block_rows, blocks, partial_data)
           : LaunchWeightGradPartials<float>(op, args, block_rows, blocks, partial_data));
  RmsNormWeightGradSumKernel<<<static_cast<int>(GridStrideBlocks(d, op.context->multiprocessors())),
                               kThreadsPerBlock, 0, op.stream>>>(
      partial_data, blocks, static_cast<float*>(args.d_weight.raw()), d);
  MOETRAIN_CUDA_CHECK_LAUNCH("rms_norm backward");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
