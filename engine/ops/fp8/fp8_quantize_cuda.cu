// The CUDA quantise and dequantise of fp8.h (fp8_cuda.h): kernels that run the CPU's own
// per-element and per-scale formulas (engine/core/fp8_math.h), so both backends produce the same
// bits. The FP8 GEMM is in fp8_gemm_cuda.cu.
//
// Quantisation. The output X (rows, cols) is src (R, C) itself, or its transpose (C, R) when
// `transpose`; X is quantised along its cols in blocks of 128 (kTensor, kBlock1x128,
// kBlock128x128) or 32 (kMx1x32) elements. Every src element is read and quantised by exactly one
// thread, so the statistics count it once:
//   - not transposed: one warp per (row, block of X), a lane holding 4 (or 1) elements at
//     col = block·B + 32·j + lane: loads and byte stores coalesce along the row;
//   - transposed: a CTA per tile of 128 src rows × 32 src cols, loaded coalesced along src rows
//     into shared memory and read back by X rows (src columns), so that each warp holds one whole
//     128-element X block (the 1×128 block, four MX blocks, or part of a 128×128 tile);
//   - kBlock128x128: a first kernel folds each 128×128 tile's amax and writes its scale (to a
//     scratch array, in src tile order) and scale_inv; the quantising kernels read the scale.
//   - kTensor with compute_scale (current scaling): a first kernel folds the amax of all of src,
//     a one-thread kernel turns it into the scale (written to args.scale) and scale_inv; with
//     delayed scaling the one-thread kernel reads args.scale and writes scale_inv.
// Amaxes fold with Fp8AmaxFold inside a thread and across a warp's shuffles. Across CTAs they
// combine by an integer atomicMax on the float's bits, which is the same fold: a folded amax is
// never negative (its sign bit is clear), non-negative floats order like their bits, and every
// NaN's bits lie above +inf's, so the maximum is NaN exactly when an element was (its payload is
// whichever NaN has the largest bits: deterministic, and irrelevant to the scales, which treat
// every NaN alike). The saturated count is an integer atomicAdd per CTA. Both are thus
// independent of scheduling order: identical inputs give identical bits.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/core/dtype.h"
#include "engine/core/dtype_math.h"
#include "engine/core/fp8_math.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/fp8/fp8.h"
#include "engine/ops/fp8/fp8_cuda.h"

namespace moetrain::ops::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = kThreadsPerBlock / kWarpSize;
static_assert(kThreadsPerBlock % kWarpSize == 0 && kWarps <= kWarpSize);
constexpr unsigned kFullMask = 0xFFFFFFFFu;
// The src rows of a transposed tile (one 128-element X block) and its src columns (X rows).
constexpr int kTileRows = 128;
constexpr int kTileCols = 32;
static_assert(kTileRows % kWarps == 0 && kTileCols % kWarps == 0);

// What the entries of a GEMM-ready scale_inv beyond the real rows or blocks (its pad4 padding)
// hold: never read by cuBLASLt, but never left uninitialised either.
constexpr float kScalePadding = 0.0f;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t Pad4(int64_t n) { return CeilDiv(n, 4) * 4; }

// How a quantising kernel finds the scale of an X block.
enum class BlockMode : uint8_t {
  kTensor,   // the device scalar tensor_scale
  kVec128,   // ScaleFromAmax of the block's own amax (kBlock1x128)
  kTile128,  // the tile's scale, from tile_scale (kBlock128x128)
  kMx32,     // E8M0 of the 32-element block's amax (kMx1x32)
};

struct QuantizeParams {
  Fp8Format format;
  float fp8_max;
  bool pow2;
  float epsilon;
  float value_for_inf;
  int64_t src_rows, src_cols;  // R, C; src is dense (R, C)
  int64_t padded_cols;         // of X: Fp8PaddedCols(X cols), the row stride of data
  uint8_t* data;
  float* scale_inv;
  int64_t scale_ld;               // the row length of scale_inv's 2-D layout
  const float* tensor_scale;      // kTensor
  const float* tile_scale;        // kTile128: [ceil(R/128)][ceil(C/128)], src tile order
  int64_t tile_cols;              // ceil(C/128)
  unsigned int* amax_bits;        // the fold of |src| (bits), or null when not kept
  unsigned long long* saturated;  // the statistic itself, or null when not kept
};

