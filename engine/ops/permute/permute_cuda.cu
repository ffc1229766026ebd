// The CUDA side of permute.h. Every kernel writes each output element once, from one thread, in
// the CPU backend's order of operations (permute_math.h), so results do not depend on the launch
// geometry and repeat bit for bit; no floating-point atomics. Row and element offsets are int64:
// rows × columns can pass 2^31.
//
// BuildPermutation ranks each (token, slot) pair among its expert's pairs with a block-wide
// prefix count (one block per expert, scanning the T·k pairs in (token, slot) order): the pair's
// row is its expert's first row plus that rank, the pair dropped when the rank reaches the rows
// the host's offsets give the expert. That is the CPU's stable counting sort, dropless and
// first-come (kPosition) alike. For kProbability with an expert filled to its capacity (so that it
// may have dropped pairs) the pairs are ranked by weight instead: the maps are then built on the
// host by the CPU backend from copies of the routing and copied back (the routing is small, T·k,
// and the op waits for the device anyway to check the offsets).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/dtype.h"
#include "engine/core/dtype_math.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/permute/permute_cpu.h"
#include "engine/ops/permute/permute_cuda.h"
#include "engine/ops/permute/permute_math.h"

namespace moetrain::ops::cuda {
namespace {

// Threads of the block that ranks one expert's pairs (a multiple of 32, at most 32 warps).
constexpr int kRankThreads = 512;
constexpr int kRankWarps = kRankThreads / 32;
// Threads per row of the gather and the forward combines.
constexpr int kRowThreads = 128;
// Most threads of a CombineRowsBackward block: kDotLanes per pair, up to 16 pairs at a time.
constexpr int kBackwardMaxThreads = 256;
static_assert(kBackwardMaxThreads % 32 == 0 && 32 % kDotLanes == 0);

// No error found, in the error words of the permutation check (their initial bytes are 0xFF).
constexpr unsigned long long kNoError = ~0ull;
// The check's scratch words (i64): the first bad position of expert_order, the first bad pair of
// topk_experts, the first position whose kept rows disagree with the offsets; then (E) the pairs
// routed to each position.
constexpr int kBadOrder = 0, kBadExpert = 1, kBadOffsets = 2, kNumErrorWords = 3;

// The grid of a kernel that gives each of `items` rows one block (grid-stride beyond the limit).
int RowBlocks(int64_t items) { return static_cast<int>(BlocksFor(items, 1, INT_MAX)); }

// --- BuildPermutation ---------------------------------------------------------------------------

// Block e (one per expert): the pairs p = t·k + j with experts[p] == e, in p order, take the rows
// offsets[pos] + rank of expert e's position pos (= order[e], or e) while rank < the position's
// rows; the rest stay dropped (pair_row was set to -1 before). counts[pos] = the expert's pairs.
// A position outside [0, E) (a bad order, which the check reports) ranks nothing.
__global__ void __launch_bounds__(kRankThreads)
    RankPairsKernel(const int32_t* __restrict__ experts, int64_t pairs, int64_t k,
                    const int32_t* __restrict__ order, int64_t num_experts,
                    const int64_t* __restrict__ offsets, int32_t* __restrict__ pair_row,
                    int32_t* __restrict__ row_token, int64_t* __restrict__ counts) {
  __shared__ int warp_counts[kRankWarps];
  const int expert = static_cast<int>(blockIdx.x);
  const int64_t pos = order != nullptr ? order[expert] : expert;
  if (pos < 0 || pos >= num_experts) return;  // the whole block leaves: no barrier is skipped
  const int64_t first_row = offsets[pos];
  const int64_t rows = offsets[pos + 1] - first_row;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t before_chunk = 0;  // the expert's pairs in earlier chunks (the same in every thread)
  for (int64_t chunk = 0; chunk < pairs; chunk += kRankThreads) {
    const int64_t p = chunk + threadIdx.x;
    const bool mine = p < pairs && experts[p] == expert;
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before_warp = 0, in_chunk = 0;
    for (int w = 0; w < kRankWarps; ++w) {
      before_warp += w < warp ? warp_counts[w] : 0;
      in_chunk += warp_counts[w];
    }
    __syncthreads();  // every thread has read warp_counts before the next chunk rewrites it
    if (mine) {
      const int64_t rank = before_chunk + before_warp + __popc(ballot & ((1u << lane) - 1u));
      if (rank < rows) {
        const int64_t row = first_row + rank;
        pair_row[p] = static_cast<int32_t>(row);
        row_token[row] = static_cast<int32_t>(p / k);
      }
    }
    before_chunk += in_chunk;
  }
  if (threadIdx.x == 0) counts[pos] = before_chunk;
}

// The checks of the CPU backend, as the lowest bad index of each kind (integer atomicMin: the
// same result in any order). errors[kBadExpert] over a grid-stride loop; block 0 also checks the
// order (O(E²), E is small) and each position's rows against min(its pairs, capacity).
__global__ void CheckPermutationKernel(const int32_t* __restrict__ experts, int64_t pairs,
                                       const int32_t* __restrict__ order, int64_t num_experts,
                                       int64_t capacity, const int64_t* __restrict__ offsets,
                                       const int64_t* __restrict__ counts,
                                       unsigned long long* __restrict__ errors) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    if (experts[p] < 0 || experts[p] >= num_experts)
      atomicMin(&errors[kBadExpert], static_cast<unsigned long long>(p));
  }
  if (blockIdx.x != 0) return;
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    if (order != nullptr) {
      const int32_t pos = order[e];
      bool bad = pos < 0 || pos >= num_experts;
      for (int64_t earlier = 0; earlier < e && !bad; ++earlier) bad = order[earlier] == pos;
      if (bad) atomicMin(&errors[kBadOrder], static_cast<unsigned long long>(e));
    }
    const int64_t kept = counts[e] < capacity ? counts[e] : capacity;
    if (kept != offsets[e + 1] - offsets[e])
      atomicMin(&errors[kBadOffsets], static_cast<unsigned long long>(e));
  }
}

