// The CUDA side of attention.h (see attention_cuda.h for the decomposition). Positions, rows and
// element offsets are int64 (B·S·H·Dh can pass 2^31); indices inside a tile are int.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/core/fast_math.h"
#include "engine/core/status.h"
#include "engine/ops/attention/attention_cuda.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"

namespace moetrain::ops::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Extents and strides every kernel reads (attention.h's names).
struct Dims {
  int64_t seq_len, heads, kv_heads, head_dim;
  int64_t group;        // heads / kv_heads
  int64_t q_ld, kv_ld;  // row strides of q, out, d_out, d_q and of k, v, d_k, d_v
  int64_t blocks;       // tiles per sequence
  float scale;          // 1/√Dh, rounded as the CPU rounds it
};

// The compile-time geometry of a kernel for feature width kWidth.
template <int kWidth>
struct Geometry {
  static constexpr int kBlock = AttentionCudaBlock(kWidth);  // tile rows and columns
  static constexpr int kLanes = kAttentionThreads / kBlock;  // threads per tile row
  static constexpr int kPerThread = kBlock / kLanes;         // tile columns per thread
  static constexpr int kCols = kWidth / kLanes;              // feature columns per thread
  static constexpr int kStride = kWidth + 1;                 // floats per panel row
  static constexpr int kTileStride = kBlock + 1;             // floats per P / dS tile row
  static constexpr int kPanel = kBlock * kStride;
  static constexpr int kSquare = kBlock * kTileStride;
  // A row's lanes must be neighbours in one warp (shuffles, __syncwarp).
  static_assert(kLanes >= 1 && 32 % kLanes == 0 && kBlock % kLanes == 0);
  static_assert(kWidth % kLanes == 0);
};

// Rows [first_row, first_row + kBlock) (one tile of a sequence), feature columns
// [col, col + head_dim) of a (B·S, ld) tensor, into a (kBlock, kWidth) shared panel of row stride
// kWidth + 1. Rows from `rows` on and columns from head_dim on are zero: a zero V row times a
// masked (zero) P stays zero, where uninitialised memory could be NaN. Consecutive threads read
// consecutive features.
template <int kWidth>
__device__ __forceinline__ void LoadPanel(const float* __restrict__ src, int64_t first_row,
                                          int rows, int64_t ld, int64_t col, int head_dim,
                                          float* panel) {
  using G = Geometry<kWidth>;
  for (int idx = threadIdx.x; idx < G::kBlock * kWidth; idx += kAttentionThreads) {
    const int r = idx / kWidth, c = idx % kWidth;
    float x = 0.0f;
    if (r < rows && c < head_dim) x = src[(first_row + r) * ld + col + c];
    panel[r * G::kStride + c] = x;
  }
}

// dots[t] = Σ_d row[d] · panel[(lane + kLanes·t)·kStride + d] over d < head_dim in ascending order,
// as the CPU's panel products sum them: one row of a score tile, this thread's columns.
template <int kWidth>
__device__ __forceinline__ void RowDots(const float* row, const float* panel, int lane,
                                        int head_dim, float (&dots)[Geometry<kWidth>::kPerThread]) {
  using G = Geometry<kWidth>;
#pragma unroll
  for (int t = 0; t < G::kPerThread; ++t) dots[t] = 0.0f;
  const float* other = panel + lane * G::kStride;
#pragma unroll 2
  for (int d = 0; d < head_dim; ++d) {
    const float a = row[d];
#pragma unroll
    for (int t = 0; t < G::kPerThread; ++t) {
      dots[t] = fmaf(a, other[t * G::kLanes * G::kStride + d], dots[t]);
    }
  }
}

// Positions of the tile starting at `first` that lie in the sequence (1 to kBlock).
template <int kWidth>
__device__ __forceinline__ int TileRows(int64_t first, int64_t seq_len) {
  const int64_t rest = seq_len - first;
  return rest < Geometry<kWidth>::kBlock ? static_cast<int>(rest) : Geometry<kWidth>::kBlock;
}

// A (b, h, query block) task of the forward and d_q kernels, decoded from blockIdx.x with the
// costliest (last) query blocks first, and the calling thread's query in it.
struct QueryTask {
  int64_t qb, b, h, hk;  // query block, sequence, query head and its kv head
  int64_t q_first;       // first position of the query block
  int64_t q_pos;         // this thread's query position (past the sequence in a partial block)
  int64_t seq_row;       // row of position 0 of sequence b
  int head_dim, row, lane, num_queries;
};

template <int kWidth>
__device__ __forceinline__ QueryTask QueryTaskOf(const Dims& dims) {
  using G = Geometry<kWidth>;
  const int64_t task = blockIdx.x;
  QueryTask t;
  t.qb = dims.blocks - 1 - task % dims.blocks;
  t.h = task / dims.blocks % dims.heads;
  t.b = task / (dims.blocks * dims.heads);
  t.hk = t.h / dims.group;
  t.head_dim = static_cast<int>(dims.head_dim);
  t.row = threadIdx.x / G::kLanes;
  t.lane = threadIdx.x % G::kLanes;
  t.q_first = t.qb * G::kBlock;
  t.num_queries = TileRows<kWidth>(t.q_first, dims.seq_len);
  t.q_pos = t.q_first + t.row;
  t.seq_row = t.b * dims.seq_len;
  return t;
}

// The larger, as std::max(a, b) picks it (the CPU's comparisons).
__device__ __forceinline__ float Max(float a, float b) { return a < b ? b : a; }

// Forward task (b, h, query block), costliest (last) query blocks first. Each thread keeps its
// query's running max m and sum l and its columns of the unnormalised output; per key block it
// computes its share of the score row, the row max and sum by shuffles, writes P to shared memory
// and adds P·V.
template <int kWidth>
__global__ void __launch_bounds__(kAttentionThreads)
    ForwardKernel(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ out, float* __restrict__ lse,
                  Dims dims) {
  using G = Geometry<kWidth>;
  extern __shared__ float smem[];
  float* q_s = smem;             // (queries, width)
  float* k_s = q_s + G::kPanel;  // (keys, width)
  float* v_s = k_s + G::kPanel;  // (keys, width)
  float* p_s = v_s + G::kPanel;  // (queries, keys) P

  const auto [qb, b, h, hk, q_first, q_pos, seq_row, head_dim, row, lane, num_queries] =
      QueryTaskOf<kWidth>(dims);

  LoadPanel<kWidth>(q, seq_row + q_first, num_queries, dims.q_ld, h * head_dim, head_dim, q_s);
  float acc[G::kCols];
#pragma unroll
  for (int c = 0; c < G::kCols; ++c) acc[c] = 0.0f;
  float m = -std::numeric_limits<float>::infinity(), l = 0.0f;

  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t k_first = kb * G::kBlock;
    const int num_keys = TileRows<kWidth>(k_first, dims.seq_len);
    __syncthreads();  // the previous block's reads of k_s and v_s are done
    LoadPanel<kWidth>(k, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, k_s);
    LoadPanel<kWidth>(v, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, v_s);
    __syncthreads();

    float s[G::kPerThread];
    RowDots<kWidth>(q_s + row * G::kStride, k_s, lane, head_dim, s);
    // Keys after the query (and past the sequence: only beyond the diagonal) score −inf. A
    // padding query row (q_pos ≥ S) still sees key 0, so its m stays finite; it is not stored.
    float tile_max = m;
#pragma unroll
    for (int t = 0; t < G::kPerThread; ++t) {
      const int64_t k_pos = k_first + lane + t * G::kLanes;
      s[t] = k_pos <= q_pos && k_pos < dims.seq_len ? s[t] * dims.scale
                                                    : -std::numeric_limits<float>::infinity();
      tile_max = Max(tile_max, s[t]);
    }
#pragma unroll
    for (int offset = G::kLanes / 2; offset > 0; offset /= 2) {
      tile_max = Max(tile_max, __shfl_xor_sync(kFullMask, tile_max, offset));
    }
    const float alpha = FastExp(m - tile_max);  // m = −inf on the first block: alpha = 0
    m = tile_max;
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < G::kPerThread; ++t) {
      const float p = FastExp(s[t] - m);
      sum += p;
      p_s[row * G::kTileStride + lane + t * G::kLanes] = p;
    }
#pragma unroll
    for (int offset = G::kLanes / 2; offset > 0; offset /= 2) {
      sum += __shfl_xor_sync(kFullMask, sum, offset);
    }
    l = l * alpha + sum;
    __syncwarp();  // the row's P, written by its lanes (one warp), is read by them below

#pragma unroll
    for (int c = 0; c < G::kCols; ++c) acc[c] *= alpha;
    const float* p_row = p_s + row * G::kTileStride;
    for (int j = 0; j < num_keys; ++j) {
      const float p = p_row[j];
      const float* v_row = v_s + j * G::kStride + lane;
#pragma unroll
      for (int c = 0; c < G::kCols; ++c) acc[c] = fmaf(p, v_row[c * G::kLanes], acc[c]);
    }
  }

  if (row < num_queries) {
    const float inv_l = 1.0f / l;
    float* out_row = out + (seq_row + q_pos) * dims.q_ld + h * head_dim;
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const int col = lane + c * G::kLanes;
      if (col < head_dim) out_row[col] = acc[c] * inv_l;
    }
    if (lane == 0) lse[(b * dims.heads + h) * dims.seq_len + q_pos] = m + logf(l);
  }
}