// One thread's share of the statistics.
struct Stats {
  float amax = 0.0f;
  unsigned long long saturated = 0;
};

// x quantised with `scale` (the per-tensor or per-block scale, or MXFP8's multiplier), counted in
// the thread's statistics.
__device__ __forceinline__ uint8_t QuantizeElement(float x, float scale, const QuantizeParams& p,
                                                   Stats& stats) {
  stats.amax = Fp8AmaxFold(stats.amax, x);
  const float scaled = MulRn(x, scale);
  if (Fp8Saturates(scaled, p.format)) ++stats.saturated;
  return QuantizeFp8(scaled, p.format);
}

// The fold of a warp's amaxes, in every lane (a NaN's payload may differ between lanes; whether
// it is NaN does not).
__device__ __forceinline__ float WarpAmax(float amax) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    amax = Fp8AmaxFold(amax, __shfl_xor_sync(kFullMask, amax, offset));
  }
  return amax;
}

// Adds the CTA's statistics to the globals: one atomic each per CTA. Every thread of the CTA
// calls it, once, after its loops (it synchronises the CTA).
__device__ __forceinline__ void FlushStats(Stats stats, const QuantizeParams& p) {
  __shared__ float warp_amax[kWarps];
  __shared__ unsigned long long warp_saturated[kWarps];
  stats.amax = WarpAmax(stats.amax);
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    stats.saturated += __shfl_xor_sync(kFullMask, stats.saturated, offset);
  }
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
    warp_amax[warp] = stats.amax;
    warp_saturated[warp] = stats.saturated;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float amax = 0.0f;
  unsigned long long saturated = 0;
  for (int w = 0; w < kWarps; ++w) {
    amax = Fp8AmaxFold(amax, warp_amax[w]);
    saturated += warp_saturated[w];
  }
  const unsigned int bits = __float_as_uint(amax);
  if (p.amax_bits != nullptr && bits != 0) atomicMax(p.amax_bits, bits);
  if (p.saturated != nullptr && saturated != 0) atomicAdd(p.saturated, saturated);
}

// The amax of all of src (current scaling's first pass), into p.amax_bits.
template <typename Src>
__global__ void __launch_bounds__(kThreadsPerBlock)
    AmaxKernel(const Src* __restrict__ src, int64_t n, QuantizeParams p) {
  Stats stats;
  for (int64_t i = GridStart(); i < n; i += GridStride()) {
    stats.amax = Fp8AmaxFold(stats.amax, LoadAct(src, i));
  }
  p.saturated = nullptr;
  FlushStats(stats, p);
}

// kTensor's scale and scale_inv: with amax_bits (current scaling) scale = ScaleFromAmax(amax),
// written to *scale; without (delayed) the scale found in *scale. One thread.
__global__ void TensorScaleKernel(const unsigned int* amax_bits, float* scale, float* scale_inv,
                                  float fp8_max, bool pow2, float epsilon) {
  float s;
  if (amax_bits != nullptr) {
    s = ScaleFromAmax(__uint_as_float(*amax_bits), fp8_max, pow2, epsilon, FLT_MAX);
    *scale = s;
  } else {
    s = *scale;
  }
  *scale_inv = Fp8ScaleInv(s);
}

// amax statistic = Fp8AmaxFold(amax, fold of |src|). One thread.
__global__ void FinishAmaxKernel(const unsigned int* amax_bits, float* amax) {
  *amax = Fp8AmaxFold(*amax, __uint_as_float(*amax_bits));
}