// One i32 of device memory, read by the host (an error path: it waits for the device).
absl::StatusOr<int32_t> ReadInt(const CudaOp& op, const int32_t* device, void* staging) {
  MOETRAIN_CUDA_RETURN_IF_ERROR("permutation", cudaMemcpyAsync(staging, device, sizeof(int32_t),
                                                               cudaMemcpyDeviceToHost, op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR("permutation", cudaStreamSynchronize(op.stream));
  int32_t value;
  std::memcpy(&value, staging, sizeof(value));
  return value;
}

// kProbability with pairs to drop: the CPU backend on host copies (see the file comment).
absl::Status BuildPermutationOnHost(const ExecContext& ctx, const MoeConfig& config,
                                    const PermutationArgs& args, Permutation* out) {
  const int64_t num_experts = config.num_experts;
  auto host_copy = [&](const TensorView& device, Tensor* host) -> absl::Status {
    *host = Tensor::Empty(device.dtype(), device.shape());
    return CopyTensor(ctx, device, *host);
  };
  Tensor experts, weights, order;
  MOETRAIN_RETURN_IF_ERROR(host_copy(args.topk_experts, &experts));
  MOETRAIN_RETURN_IF_ERROR(host_copy(args.topk_weights, &weights));
  if (!args.expert_order.empty()) MOETRAIN_RETURN_IF_ERROR(host_copy(args.expert_order, &order));
  Permutation host;
  host.expert_offsets = Tensor::Empty(DType::kI64, {num_experts + 1});
  host.row_token = Tensor::Empty(DType::kI32, {args.expert_offsets.back()});
  host.pair_row = Tensor::Empty(DType::kI32, {experts.dim(0), experts.dim(1)});
  MOETRAIN_RETURN_IF_ERROR(::moetrain::cpu::BuildPermutation(config,
                                                             {.topk_experts = experts,
                                                              .topk_weights = weights,
                                                              .expert_offsets = args.expert_offsets,
                                                              .expert_order = order},
                                                             &host));
  // Host-to-device copies wait for the device before returning, so `host` may go after them.
  MOETRAIN_RETURN_IF_ERROR(CopyTensor(ctx, host.expert_offsets, out->expert_offsets));
  if (host.row_token.numel() > 0) {
    MOETRAIN_RETURN_IF_ERROR(CopyTensor(ctx, host.row_token, out->row_token));
  }
  if (host.pair_row.numel() > 0) {
    MOETRAIN_RETURN_IF_ERROR(CopyTensor(ctx, host.pair_row, out->pair_row));
  }
  return absl::OkStatus();
}

// --- GatherRows ---------------------------------------------------------------------------------

// dst row r = src row index[r], in units of Vec (16-byte vectors, or single elements); a row whose
// index is outside [0, src_rows) is zeroed (never read out of bounds).
template <typename Vec>
__global__ void __launch_bounds__(kRowThreads)
    GatherRowsKernel(const Vec* __restrict__ src, int64_t src_rows,
                     const int32_t* __restrict__ index, Vec* __restrict__ dst, int64_t rows,
                     int64_t units_per_row) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = index[r];
    Vec* out = dst + r * units_per_row;
    if (t < 0 || t >= src_rows) {
      for (int64_t c = threadIdx.x; c < units_per_row; c += blockDim.x) out[c] = Vec{};
      continue;
    }
    const Vec* in = src + static_cast<int64_t>(t) * units_per_row;
    for (int64_t c = threadIdx.x; c < units_per_row; c += blockDim.x) out[c] = in[c];
  }
}