// D (B, H, S) = ⟨dO_i, O_i⟩, one thread per (row, head), summed in f64 in feature order as the
// CPU sums it (each product of two floats is exact in f64, fused or not): the same bits.
__global__ void RowDotKernel(const float* __restrict__ out, const float* __restrict__ d_out,
                             float* __restrict__ dot, Dims dims, int64_t rows) {
  const int64_t items = rows * dims.heads;
  for (int64_t i = GridStart(); i < items; i += GridStride()) {
    const int64_t row = i / dims.heads, h = i % dims.heads;
    const int64_t b = row / dims.seq_len, pos = row % dims.seq_len;
    const float* o = out + row * dims.q_ld + h * dims.head_dim;
    const float* g = d_out + row * dims.q_ld + h * dims.head_dim;
    double sum = 0.0;
    for (int64_t d = 0; d < dims.head_dim; ++d) {
      sum += static_cast<double>(o[d]) * static_cast<double>(g[d]);
    }
    dot[(b * dims.heads + h) * dims.seq_len + pos] = static_cast<float>(sum);
  }
}

// d_k, d_v task (b, kv head, key block), costliest (first) key blocks first. Each thread owns a
// key and its columns of dKᵀ/scale and dVᵀ; for every query head of the group and query block
// from the diagonal on it computes its share of the key's P and dS column, then
// dV_j += Σ_i P_ij dO_i and dK_j += Σ_i dS_ij Q_i over the block's queries in order.
template <int kWidth>
__global__ void __launch_bounds__(kAttentionThreads)
    BackwardKvKernel(const float* __restrict__ q, const float* __restrict__ k,
                     const float* __restrict__ v, const float* __restrict__ d_out,
                     const float* __restrict__ lse, const float* __restrict__ dot,
                     float* __restrict__ d_k, float* __restrict__ d_v, Dims dims) {
  using G = Geometry<kWidth>;
  extern __shared__ float smem[];
  float* k_s = smem;                 // (keys, width)
  float* v_s = k_s + G::kPanel;      // (keys, width)
  float* q_s = v_s + G::kPanel;      // (queries, width)
  float* g_s = q_s + G::kPanel;      // (queries, width) dO
  float* p_s = g_s + G::kPanel;      // (keys, queries) Pᵀ
  float* ds_s = p_s + G::kSquare;    // (keys, queries) dSᵀ
  float* lse_s = ds_s + G::kSquare;  // (queries)
  float* dot_s = lse_s + G::kBlock;  // (queries) D

  const int64_t task = blockIdx.x;
  const int64_t kb = task % dims.blocks;
  const int64_t hk = task / dims.blocks % dims.kv_heads;
  const int64_t b = task / (dims.blocks * dims.kv_heads);
  const int head_dim = static_cast<int>(dims.head_dim);
  const int row = threadIdx.x / G::kLanes, lane = threadIdx.x % G::kLanes;
  const int64_t k_first = kb * G::kBlock;
  const int num_keys = TileRows<kWidth>(k_first, dims.seq_len);
  const int64_t k_pos = k_first + row;
  const int64_t seq_row = b * dims.seq_len;

  LoadPanel<kWidth>(k, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, k_s);
  LoadPanel<kWidth>(v, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, v_s);
  float dk[G::kCols], dv[G::kCols];
#pragma unroll
  for (int c = 0; c < G::kCols; ++c) dk[c] = dv[c] = 0.0f;

  for (int64_t h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
    const int64_t stat_row = (b * dims.heads + h) * dims.seq_len;  // (b, h, 0) of lse and D
    for (int64_t qb = kb; qb < dims.blocks; ++qb) {
      const int64_t q_first = qb * G::kBlock;
      const int num_queries = TileRows<kWidth>(q_first, dims.seq_len);
      __syncthreads();  // the previous step's reads of q_s, g_s, lse_s, dot_s are done
      LoadPanel<kWidth>(q, seq_row + q_first, num_queries, dims.q_ld, h * head_dim, head_dim, q_s);
      LoadPanel<kWidth>(d_out, seq_row + q_first, num_queries, dims.q_ld, h * head_dim, head_dim,
                        g_s);
      if (threadIdx.x < G::kBlock) {
        const bool valid = static_cast<int>(threadIdx.x) < num_queries;
        lse_s[threadIdx.x] = valid ? lse[stat_row + q_first + threadIdx.x] : 0.0f;
        dot_s[threadIdx.x] = valid ? dot[stat_row + q_first + threadIdx.x] : 0.0f;
      }
      __syncthreads();  // also publishes k_s and v_s on the first step

      float s[G::kPerThread], dp[G::kPerThread];
      RowDots<kWidth>(k_s + row * G::kStride, q_s, lane, head_dim, s);   // K_j · Q_i
      RowDots<kWidth>(v_s + row * G::kStride, g_s, lane, head_dim, dp);  // V_j · dO_i
#pragma unroll
      for (int t = 0; t < G::kPerThread; ++t) {
        const int i = lane + t * G::kLanes;
        const int64_t q_pos = q_first + i;
        // Padding queries (past S) and keys after the query get P = dS = 0.
        const float p =
            q_pos < dims.seq_len && k_pos <= q_pos ? FastExp(s[t] * dims.scale - lse_s[i]) : 0.0f;
        p_s[row * G::kTileStride + i] = p;
        ds_s[row * G::kTileStride + i] = p * (dp[t] - dot_s[i]);
      }
      __syncwarp();  // the key's Pᵀ and dSᵀ rows, written by its lanes (one warp), read below

      const float* p_row = p_s + row * G::kTileStride;
      const float* ds_row = ds_s + row * G::kTileStride;
      for (int i = 0; i < num_queries; ++i) {
        const float p = p_row[i], ds = ds_row[i];
        const float* g_row = g_s + i * G::kStride + lane;
        const float* q_row = q_s + i * G::kStride + lane;
#pragma unroll
        for (int c = 0; c < G::kCols; ++c) {
          dv[c] = fmaf(p, g_row[c * G::kLanes], dv[c]);
          dk[c] = fmaf(ds, q_row[c * G::kLanes], dk[c]);
        }
      }
    }
  }

  if (row < num_keys) {
    const int64_t at = (seq_row + k_pos) * dims.kv_ld + hk * head_dim;
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const int col = lane + c * G::kLanes;
      if (col < head_dim) {
        d_k[at + col] = dk[c] * dims.scale;
        d_v[at + col] = dv[c];
      }
    }
  }
}