// kBlock128x128: each 128×128 src tile's amax → its scale (tile_scale, src tile order) and
// scale_inv at the tile's place in X (transposed or not), with the pad4 entries of each
// scale_inv row. One CTA per tile.
template <typename Src>
__global__ void __launch_bounds__(kThreadsPerBlock)
    TileScaleKernel(const Src* __restrict__ src, QuantizeParams p, bool transpose,
                    float* __restrict__ tile_scale) {
  __shared__ float warp_amax[kWarps];
  const int64_t tiles_i = (p.src_rows + 127) / 128, tiles_j = p.tile_cols;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  for (int64_t t = blockIdx.x; t < tiles_i * tiles_j; t += gridDim.x) {
    const int64_t ti = t / tiles_j, tj = t - ti * tiles_j;
    float amax = 0.0f;
    for (int idx = static_cast<int>(threadIdx.x); idx < 128 * 128; idx += kThreadsPerBlock) {
      const int64_t i = ti * 128 + idx / 128, j = tj * 128 + idx % 128;
      if (i < p.src_rows && j < p.src_cols)
        amax = Fp8AmaxFold(amax, LoadAct(src, i * p.src_cols + j));
    }
    amax = WarpAmax(amax);
    if (threadIdx.x % kWarpSize == 0) warp_amax[warp] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarps; ++w) amax = Fp8AmaxFold(amax, warp_amax[w]);
      const float scale = ScaleFromAmax(amax, p.fp8_max, p.pow2, p.epsilon, p.value_for_inf);
      tile_scale[t] = scale;
      // X's tile (row block, col block): (ti, tj), or (tj, ti) transposed; X has col blocks
      // tiles_j, or tiles_i, and its scale_inv rows are p.scale_ld = pad4 of that long.
      const int64_t x_row_block = transpose ? tj : ti, x_col_block = transpose ? ti : tj;
      const int64_t x_col_blocks = transpose ? tiles_i : tiles_j;
      float* row = p.scale_inv + x_row_block * p.scale_ld;
      row[x_col_block] = Fp8ScaleInv(scale);
      if (x_col_block == x_col_blocks - 1) {
        for (int64_t k = x_col_blocks; k < p.scale_ld; ++k) row[k] = kScalePadding;
      }
    }
    __syncthreads();  // warp_amax is rewritten by the next tile
  }
}

// Not transposed: one warp per (row r, block cb of kBlock cols). X = src.
template <typename Src, BlockMode kMode>
__global__ void __launch_bounds__(kThreadsPerBlock)
    QuantizeRowsKernel(const Src* __restrict__ src, QuantizeParams p) {
  constexpr int kBlock = kMode == BlockMode::kMx32 ? 32 : 128;
  constexpr int kPerLane = kBlock / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t blocks_per_row = (p.src_cols + kBlock - 1) / kBlock;
  const int64_t tasks = p.src_rows * blocks_per_row;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (kThreadsPerBlock / kWarpSize);
  float tensor_scale = 1.0f;
  if constexpr (kMode == BlockMode::kTensor) tensor_scale = *p.tensor_scale;
  Stats stats;
  for (int64_t t = GridStart() / kWarpSize; t < tasks; t += warps_per_grid) {
    const int64_t r = t / blocks_per_row, cb = t - r * blocks_per_row;
    const Src* row = src + r * p.src_cols;
    float x[kPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t c = cb * kBlock + j * kWarpSize + lane;
      x[j] = c < p.src_cols ? LoadAct(row, c) : 0.0f;
      amax = Fp8AmaxFold(amax, x[j]);
    }
    float scale;
    if constexpr (kMode == BlockMode::kTensor) {
      scale = tensor_scale;
    } else if constexpr (kMode == BlockMode::kTile128) {
      scale = p.tile_scale[(r / 128) * p.tile_cols + cb];
    } else if constexpr (kMode == BlockMode::kVec128) {
      amax = WarpAmax(amax);
      scale = ScaleFromAmax(amax, p.fp8_max, p.pow2, p.epsilon, p.value_for_inf);
      // scale_inv [blocks_per_row][pad4(R)]: this block's column, and its padding below the
      // last row.
      float* column = p.scale_inv + cb * p.scale_ld;
      if (lane == 0) column[r] = Fp8ScaleInv(scale);
      if (r == p.src_rows - 1 && lane > 0 && r + lane < p.scale_ld)
        column[r + lane] = kScalePadding;
    } else {
      amax = WarpAmax(amax);
      const uint8_t e = E8M0FromAmax(amax, p.fp8_max);
      scale = E8M0QuantMultiplier(e);
      if (lane == 0) p.scale_inv[r * p.scale_ld + cb] = E8M0ScaleInv(e);
    }
    // The block reaches past C into the row's zero padding (padded_cols ≤ C rounded up to B).
    uint8_t* out = p.data + r * p.padded_cols;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t c = cb * kBlock + j * kWarpSize + lane;
      if (c < p.padded_cols) {
        out[c] = c < p.src_cols ? QuantizeElement(x[j], scale, p, stats) : uint8_t{0};
      }
    }
  }
  FlushStats(stats, p);
}

