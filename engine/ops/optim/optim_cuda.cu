// The CUDA side of optim.h.
//
// AdamW, scale and the NaN check are multi-tensor kernels. The tensors' addresses, sizes and
// flags travel in the kernel's parameters (a __grid_constant__ struct of up to
// kMaxTensorsPerLaunch tensors, ~25 KB, within the 32 KB that Volta and later take), so there is
// no device table to upload, cache or invalidate and no host wait: a model's parameter list is
// one launch, or a few for very long lists. Each tensor is cut into tiles (multi_tensor_math.h);
// a block takes tiles grid-stride and finds a tile's tensor by a binary search that is uniform
// over the block (constant-cache broadcasts).
//
// SquaredNorm reproduces the CPU's summation order exactly (optim_cpu.h): 16 threads sum one of
// the CPU's blocks, thread l holding the CPU's lane l (its elements in the CPU's order), a single
// thread adds the 16 lanes in order, and the host adds the blocks in order. Every f64 operation
// is an _rn intrinsic, never fused, so the result is the CPU's bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/optim/adamw_math.h"
#include "engine/ops/optim/multi_tensor_math.h"
#include "engine/ops/optim/optim_cpu.h"
#include "engine/ops/optim/optim_cuda.h"

namespace moetrain::ops::cuda {
namespace {

using ::moetrain::cpu::kNormBlock;
using ::moetrain::cpu::kNormLanes;

// Tensors per launch of a multi-tensor kernel; AdamW's parameters are then ~25 KB.
constexpr int kMaxTensorsPerLaunch = 512;
// Threads per block of the multi-tensor kernels: 4-element vectors × 4 rounds fill a tile.
constexpr int kOptimThreads = 256;
static_assert(kOptimTileElements % (4 * kOptimThreads) == 0);
// SquaredNorm: kNormLanes threads per CPU block, so one CUDA block sums 16 CPU blocks.
constexpr int kNormThreads = 256;
constexpr int kNormBlocksPerCta = kNormThreads / kNormLanes;
static_assert(kNormThreads % kNormLanes == 0);

// flags[i] of a TensorChunk.
constexpr uint8_t kAligned16 = 1;    // every array of tensor i starts 16-byte aligned
constexpr uint8_t kWeightDecay = 2;  // AdamW: tensor i takes the decaying scalars

// kArrays parallel lists of `count` tensors (AdamW: p, g, m, v), as a kernel parameter.
template <int kArrays>
struct TensorChunk {
  float* data[kArrays][kMaxTensorsPerLaunch];
  int64_t numel[kMaxTensorsPerLaunch];
  int64_t tile_start[kMaxTensorsPerLaunch + 1];  // tile_start[count]: the chunk's tiles
  uint8_t flags[kMaxTensorsPerLaunch];
  int count;
};

struct AdamWChunk {
  TensorChunk<4> tensors;  // m and v are uint16_t (bf16 bits) when bf16_moments
  AdamWScalars decaying;
  AdamWScalars plain;
  int bf16_moments;
};
// Kernel parameters may take 32,764 bytes (CUDA ≥ 12.1, Volta and later).
static_assert(sizeof(AdamWChunk) <= 32764);
static_assert(sizeof(TensorChunk<1>) <= 32764);

// The tile `tile` of `chunk` (multi_tensor_math.h).
template <int kArrays>
__device__ __forceinline__ OptimTile TileOf(const TensorChunk<kArrays>& chunk, int64_t tile) {
  return OptimTileOf(chunk.tile_start, chunk.numel, chunk.count, tile);
}

__device__ __forceinline__ void AdamWUpdateFour(float4& p, const float4& g, float4& m, float4& v,
                                                const AdamWScalars& s) {
  AdamWUpdateElement(&p.x, g.x, &m.x, &v.x, s);
  AdamWUpdateElement(&p.y, g.y, &m.y, &v.y, s);
  AdamWUpdateElement(&p.z, g.z, &m.z, &v.z, s);
  AdamWUpdateElement(&p.w, g.w, &m.w, &v.w, s);
}

// One AdamW step of every element of the chunk's tensors (adamw_math.h).
__global__ void __launch_bounds__(kOptimThreads)
    AdamWKernel(const __grid_constant__ AdamWChunk chunk) {
  const TensorChunk<4>& list = chunk.tensors;
  const int64_t tiles = list.tile_start[list.count];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const OptimTile tile = TileOf(list, t);
    float* __restrict__ p = list.data[0][tile.tensor] + tile.begin;
    const float* __restrict__ g = list.data[1][tile.tensor] + tile.begin;
    const uint8_t flags = list.flags[tile.tensor];
    const AdamWScalars s = (flags & kWeightDecay) ? chunk.decaying : chunk.plain;
    if (chunk.bf16_moments) {
      // Elements of 2 bytes: m and v are bf16 bits.
      auto* __restrict__ m16 = reinterpret_cast<uint16_t*>(list.data[2][tile.tensor]) + tile.begin;
      auto* __restrict__ v16 = reinterpret_cast<uint16_t*>(list.data[3][tile.tensor]) + tile.begin;
      for (int64_t j = threadIdx.x; j < tile.len; j += blockDim.x) {
        AdamWUpdateElementBf16(&p[j], g[j], &m16[j], &v16[j], s);
      }
      continue;
    }
    float* __restrict__ m = list.data[2][tile.tensor] + tile.begin;
    float* __restrict__ v = list.data[3][tile.tensor] + tile.begin;
    int64_t scalar_from = 0;
    if (flags & kAligned16) {
      // A tile starts at a multiple of kOptimTileElements, so aligned arrays stay aligned.
      const int64_t quads = tile.len / 4;
      for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
        float4 p4 = reinterpret_cast<const float4*>(p)[q];
        const float4 g4 = reinterpret_cast<const float4*>(g)[q];
        float4 m4 = reinterpret_cast<const float4*>(m)[q];
        float4 v4 = reinterpret_cast<const float4*>(v)[q];
        AdamWUpdateFour(p4, g4, m4, v4, s);
        reinterpret_cast<float4*>(p)[q] = p4;
        reinterpret_cast<float4*>(m)[q] = m4;
        reinterpret_cast<float4*>(v)[q] = v4;
      }
      scalar_from = quads * 4;
    }
    for (int64_t j = scalar_from + threadIdx.x; j < tile.len; j += blockDim.x) {
      AdamWUpdateElement(&p[j], g[j], &m[j], &v[j], s);
    }
  }
}