// d_q task (b, h, query block), costliest (last) first. Each thread owns a query and its columns
// of dQᵀ/scale; per key block up to the diagonal it recomputes its share of the query's P and dS
// row and adds dQ_i += Σ_j dS_ij K_j over the block's keys in order.
template <int kWidth>
__global__ void __launch_bounds__(kAttentionThreads)
    BackwardQKernel(const float* __restrict__ q, const float* __restrict__ k,
                    const float* __restrict__ v, const float* __restrict__ d_out,
                    const float* __restrict__ lse, const float* __restrict__ dot,
                    float* __restrict__ d_q, Dims dims) {
  using G = Geometry<kWidth>;
  extern __shared__ float smem[];
  float* q_s = smem;              // (queries, width)
  float* g_s = q_s + G::kPanel;   // (queries, width) dO
  float* k_s = g_s + G::kPanel;   // (keys, width)
  float* v_s = k_s + G::kPanel;   // (keys, width)
  float* ds_s = v_s + G::kPanel;  // (queries, keys) dS

  const auto [qb, b, h, hk, q_first, q_pos, seq_row, head_dim, row, lane, num_queries] =
      QueryTaskOf<kWidth>(dims);
  const bool valid_query = row < num_queries;
  const int64_t stat = (b * dims.heads + h) * dims.seq_len + q_pos;
  const float lse_i = valid_query ? lse[stat] : 0.0f;
  const float dot_i = valid_query ? dot[stat] : 0.0f;

  LoadPanel<kWidth>(q, seq_row + q_first, num_queries, dims.q_ld, h * head_dim, head_dim, q_s);
  LoadPanel<kWidth>(d_out, seq_row + q_first, num_queries, dims.q_ld, h * head_dim, head_dim, g_s);
  float dq[G::kCols];
#pragma unroll
  for (int c = 0; c < G::kCols; ++c) dq[c] = 0.0f;

  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t k_first = kb * G::kBlock;
    const int num_keys = TileRows<kWidth>(k_first, dims.seq_len);
    __syncthreads();  // the previous block's reads of k_s are done
    LoadPanel<kWidth>(k, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, k_s);
    LoadPanel<kWidth>(v, seq_row + k_first, num_keys, dims.kv_ld, hk * head_dim, head_dim, v_s);
    __syncthreads();  // also publishes q_s and g_s on the first block

    float s[G::kPerThread], dp[G::kPerThread];
    RowDots<kWidth>(q_s + row * G::kStride, k_s, lane, head_dim, s);   // Q_i · K_j
    RowDots<kWidth>(g_s + row * G::kStride, v_s, lane, head_dim, dp);  // dO_i · V_j
#pragma unroll
    for (int t = 0; t < G::kPerThread; ++t) {
      const int j = lane + t * G::kLanes;
      const int64_t k_pos = k_first + j;
      const float p = valid_query && k_pos <= q_pos ? FastExp(s[t] * dims.scale - lse_i) : 0.0f;
      ds_s[row * G::kTileStride + j] = p * (dp[t] - dot_i);
    }
    __syncwarp();  // the query's dS row, written by its lanes (one warp), read below

    const float* ds_row = ds_s + row * G::kTileStride;
    for (int j = 0; j < num_keys; ++j) {
      const float ds = ds_row[j];
      const float* k_row = k_s + j * G::kStride + lane;
#pragma unroll
      for (int c = 0; c < G::kCols; ++c) dq[c] = fmaf(ds, k_row[c * G::kLanes], dq[c]);
    }
  }

  if (valid_query) {
    float* dq_row = d_q + (seq_row + q_pos) * dims.q_ld + h * head_dim;
#pragma unroll
    for (int c = 0; c < G::kCols; ++c) {
      const int col = lane + c * G::kLanes;
      if (col < head_dim) dq_row[col] = dq[c] * dims.scale;
    }
  }
}