// Transposed: X (C, R) = srcᵀ. One CTA per tile of kTileRows src rows [i0, i0 + 128) × kTileCols
// src cols [j0, j0 + 32): X rows j0.. (src cols), X cols i0.. (one 128-block of each X row).
template <typename Src, BlockMode kMode>
__global__ void __launch_bounds__(kThreadsPerBlock)
    QuantizeTransposedKernel(const Src* __restrict__ src, QuantizeParams p) {
  // +1: the column reads (tile[lane + 32u][jj]) fall in 32 different banks.
  __shared__ float tile[kTileRows][kTileCols + 1];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t rows = p.src_rows, cols = p.src_cols;  // R, C: X is (C, R)
  const int64_t tiles_j = (cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows * tiles_j;
  float tensor_scale = 1.0f;
  if constexpr (kMode == BlockMode::kTensor) tensor_scale = *p.tensor_scale;
  Stats stats;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t ti = t / tiles_j;
    const int64_t i0 = ti * kTileRows, j0 = (t - ti * tiles_j) * kTileCols;
    const int64_t j = j0 + lane;
#pragma unroll
    for (int k = 0; k < kTileRows / kWarps; ++k) {
      const int ii = warp + kWarps * k;
      const int64_t i = i0 + ii;
      tile[ii][lane] = i < rows && j < cols ? LoadAct(src, i * cols + j) : 0.0f;
    }
    __syncthreads();
    for (int m = 0; m < kTileCols / kWarps; ++m) {
      const int jj = warp + kWarps * m;
      const int64_t r = j0 + jj;  // the X row: src column r
      if (r >= cols) continue;    // the same for the whole warp
      float x[kTileRows / kWarpSize];
#pragma unroll
      for (int u = 0; u < kTileRows / kWarpSize; ++u) x[u] = tile[lane + kWarpSize * u][jj];
      uint8_t* out = p.data + r * p.padded_cols;
      if constexpr (kMode == BlockMode::kMx32) {
        // Four 32-element blocks: X cols i0 + 32u ... (scale_inv [C][ceil(R/32)]).
#pragma unroll
        for (int u = 0; u < kTileRows / kWarpSize; ++u) {
          const int64_t c0 = i0 + kWarpSize * u;
          const uint8_t e = E8M0FromAmax(WarpAmax(Fp8AmaxFold(0.0f, x[u])), p.fp8_max);
          if (lane == 0 && c0 < rows)
            p.scale_inv[r * p.scale_ld + c0 / kWarpSize] = E8M0ScaleInv(e);
          const int64_t c = c0 + lane;
          if (c < p.padded_cols) {
            out[c] =
                c < rows ? QuantizeElement(x[u], E8M0QuantMultiplier(e), p, stats) : uint8_t{0};
          }
        }
      } else {
        float scale;
        if constexpr (kMode == BlockMode::kTensor) {
          scale = tensor_scale;
        } else if constexpr (kMode == BlockMode::kTile128) {
          scale = p.tile_scale[ti * p.tile_cols + r / 128];
        } else {
          float amax = 0.0f;
#pragma unroll
          for (int u = 0; u < kTileRows / kWarpSize; ++u) amax = Fp8AmaxFold(amax, x[u]);
          amax = WarpAmax(amax);
          scale = ScaleFromAmax(amax, p.fp8_max, p.pow2, p.epsilon, p.value_for_inf);
          // scale_inv [ceil(R/128)][pad4(C)]: block column ti, X row r, and the padding below
          // the last X row.
          float* column = p.scale_inv + ti * p.scale_ld;
          if (lane == 0) column[r] = Fp8ScaleInv(scale);
          if (r == cols - 1 && lane > 0 && r + lane < p.scale_ld) column[r + lane] = kScalePadding;
        }
#pragma unroll
        for (int u = 0; u < kTileRows / kWarpSize; ++u) {
          const int64_t c = i0 + lane + kWarpSize * u;
          if (c < p.padded_cols) {
            out[c] = c < rows ? QuantizeElement(x[u], scale, p, stats) : uint8_t{0};
          }
        }
      }
    }
    __syncthreads();  // the tile is reloaded for the next t
  }
  FlushStats(stats, p);
}