// Every element of the chunk's tensors *= scale.
__global__ void __launch_bounds__(kOptimThreads)
    ScaleKernel(const __grid_constant__ TensorChunk<1> list, float scale) {
  const int64_t tiles = list.tile_start[list.count];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const OptimTile tile = TileOf(list, t);
    float* __restrict__ x = list.data[0][tile.tensor] + tile.begin;
    int64_t scalar_from = 0;
    if (list.flags[tile.tensor] & kAligned16) {
      const int64_t quads = tile.len / 4;
      for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
        float4 x4 = reinterpret_cast<const float4*>(x)[q];
        x4.x = __fmul_rn(x4.x, scale);
        x4.y = __fmul_rn(x4.y, scale);
        x4.z = __fmul_rn(x4.z, scale);
        x4.w = __fmul_rn(x4.w, scale);
        reinterpret_cast<float4*>(x)[q] = x4;
      }
      scalar_from = quads * 4;
    }
    for (int64_t j = scalar_from + threadIdx.x; j < tile.len; j += blockDim.x) {
      x[j] = __fmul_rn(x[j], scale);
    }
  }
}

// *found = 1 when an element of the chunk's tensors is NaN or ±Inf (every writer writes 1, so
// the result does not depend on their order).
__global__ void __launch_bounds__(kOptimThreads)
    NonFiniteKernel(const __grid_constant__ TensorChunk<1> list, int64_t* found) {
  const int64_t tiles = list.tile_start[list.count];
  bool bad = false;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const OptimTile tile = TileOf(list, t);
    const float* __restrict__ x = list.data[0][tile.tensor] + tile.begin;
    int64_t scalar_from = 0;
    if (list.flags[tile.tensor] & kAligned16) {
      const int64_t quads = tile.len / 4;
      for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
        const float4 x4 = reinterpret_cast<const float4*>(x)[q];
        bad |= !AdamWIsFinite(x4.x) | !AdamWIsFinite(x4.y) | !AdamWIsFinite(x4.z) |
               !AdamWIsFinite(x4.w);
      }
      scalar_from = quads * 4;
    }
    for (int64_t j = scalar_from + threadIdx.x; j < tile.len; j += blockDim.x) {
      bad |= !AdamWIsFinite(x[j]);
    }
  }
  if (bad) *found = 1;
}