Dims DimsOf(const AttentionShape& s) {
  Dims d;
  d.seq_len = s.seq_len;
  d.heads = s.num_heads;
  d.kv_heads = s.num_kv_heads;
  d.head_dim = s.head_dim;
  d.group = s.num_heads / s.num_kv_heads;
  d.q_ld = s.num_heads * s.head_dim;
  d.kv_ld = s.num_kv_heads * s.head_dim;
  d.blocks = 0;                                                // set per width
  d.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));  // attention_cpu.cc's rounding
  return d;
}

// The blocks of a one-task-per-block grid, or InvalidArgument when they exceed the grid's x
// limit (2^31 − 1, far past any shape that fits in memory).
absl::StatusOr<unsigned> TaskBlocks(const char* op, int64_t tasks) {
  if (tasks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", tasks, " thread blocks exceed the CUDA grid limit"));
  }
  return static_cast<unsigned>(tasks);
}

// Opts `kernel` in to `bytes` of dynamic shared memory (above the default 48 KiB) and checks it.
template <typename Kernel>
absl::Status AllowSharedMemory(const char* op, Kernel kernel, int64_t bytes) {
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)));
  return absl::OkStatus();
}

template <int kWidth>
absl::Status Forward(const CudaOp& op, const AttentionShape& shape, TensorView q, TensorView k,
                     TensorView v, TensorView out, TensorView lse) {
  constexpr const char* kOp = "attention";
  using G = Geometry<kWidth>;
  Dims dims = DimsOf(shape);
  dims.blocks = (shape.seq_len + G::kBlock - 1) / G::kBlock;
  MOETRAIN_ASSIGN_OR_RETURN(const unsigned blocks,
                            TaskBlocks(kOp, shape.batch * shape.num_heads * dims.blocks));
  constexpr int64_t kSmem = AttentionCudaSharedBytes(AttentionKernel::kForward, kWidth);
  static_assert(kSmem == 4 * (3 * G::kPanel + G::kSquare));
  MOETRAIN_RETURN_IF_ERROR(AllowSharedMemory(kOp, ForwardKernel<kWidth>, kSmem));
  ForwardKernel<kWidth><<<blocks, kAttentionThreads, kSmem, op.stream>>>(
      static_cast<const float*>(q.raw()), static_cast<const float*>(k.raw()),
      static_cast<const float*>(v.raw()), static_cast<float*>(out.raw()),
      static_cast<float*>(lse.raw()), dims);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

template <int kWidth>
absl::Status Backward(const ExecContext& ctx, const CudaOp& op, const AttentionShape& shape,
                      TensorView q, TensorView k, TensorView v, TensorView out, TensorView lse,
                      TensorView d_out, TensorView d_q, TensorView d_k, TensorView d_v) {
  constexpr const char* kOp = "attention backward";
  using G = Geometry<kWidth>;
  Dims dims = DimsOf(shape);
  dims.blocks = (shape.seq_len + G::kBlock - 1) / G::kBlock;
  MOETRAIN_ASSIGN_OR_RETURN(const unsigned kv_blocks,
                            TaskBlocks(kOp, shape.batch * shape.num_kv_heads * dims.blocks));
  MOETRAIN_ASSIGN_OR_RETURN(const unsigned q_blocks,
                            TaskBlocks(kOp, shape.batch * shape.num_heads * dims.blocks));

  // D, freed when this returns: the allocator is stream-ordered, so the kernels queued below on
  // op.stream still own it.
  MOETRAIN_ASSIGN_OR_RETURN(Tensor dot,
                            Tensor::Allocate(ctx.allocator(), DType::kF32,
                                             {shape.batch, shape.num_heads, shape.seq_len}));
  const int64_t rows = shape.batch * shape.seq_len;
  const auto* q_p = static_cast<const float*>(q.raw());
  const auto* k_p = static_cast<const float*>(k.raw());
  const auto* v_p = static_cast<const float*>(v.raw());
  const auto* g_p = static_cast<const float*>(d_out.raw());
  const auto* lse_p = static_cast<const float*>(lse.raw());
  float* const dot_p = static_cast<float*>(TensorView(dot).raw());  // device memory
  RowDotKernel<<<static_cast<unsigned>(
                     GridStrideBlocks(rows * shape.num_heads, op.context->multiprocessors())),
                 kThreadsPerBlock, 0, op.stream>>>(static_cast<const float*>(out.raw()), g_p, dot_p,
                                                   dims, rows);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);

  constexpr int64_t kKvSmem = AttentionCudaSharedBytes(AttentionKernel::kBackwardKv, kWidth);
  static_assert(kKvSmem == 4 * (4 * G::kPanel + 2 * G::kSquare + 2 * G::kBlock));
  MOETRAIN_RETURN_IF_ERROR(AllowSharedMemory(kOp, BackwardKvKernel<kWidth>, kKvSmem));
  BackwardKvKernel<kWidth><<<kv_blocks, kAttentionThreads, kKvSmem, op.stream>>>(
      q_p, k_p, v_p, g_p, lse_p, dot_p, static_cast<float*>(d_k.raw()),
      static_cast<float*>(d_v.raw()), dims);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);

  constexpr int64_t kQSmem = AttentionCudaSharedBytes(AttentionKernel::kBackwardQ, kWidth);
  static_assert(kQSmem == 4 * (4 * G::kPanel + G::kSquare));
  MOETRAIN_RETURN_IF_ERROR(AllowSharedMemory(kOp, BackwardQKernel<kWidth>, kQSmem));
  BackwardQKernel<kWidth><<<q_blocks, kAttentionThreads, kQSmem, op.stream>>>(
      q_p, k_p, v_p, g_p, lse_p, dot_p, static_cast<float*>(d_q.raw()), dims);
  MOETRAIN_CUDA_CHECK_LAUNCH(kOp);
  return absl::OkStatus();
}