// dst (rows, cols) = stored value × its scale_inv, one RN f32 multiply, rounded to Dst.
template <typename Dst, Fp8Scaling kScaling>
__global__ void __launch_bounds__(kThreadsPerBlock)
    DequantizeKernel(const uint8_t* __restrict__ data, const float* __restrict__ scale_inv,
                     Dst* __restrict__ dst, int64_t rows, int64_t cols, int64_t padded_cols,
                     int64_t scale_ld, Fp8Format format) {
  const int64_t n = rows * cols;
  for (int64_t i = GridStart(); i < n; i += GridStride()) {
    const int64_t r = i / cols, c = i - r * cols;
    float s;
    if constexpr (kScaling == Fp8Scaling::kTensor) {
      s = scale_inv[0];
    } else if constexpr (kScaling == Fp8Scaling::kBlock1x128) {
      s = scale_inv[(c / 128) * scale_ld + r];
    } else if constexpr (kScaling == Fp8Scaling::kBlock128x128) {
      s = scale_inv[(r / 128) * scale_ld + c / 128];
    } else {
      s = scale_inv[r * scale_ld + c / 32];
    }
    StoreAct(dst, i, MulRn(Fp8ToFloat(data[r * padded_cols + c], format), s));
  }
}

int GridFor(const CudaOp& op, int64_t threads_needed) {
  return static_cast<int>(GridStrideBlocks(threads_needed, op.context->multiprocessors()));
}
// A grid of one CTA per unit of work (a tile), capped like the grid-stride kernels.
int GridForTiles(const CudaOp& op, int64_t tiles) {
  return static_cast<int>(BlocksFor(
      tiles, 1, static_cast<int64_t>(op.context->multiprocessors()) * kGridStrideBlocksPerSm));
}

// The scale_inv row length of each scaling (fp8.h's layouts) for X (rows, cols).
int64_t ScaleLd(Fp8Scaling scaling, int64_t rows, int64_t cols) {
  switch (scaling) {
    case Fp8Scaling::kTensor:
      return 1;
    case Fp8Scaling::kBlock1x128:
      return Pad4(rows);
    case Fp8Scaling::kBlock128x128:
      return Pad4(CeilDiv(cols, 128));
    case Fp8Scaling::kMx1x32:
      return CeilDiv(cols, 32);
  }
  return 1;
}

// value_for_inf of the block scalings: the largest finite value of the source dtype
// (Transformer Engine's blockwise kernels, GPU-NOTES.md §2).
float BlockValueForInf(DType src) {
  return src == DType::kBF16 ? BF16BitsToFloat(uint16_t{0x7F7F}) : FLT_MAX;
}