// block_sums[b] = the CPU's sum of block b of the flat range (optim_cpu.h): the tensors are
// data[i] (count), tensor i at flat positions [offsets[i], offsets[i + 1]), total elements.
// Threads l of each group of kNormLanes hold lane l.
__global__ void __launch_bounds__(kNormThreads)
    SquaredNormKernel(const float* const* __restrict__ data, const int64_t* __restrict__ offsets,
                      int count, int64_t total, int64_t num_blocks,
                      double* __restrict__ block_sums) {
  __shared__ double lanes[kNormThreads];
  const int lane = threadIdx.x % kNormLanes;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kNormBlocksPerCta + threadIdx.x / kNormLanes;
  double acc = 0.0;
  if (b < num_blocks) {
    const int64_t begin = b * kNormBlock;
    const int64_t end = min(total, begin + kNormBlock);
    for (int i = LastStartAtOrBelow(offsets, count, begin); i < count && offsets[i] < end; ++i) {
      const int64_t lo = max(begin, offsets[i]);
      const int64_t hi = min(end, offsets[i + 1]);
      const float* __restrict__ x = data[i] + (lo - offsets[i]);
      const int64_t len = hi - lo;  // ≤ 0 for a tensor of no elements: nothing to add
      int64_t k = lane;
      // Four loads in flight before the four (ordered, dependent) additions.
      for (; k + 3 * kNormLanes < len; k += 4 * kNormLanes) {
        const double x0 = x[k], x1 = x[k + kNormLanes];
        const double x2 = x[k + 2 * kNormLanes], x3 = x[k + 3 * kNormLanes];
        acc = __dadd_rn(acc, __dmul_rn(x0, x0));
        acc = __dadd_rn(acc, __dmul_rn(x1, x1));
        acc = __dadd_rn(acc, __dmul_rn(x2, x2));
        acc = __dadd_rn(acc, __dmul_rn(x3, x3));
      }
      for (; k < len; k += kNormLanes) {
        const double xk = x[k];
        acc = __dadd_rn(acc, __dmul_rn(xk, xk));
      }
    }
  }
  lanes[threadIdx.x] = acc;
  __syncthreads();
  if (lane == 0 && b < num_blocks) {
    double sum = 0.0;
    for (int l = 0; l < kNormLanes; ++l) sum = __dadd_rn(sum, lanes[threadIdx.x + l]);
    block_sums[b] = sum;
  }
}

// *first = min(*first, the first j with (m[j], v[j]) not a valid AdamW state).
__global__ void FirstBadMomentKernel(const float* __restrict__ m, const float* __restrict__ v,
                                     int64_t n, unsigned long long* first) {
  for (int64_t j = GridStart(); j < n; j += GridStride()) {
    if (!AdamWMomentsValid(m[j], v[j])) {
      atomicMin(first, static_cast<unsigned long long>(j));
      return;  // this thread's later elements come after j
    }
  }
}

int GridFor(const CudaOp& op, int64_t tiles) {
  return static_cast<int>(BlocksFor(
      tiles, 1, static_cast<int64_t>(op.context->multiprocessors()) * kGridStrideBlocksPerSm));
}

// Tensors [first, first + chunk->count) of the kArrays parallel lists into chunk, with their
// tiles and alignment. `count` ≤ kMaxTensorsPerLaunch.
template <int kArrays>
void FillChunk(const absl::Span<const TensorView> (&lists)[kArrays], size_t first, int count,
               TensorChunk<kArrays>* chunk) {
  chunk->count = count;
  chunk->tile_start[0] = 0;
  for (int i = 0; i < count; ++i) {
    bool aligned = true;
    for (int a = 0; a < kArrays; ++a) {
      float* data = static_cast<float*>(lists[a][first + i].raw());
      chunk->data[a][i] = data;
      aligned = aligned && reinterpret_cast<uintptr_t>(data) % 16 == 0;
    }
    const int64_t numel = lists[0][first + i].numel();
    chunk->numel[i] = numel;
    chunk->tile_start[i + 1] = chunk->tile_start[i] + OptimTilesOf(numel);
    chunk->flags[i] = aligned ? kAligned16 : 0;
  }
}