template <typename Vec>
absl::Status LaunchGather(const CudaOp& op, const TensorView& src, const TensorView& index,
                          const TensorView& dst, int64_t units_per_row) {
  const int64_t rows = index.dim(0);
  GatherRowsKernel<Vec><<<RowBlocks(rows), kRowThreads, 0, op.stream>>>(
      static_cast<const Vec*>(src.raw()), src.dim(0), static_cast<const int32_t*>(index.raw()),
      static_cast<Vec*>(dst.raw()), rows, units_per_row);
  MOETRAIN_CUDA_CHECK_LAUNCH("gather");
  return absl::OkStatus();
}

// --- CombineRows and SumPairRows ----------------------------------------------------------------

// Whether pair row `row` is one to follow: -1 is a dropped pair; beyond R is a bad map, skipped.
__device__ __forceinline__ bool Follows(int32_t row, int64_t num_rows) {
  return row >= 0 && row < num_rows;
}

// out_t = (extra_t or 0) + Σ_j weights[t, j]·rows[pair_row[t, j]], j in slot order: the CPU's
// order (its row starts as extra, then one AxpyRow per slot).
template <typename Out>
__global__ void __launch_bounds__(kRowThreads)
    CombineRowsKernel(const float* __restrict__ rows, int64_t num_rows,
                      const int32_t* __restrict__ pair_row, const float* __restrict__ weights,
                      const float* __restrict__ extra, Out* __restrict__ out, int64_t tokens,
                      int64_t k, int64_t d) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int32_t* token_rows = pair_row + t * k;
    const float* token_weights = weights + t * k;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = extra != nullptr ? extra[t * d + c] : 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = token_rows[j];
        if (!Follows(row, num_rows)) continue;
        acc = AddWeighted(acc, token_weights[j], rows[static_cast<int64_t>(row) * d + c]);
      }
      StoreAct(out, t * d + c, acc);
    }
  }
}

// The addends of SumPairRows, by value in the kernel's arguments.
struct SumAddends {
  const float* data[kMaxSumAddends];
  int count;
};

// out_t = 0 + Σ_j 1·rows[pair_row[t, j]] + Σ_a 1·addends[a]_t, in that order (the CPU's AxpyRow
// with weight 1).
template <typename Out>
__global__ void __launch_bounds__(kRowThreads)
    SumPairRowsKernel(const float* __restrict__ rows, int64_t num_rows,
                      const int32_t* __restrict__ pair_row, SumAddends addends,
                      Out* __restrict__ out, int64_t tokens, int64_t k, int64_t d) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int32_t* token_rows = pair_row + t * k;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = token_rows[j];
        if (!Follows(row, num_rows)) continue;
        acc = AddWeighted(acc, 1.0f, rows[static_cast<int64_t>(row) * d + c]);
      }
      // Unrolled so that the pointers stay in the kernel's parameters (no local copy).
#pragma unroll
      for (int a = 0; a < kMaxSumAddends; ++a) {
        if (a < addends.count) acc = AddWeighted(acc, 1.0f, addends.data[a][t * d + c]);
      }
      StoreAct(out, t * d + c, acc);
    }
  }
}

// --- CombineRowsBackward ------------------------------------------------------------------------