absl::Status WidthError(const char* op, int64_t head_dim) {
  return absl::UnimplementedError(absl::StrCat(
      op, ": shape.head_dim = ", head_dim, " exceeds the CUDA kernels' ", kAttentionMaxHeadDim));
}

}  // namespace

absl::Status CausalAttentionForward(const ExecContext& ctx, const AttentionShape& shape,
                                    TensorView q, TensorView k, TensorView v, TensorView out,
                                    TensorView lse) {
  const int width = AttentionCudaWidth(shape.head_dim);
  if (width == 0) return WidthError("attention", shape.head_dim);
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "attention"));
  switch (width) {
    case 32:
      return Forward<32>(op, shape, q, k, v, out, lse);
    case 64:
      return Forward<64>(op, shape, q, k, v, out, lse);
    case 128:
      return Forward<128>(op, shape, q, k, v, out, lse);
    default:
      return Forward<256>(op, shape, q, k, v, out, lse);
  }
}

absl::Status CausalAttentionBackward(const ExecContext& ctx, const AttentionShape& shape,
                                     TensorView q, TensorView k, TensorView v, TensorView out,
                                     TensorView lse, TensorView d_out, TensorView d_q,
                                     TensorView d_k, TensorView d_v) {
  const int width = AttentionCudaWidth(shape.head_dim);
  if (width == 0) return WidthError("attention backward", shape.head_dim);
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "attention backward"));
  switch (width) {
    case 32:
      return Backward<32>(ctx, op, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
    case 64:
      return Backward<64>(ctx, op, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
    case 128:
      return Backward<128>(ctx, op, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
    default:
      return Backward<256>(ctx, op, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
  }
}

}  // namespace moetrain::ops::cuda