// Calls launch(first, count) for consecutive runs of at most kMaxTensorsPerLaunch tensors.
template <typename Launch>
absl::Status ForEachChunk(size_t tensors, Launch launch) {
  for (size_t first = 0; first < tensors; first += kMaxTensorsPerLaunch) {
    const int count = static_cast<int>(std::min<size_t>(kMaxTensorsPerLaunch, tensors - first));
    MOETRAIN_RETURN_IF_ERROR(launch(first, count));
  }
  return absl::OkStatus();
}

// ForEachChunk over one tensor list: fills a chunk for each run and calls launch(chunk, tiles)
// for the runs that have any tiles.
template <typename Launch>
absl::Status ForEachFilledChunk(absl::Span<const TensorView> tensors, Launch launch) {
  auto chunk = std::make_unique<TensorChunk<1>>();  // on the heap, as in AdamWStep
  const absl::Span<const TensorView> lists[1] = {tensors};
  return ForEachChunk(tensors.size(), [&](size_t first, int count) -> absl::Status {
    FillChunk(lists, first, count, chunk.get());
    const int64_t tiles = chunk->tile_start[count];
    if (tiles == 0) return absl::OkStatus();
    return launch(*chunk, tiles);
  });
}

}  // namespace

absl::Status AdamWStep(const ExecContext& ctx, const AdamWStepArgs& args) {
  if (args.params.empty()) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "adamw"));
  // On the heap: ~25 KB is more than a worker thread's stack should carry.
  auto chunk = std::make_unique<AdamWChunk>();
  chunk->decaying = args.decaying;
  chunk->plain = args.plain;
  chunk->bf16_moments = args.exp_avg[0].dtype() == DType::kBF16;
  const absl::Span<const TensorView> lists[4] = {args.params, args.grads, args.exp_avg,
                                                 args.exp_avg_sq};
  return ForEachChunk(args.params.size(), [&](size_t first, int count) -> absl::Status {
    FillChunk(lists, first, count, &chunk->tensors);
    for (int i = 0; i < count; ++i) {
      if ((*args.weight_decay)[first + i]) chunk->tensors.flags[i] |= kWeightDecay;
    }
    const int64_t tiles = chunk->tensors.tile_start[count];
    if (tiles == 0) return absl::OkStatus();
    AdamWKernel<<<GridFor(op, tiles), kOptimThreads, 0, op.stream>>>(*chunk);
    MOETRAIN_CUDA_CHECK_LAUNCH("adamw");
    return absl::OkStatus();
  });
}

absl::Status ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors,
                          float scale) {
  if (tensors.empty()) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "scale"));
  return ForEachFilledChunk(
      tensors, [&](const TensorChunk<1>& chunk, int64_t tiles) -> absl::Status {
        ScaleKernel<<<GridFor(op, tiles), kOptimThreads, 0, op.stream>>>(chunk, scale);
        MOETRAIN_CUDA_CHECK_LAUNCH("scale");
        return absl::OkStatus();
      });
}

absl::StatusOr<bool> AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  if (tensors.empty()) return true;
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "all finite"));
  // Device memory for the flag; the allocator is stream-ordered, so the kernels queued before it
  // goes out of scope still own it.
  MOETRAIN_ASSIGN_OR_RETURN(Tensor flag, Tensor::Allocate(ctx.allocator(), DType::kI64, {1}));
  auto* found = static_cast<int64_t*>(flag.view().raw());
  MOETRAIN_CUDA_RETURN_IF_ERROR("all finite",
                                cudaMemsetAsync(found, 0, sizeof(int64_t), op.stream));
  MOETRAIN_RETURN_IF_ERROR(
      ForEachFilledChunk(tensors, [&](const TensorChunk<1>& chunk, int64_t tiles) -> absl::Status {
        NonFiniteKernel<<<GridFor(op, tiles), kOptimThreads, 0, op.stream>>>(chunk, found);
        MOETRAIN_CUDA_CHECK_LAUNCH("all finite");
        return absl::OkStatus();
      }));
  int64_t host_found = 0;
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, "all finite", found, sizeof(host_found), &host_found));
  return host_found == 0;
}