// Block t, in groups of kDotLanes threads, one pair (t, j) per group at a time: d_rows[row] =
// w·d_out_t and d_weights[t, j] = ⟨d_out_t, rows[row]⟩ summed as the CPU's ScaleAndDotRow does
// (permute_math.h): lane l holds partial l over columns l, l + 16, ... of the first D − D mod 16,
// lane 0 adds the remaining columns in order, then lane 0 adds the 16 partials in lane order.
// Each element of y is read by the thread that then writes the same element of d_y, after the
// read, and rows and d_rows are not declared unaliased: d_rows may be rows (f32) in place, as on
// the CPU. d_out (In) and d_rows (Out) are each f32 or bf16, not necessarily the same.
template <typename In, typename Out>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    CombineRowsBackwardKernel(const In* __restrict__ d_out, const float* rows, int64_t num_rows,
                              const int32_t* __restrict__ pair_row,
                              const float* __restrict__ weights, Out* d_rows,
                              float* __restrict__ d_weights, int64_t tokens, int64_t k, int64_t d) {
  __shared__ float partials[kBackwardMaxThreads];
  const int lane = threadIdx.x % kDotLanes;
  const int group = threadIdx.x / kDotLanes;
  const int groups = blockDim.x / kDotLanes;
  // The lanes of this group within its warp (kDotLanes = 16: one half of the warp).
  const unsigned group_mask = ((1u << kDotLanes) - 1u)
                              << (threadIdx.x % 32 / kDotLanes * kDotLanes);
  const int64_t full = d - d % kDotLanes;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const In* g = d_out + t * d;
    for (int64_t j = group; j < k; j += groups) {
      const int64_t pair = t * k + j;
      const int32_t row = pair_row[pair];
      if (!Follows(row, num_rows)) {
        if (lane == 0) d_weights[pair] = 0.0f;
        continue;  // the whole group takes this branch (one pair per group)
      }
      const float w = weights[pair];
      const float* y = rows + static_cast<int64_t>(row) * d;
      Out* dy = d_rows + static_cast<int64_t>(row) * d;
      float partial = 0.0f;
      for (int64_t i = lane; i < full; i += kDotLanes) {
        const float gi = LoadAct(g, i);
        partial = AddWeighted(partial, gi, y[i]);
        StoreAct(dy, i, w * gi);
      }
      if (lane == 0) {  // the last D mod 16 columns, in order, as the CPU's tail loop
                        // At most 15 columns; not unrolled (ptxas spilled a register unrolling it).
#pragma unroll 1
        for (int64_t i = full; i < d; ++i) {
          const float gi = LoadAct(g, i);
          partial = AddWeighted(partial, gi, y[i]);
          StoreAct(dy, i, w * gi);
        }
      }
      partials[threadIdx.x] = partial;
      __syncwarp(group_mask);
      if (lane == 0) {
        float dot = 0.0f;
        for (int l = 0; l < kDotLanes; ++l) dot += partials[threadIdx.x + l];
        d_weights[pair] = dot;
      }
      __syncwarp(group_mask);  // lane 0 has read the partials before the group's next pair
    }
  }
}

}  // namespace