template <typename Src, BlockMode kMode>
absl::Status LaunchQuantize(const CudaOp& op, const Src* src, const QuantizeParams& p,
                            bool transpose) {
  if (transpose) {
    const int64_t tiles = CeilDiv(p.src_rows, kTileRows) * CeilDiv(p.src_cols, kTileCols);
    QuantizeTransposedKernel<Src, kMode>
        <<<GridForTiles(op, tiles), kThreadsPerBlock, 0, op.stream>>>(src, p);
  } else {
    constexpr int kBlock = kMode == BlockMode::kMx32 ? 32 : 128;
    const int64_t warps = p.src_rows * CeilDiv(p.src_cols, kBlock);
    QuantizeRowsKernel<Src, kMode>
        <<<GridFor(op, warps * kWarpSize), kThreadsPerBlock, 0, op.stream>>>(src, p);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("fp8 quantize");
  return absl::OkStatus();
}

template <typename Src>
absl::Status QuantizeTyped(const ExecContext& ctx, const CudaOp& op, const Fp8QuantizeArgs& args,
                           const Src* src) {
  const Fp8Tensor& out = args.out;
  const int64_t rows = args.src.dim(0), cols = args.src.dim(1);
  const float fp8_max = Fp8Max(out.format);
  QuantizeParams p{
      .format = out.format,
      .fp8_max = fp8_max,
      .pow2 = args.pow2_scales,
      .epsilon = args.amax_epsilon,
      .value_for_inf = BlockValueForInf(args.src.dtype()),
      .src_rows = rows,
      .src_cols = cols,
      .padded_cols = Fp8PaddedCols(out.cols),
      .data = static_cast<uint8_t*>(out.data.raw()),
      .scale_inv = static_cast<float*>(out.scale_inv.raw()),
      .scale_ld = ScaleLd(out.scaling, out.rows, out.cols),
      .tensor_scale = nullptr,
      .tile_scale = nullptr,
      .tile_cols = CeilDiv(cols, 128),
      .amax_bits = nullptr,
      .saturated =
          args.saturated.empty() ? nullptr : static_cast<unsigned long long*>(args.saturated.raw()),
  };
  const bool tensor = out.scaling == Fp8Scaling::kTensor;
  const bool current = tensor && args.compute_scale;
  const int64_t n = rows * cols;

  // The fold of |src| (current scaling's amax, and the amax statistic), zeroed: +0 is the fold's
  // identity. Freed on return, its last use queued (stream-ordered reuse, caching_allocator.h).
  Tensor amax_scratch;
  if (current || !args.amax.empty()) {
    MOETRAIN_ASSIGN_OR_RETURN(amax_scratch, Tensor::Allocate(ctx.allocator(), DType::kI64, {1}));
    p.amax_bits = static_cast<unsigned int*>(amax_scratch.view().raw());
    MOETRAIN_CUDA_RETURN_IF_ERROR("fp8 quantize",
                                  cudaMemsetAsync(p.amax_bits, 0, sizeof(int64_t), op.stream));
  }

  if (tensor) {
    float* scale = static_cast<float*>(args.scale.raw());
    if (current && n > 0) {
      AmaxKernel<Src><<<GridFor(op, n), kThreadsPerBlock, 0, op.stream>>>(src, n, p);
      MOETRAIN_CUDA_CHECK_LAUNCH("fp8 quantize");
    }
    TensorScaleKernel<<<1, 1, 0, op.stream>>>(current ? p.amax_bits : nullptr, scale, p.scale_inv,
                                              fp8_max, args.pow2_scales, args.amax_epsilon);
    MOETRAIN_CUDA_CHECK_LAUNCH("fp8 quantize");
    p.tensor_scale = scale;
  }
  if (n == 0) return absl::OkStatus();  // no data, no block scales, statistics unchanged

  Tensor tile_scale;
  switch (out.scaling) {
    case Fp8Scaling::kTensor:
      MOETRAIN_RETURN_IF_ERROR(
          (LaunchQuantize<Src, BlockMode::kTensor>(op, src, p, args.transpose)));
      break;
    case Fp8Scaling::kBlock1x128:
      MOETRAIN_RETURN_IF_ERROR(
          (LaunchQuantize<Src, BlockMode::kVec128>(op, src, p, args.transpose)));
      break;
    case Fp8Scaling::kBlock128x128: {
      const int64_t tiles = CeilDiv(rows, 128) * p.tile_cols;
      MOETRAIN_ASSIGN_OR_RETURN(tile_scale,
                                Tensor::Allocate(ctx.allocator(), DType::kF32, {tiles}));
      float* tile_scale_data = static_cast<float*>(tile_scale.view().raw());
      TileScaleKernel<Src><<<GridForTiles(op, tiles), kThreadsPerBlock, 0, op.stream>>>(
          src, p, args.transpose, tile_scale_data);
      MOETRAIN_CUDA_CHECK_LAUNCH("fp8 quantize");
      p.tile_scale = tile_scale_data;
      MOETRAIN_RETURN_IF_ERROR(
          (LaunchQuantize<Src, BlockMode::kTile128>(op, src, p, args.transpose)));
      break;
    }
    case Fp8Scaling::kMx1x32:
      MOETRAIN_RETURN_IF_ERROR((LaunchQuantize<Src, BlockMode::kMx32>(op, src, p, args.transpose)));
      break;
  }
  if (!args.amax.empty()) {
    FinishAmaxKernel<<<1, 1, 0, op.stream>>>(p.amax_bits, static_cast<float*>(args.amax.raw()));
    MOETRAIN_CUDA_CHECK_LAUNCH("fp8 quantize");
  }
  return absl::OkStatus();
}

template <typename Dst, Fp8Scaling kScaling>
void LaunchDequantizeKernel(const CudaOp& op, const Fp8Tensor& src, Dst* dst) {
  DequantizeKernel<Dst, kScaling>
      <<<GridFor(op, src.rows * src.cols), kThreadsPerBlock, 0, op.stream>>>(
          static_cast<const uint8_t*>(src.data.raw()),
          static_cast<const float*>(src.scale_inv.raw()), dst, src.rows, src.cols,
          Fp8PaddedCols(src.cols), ScaleLd(kScaling, src.rows, src.cols), src.format);
}

template <typename Dst>
absl::Status LaunchDequantize(const CudaOp& op, const Fp8Tensor& src, Dst* dst) {
  if (src.rows * src.cols == 0) return absl::OkStatus();
  switch (src.scaling) {
    case Fp8Scaling::kTensor:
      LaunchDequantizeKernel<Dst, Fp8Scaling::kTensor>(op, src, dst);
      break;
    case Fp8Scaling::kBlock1x128:
      LaunchDequantizeKernel<Dst, Fp8Scaling::kBlock1x128>(op, src, dst);
      break;
    case Fp8Scaling::kBlock128x128:
      LaunchDequantizeKernel<Dst, Fp8Scaling::kBlock128x128>(op, src, dst);
      break;
    case Fp8Scaling::kMx1x32:
      LaunchDequantizeKernel<Dst, Fp8Scaling::kMx1x32>(op, src, dst);
      break;
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("fp8 dequantize");
  return absl::OkStatus();
}

}  // namespace

absl::Status Fp8Quantize(const ExecContext& ctx, const Fp8QuantizeArgs& args) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "fp8 quantize"));
  if (args.src.dtype() == DType::kBF16) {
    return QuantizeTyped(ctx, op, args, static_cast<const uint16_t*>(args.src.raw()));
  }
  return QuantizeTyped(ctx, op, args, static_cast<const float*>(args.src.raw()));
}

absl::Status Fp8Dequantize(const ExecContext& ctx, const Fp8Tensor& src, TensorView dst) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "fp8 dequantize"));
  if (dst.dtype() == DType::kBF16) {
    return LaunchDequantize(op, src, static_cast<uint16_t*>(dst.raw()));
  }
  return LaunchDequantize(op, src, static_cast<float*>(dst.raw()));
}

}  // namespace moetrain::ops::cuda