absl::StatusOr<double> SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  const int64_t count = static_cast<int64_t>(tensors.size());
  if (count > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("squared norm: ", count, " tensors"));
  }
  // The table the kernel reads: the tensors' addresses, then their flat offsets (count + 1).
  std::vector<int64_t> table(2 * count + 1, 0);
  for (int64_t i = 0; i < count; ++i) {
    table[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(tensors[i].raw()));
    table[count + i + 1] = table[count + i] + tensors[i].numel();
  }
  const int64_t total = table[2 * count];
  if (total == 0) return 0.0;
  const int64_t num_blocks = (total + kNormBlock - 1) / kNormBlock;
  const int64_t ctas = (num_blocks + kNormBlocksPerCta - 1) / kNormBlocksPerCta;
  if (ctas > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("squared norm: ", total, " elements"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "squared norm"));
  const int64_t table_words = 2 * count + 1;
  MOETRAIN_ASSIGN_OR_RETURN(
      Tensor scratch, Tensor::Allocate(ctx.allocator(), DType::kI64, {table_words + num_blocks}));
  int64_t* device_table = static_cast<int64_t*>(scratch.view().raw());
  double* device_sums = reinterpret_cast<double*>(device_table + table_words);
  const size_t table_bytes = table_words * sizeof(int64_t);
  const size_t sums_bytes = num_blocks * sizeof(double);

  // The staging buffer carries the table up and the block sums down; held until both are done.
  ::moetrain::cuda::CudaContext& context = *op.context;
  absl::MutexLock lock(&context.staging_mutex());
  MOETRAIN_ASSIGN_OR_RETURN(void* staging, context.PinnedStaging(table_bytes + sums_bytes));
  char* staged_table = static_cast<char*>(staging);
  char* staged_sums = staged_table + table_bytes;
  std::memcpy(staged_table, table.data(), table_bytes);
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "squared norm",
      cudaMemcpyAsync(device_table, staged_table, table_bytes, cudaMemcpyHostToDevice, op.stream));
  SquaredNormKernel<<<static_cast<int>(ctas), kNormThreads, 0, op.stream>>>(
      reinterpret_cast<const float* const*>(device_table), device_table + count,
      static_cast<int>(count), total, num_blocks, device_sums);
  MOETRAIN_CUDA_CHECK_LAUNCH("squared norm");
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "squared norm",
      cudaMemcpyAsync(staged_sums, device_sums, sums_bytes, cudaMemcpyDeviceToHost, op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR("squared norm", cudaStreamSynchronize(op.stream));
  std::vector<double> block_sums(num_blocks);
  std::memcpy(block_sums.data(), staged_sums, sums_bytes);
  double sum = 0.0;  // the CPU's order: block 0, 1, ...
  for (const double block_sum : block_sums) sum += block_sum;
  return sum;
}

absl::Status CheckAdamWMoments(const ExecContext& ctx, std::string_view m_name, TensorView m,
                               std::string_view v_name, TensorView v) {
  const int64_t n = m.numel();
  if (n == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "adamw state"));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor scratch, Tensor::Allocate(ctx.allocator(), DType::kI64, {1}));
  auto* first = static_cast<unsigned long long*>(scratch.view().raw());
  // "None found": every bit set, above any index.
  MOETRAIN_CUDA_RETURN_IF_ERROR("adamw state",
                                cudaMemsetAsync(first, 0xFF, sizeof(*first), op.stream));
  const auto* m_data = static_cast<const float*>(m.raw());
  const auto* v_data = static_cast<const float*>(v.raw());
  FirstBadMomentKernel<<<static_cast<int>(GridStrideBlocks(n, op.context->multiprocessors())),
                         kThreadsPerBlock, 0, op.stream>>>(m_data, v_data, n, first);
  MOETRAIN_CUDA_CHECK_LAUNCH("adamw state");
  unsigned long long bad = 0;
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, "adamw state", first, sizeof(bad), &bad));
  if (bad == ~0ull) return absl::OkStatus();
  // The message names the values, as the CPU's does: read the bad element back.
  const int64_t j = static_cast<int64_t>(bad);
  float m_j = 0.0f, v_j = 0.0f;
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, "adamw state", m_data + j, sizeof(m_j), &m_j));
  MOETRAIN_RETURN_IF_ERROR(ReadToHost(op, "adamw state", v_data + j, sizeof(v_j), &v_j));
  return ::moetrain::cpu::AdamWMomentsError(m_name, v_name, j, m_j, v_j);
}

}  // namespace moetrain::ops::cuda