absl::Status BuildPermutation(const ExecContext& ctx, const MoeConfig& config,
                              const PermutationArgs& args, Permutation* out) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "permutation"));
  const int64_t num_experts = config.num_experts, k = config.top_k;
  const int64_t tokens = args.topk_experts.dim(0), pairs = tokens * k;
  const int64_t capacity = ExpertCapacity(config, tokens);
  const absl::Span<const int64_t> offsets = args.expert_offsets;
  if (NeedsWeightRanking(config, tokens, offsets)) {
    return BuildPermutationOnHost(ctx, config, args, out);
  }
  // No pair is ranked by weight from here on: with valid offsets each expert keeps either all its
  // pairs or its first `rows`, which the check below verifies.
  if (num_experts > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("permutation: ", num_experts, " experts"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(Tensor scratch, Tensor::Allocate(ctx.allocator(), DType::kI64,
                                                             {kNumErrorWords + num_experts}));
  auto* errors = static_cast<unsigned long long*>(scratch.view().raw());
  auto* counts = static_cast<int64_t*>(scratch.view().raw()) + kNumErrorWords;
  auto* device_offsets = static_cast<int64_t*>(out->expert_offsets.view().raw());
  const auto* experts = static_cast<const int32_t*>(args.topk_experts.raw());
  const auto* order = static_cast<const int32_t*>(args.expert_order.raw());  // null when empty
  const size_t offsets_bytes = (num_experts + 1) * sizeof(int64_t);
  const size_t scratch_bytes = (kNumErrorWords + num_experts) * sizeof(int64_t);

  // The staging buffer carries the offsets up and the check's words down; held until read.
  ::moetrain::cuda::CudaContext& context = *op.context;
  absl::MutexLock lock(&context.staging_mutex());
  MOETRAIN_ASSIGN_OR_RETURN(void* staging,
                            context.PinnedStaging(offsets_bytes + scratch_bytes + sizeof(int64_t)));
  char* staged_offsets = static_cast<char*>(staging);
  char* staged_scratch = staged_offsets + offsets_bytes;
  char* staged_value = staged_scratch + scratch_bytes;
  std::memcpy(staged_offsets, offsets.data(), offsets_bytes);
  MOETRAIN_CUDA_RETURN_IF_ERROR("permutation",
                                cudaMemcpyAsync(device_offsets, staged_offsets, offsets_bytes,
                                                cudaMemcpyHostToDevice, op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "permutation", cudaMemsetAsync(errors, 0xFF, kNumErrorWords * sizeof(int64_t), op.stream));
  MOETRAIN_CUDA_RETURN_IF_ERROR(
      "permutation", cudaMemsetAsync(counts, 0, num_experts * sizeof(int64_t), op.stream));
  if (pairs > 0) {
    // -1 (dropped) in every pair first: all bytes 0xFF.
    MOETRAIN_CUDA_RETURN_IF_ERROR(
        "permutation",
        cudaMemsetAsync(out->pair_row.view().raw(), 0xFF, pairs * sizeof(int32_t), op.stream));
  }
  RankPairsKernel<<<static_cast<int>(num_experts), kRankThreads, 0, op.stream>>>(
      experts, pairs, k, order, num_experts, device_offsets,
      static_cast<int32_t*>(out->pair_row.view().raw()),
      static_cast<int32_t*>(out->row_token.view().raw()), counts);
  MOETRAIN_CUDA_CHECK_LAUNCH("permutation");
  CheckPermutationKernel<<<static_cast<int>(GridStrideBlocks(pairs, context.multiprocessors())),
                           kThreadsPerBlock, 0, op.stream>>>(
      experts, pairs, order, num_experts, capacity, device_offsets, counts, errors);
  MOETRAIN_CUDA_CHECK_LAUNCH("permutation");
  MOETRAIN_CUDA_RETURN_IF_ERROR("permutation",
                                cudaMemcpyAsync(staged_scratch, scratch.view().raw(), scratch_bytes,
                                                cudaMemcpyDeviceToHost, op.stream));
  MOETRAIN_RETURN_IF_ERROR(context.Synchronize());

  unsigned long long found[kNumErrorWords];
  std::memcpy(found, staged_scratch, sizeof(found));
  // Reported in the CPU backend's order: the order, the routing, then the offsets.
  if (found[kBadOrder] != kNoError) {
    const int64_t e = static_cast<int64_t>(found[kBadOrder]);
    MOETRAIN_ASSIGN_OR_RETURN(const int32_t pos, ReadInt(op, order + e, staged_value));
    return absl::InvalidArgumentError(absl::StrCat("expert_order[", e, "] = ", pos,
                                                   " repeats a position or is outside [0, ",
                                                   num_experts, ")"));
  }
  if (found[kBadExpert] != kNoError) {
    const int64_t p = static_cast<int64_t>(found[kBadExpert]);
    MOETRAIN_ASSIGN_OR_RETURN(const int32_t expert, ReadInt(op, experts + p, staged_value));
    return absl::InvalidArgumentError(absl::StrCat(
        "topk_experts[", p / k, ", ", p % k, "] = ", expert, " is outside [0, ", num_experts, ")"));
  }
  if (found[kBadOffsets] != kNoError) {
    const int64_t e = static_cast<int64_t>(found[kBadOffsets]);
    int64_t routed;
    std::memcpy(&routed, staged_scratch + (kNumErrorWords + e) * sizeof(int64_t), sizeof(routed));
    return absl::InvalidArgumentError(absl::StrCat(
        "expert_offsets: position ", e, " keeps ", std::min(routed, capacity), " of its ", routed,
        " pairs, but the offsets give it ", offsets[e + 1] - offsets[e], " rows"));
  }
  return absl::OkStatus();
}

absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "gather"));
  const int64_t rows = index.dim(0), cols = src.dim(1);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const int element_bytes = static_cast<int>(DTypeSize(src.dtype()));
  const bool vectors =
      CanUse16ByteVectors(reinterpret_cast<uintptr_t>(src.raw()), cols, element_bytes) &&
      CanUse16ByteVectors(reinterpret_cast<uintptr_t>(dst.raw()), cols, element_bytes);
  if (vectors) return LaunchGather<uint4>(op, src, index, dst, cols * element_bytes / 16);
  if (element_bytes == 2) return LaunchGather<uint16_t>(op, src, index, dst, cols);
  return LaunchGather<uint32_t>(op, src, index, dst, cols);
}

absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "combine"));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  if (tokens == 0 || d == 0) return absl::OkStatus();
  const auto* r = static_cast<const float*>(rows.raw());
  const auto* p = static_cast<const int32_t*>(pair_row.raw());
  const auto* w = static_cast<const float*>(weights.raw());
  const auto* x = extra.empty() ? nullptr : static_cast<const float*>(extra.raw());
  if (out.dtype() == DType::kBF16) {
    CombineRowsKernel<<<RowBlocks(tokens), kRowThreads, 0, op.stream>>>(
        r, rows.dim(0), p, w, x, static_cast<uint16_t*>(out.raw()), tokens, k, d);
  } else {
    CombineRowsKernel<<<RowBlocks(tokens), kRowThreads, 0, op.stream>>>(
        r, rows.dim(0), p, w, x, static_cast<float*>(out.raw()), tokens, k, d);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("combine");
  return absl::OkStatus();
}

absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "combine backward"));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  if (tokens == 0 || k == 0) return absl::OkStatus();
  // One group of kDotLanes threads per slot, up to the block's limit, in whole warps.
  const int64_t groups = std::min<int64_t>(k, kBackwardMaxThreads / kDotLanes);
  const int threads = static_cast<int>((groups * kDotLanes + 31) / 32 * 32);
  const auto* r = static_cast<const float*>(rows.raw());
  const auto* p = static_cast<const int32_t*>(pair_row.raw());
  const auto* w = static_cast<const float*>(weights.raw());
  auto* dw = static_cast<float*>(d_weights.raw());
  auto launch = [&](const auto* d_out_data, auto* d_rows_data) {
    CombineRowsBackwardKernel<<<RowBlocks(tokens), threads, 0, op.stream>>>(
        d_out_data, r, rows.dim(0), p, w, d_rows_data, dw, tokens, k, d);
  };
  const bool bf16_in = d_out.dtype() == DType::kBF16, bf16_out = d_rows.dtype() == DType::kBF16;
  const auto* in_bf16 = static_cast<const uint16_t*>(d_out.raw());
  const auto* in_f32 = static_cast<const float*>(d_out.raw());
  auto* out_bf16 = static_cast<uint16_t*>(d_rows.raw());
  auto* out_f32 = static_cast<float*>(d_rows.raw());
  if (bf16_in && bf16_out) {
    launch(in_bf16, out_bf16);
  } else if (bf16_in) {
    launch(in_bf16, out_f32);
  } else if (bf16_out) {
    launch(in_f32, out_bf16);
  } else {
    launch(in_f32, out_f32);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("combine backward");
  return absl::OkStatus();
}

absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "sum rows"));
  if (addends.size() > static_cast<size_t>(kMaxSumAddends)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sum rows: ", addends.size(), " addends, the CUDA backend takes at most ", kMaxSumAddends));
  }
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  if (tokens == 0 || d == 0) return absl::OkStatus();
  SumAddends sum_addends{};
  sum_addends.count = static_cast<int>(addends.size());
  for (size_t a = 0; a < addends.size(); ++a) {
    sum_addends.data[a] = static_cast<const float*>(addends[a].raw());
  }
  const auto* r = static_cast<const float*>(rows.raw());
  const auto* p = static_cast<const int32_t*>(pair_row.raw());
  if (out.dtype() == DType::kBF16) {
    SumPairRowsKernel<<<RowBlocks(tokens), kRowThreads, 0, op.stream>>>(
        r, rows.dim(0), p, sum_addends, static_cast<uint16_t*>(out.raw()), tokens, k, d);
  } else {
    SumPairRowsKernel<<<RowBlocks(tokens), kRowThreads, 0, op.stream>>>(
        r, rows.dim(0), p, sum_addends, static_cast<float*>(out.raw()), tokens, k, d);
  }
  MOETRAIN_CUDA_CHECK_LAUNCH("sum rows");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
