// Launch geometry of the ops' CUDA kernels, as plain functions the CPU tests check (no CUDA
// types): how many blocks cover n items, capped for grid-stride loops.
#ifndef MOETRAIN_ENGINE_OPS_COMMON_LAUNCH_GEOMETRY_H_
#define MOETRAIN_ENGINE_OPS_COMMON_LAUNCH_GEOMETRY_H_

#include <cstdint>

namespace moetrain::ops {

// Threads per block of the element-wise and row kernels.
inline constexpr int kThreadsPerBlock = 256;
// Blocks per SM a grid-stride kernel is given: enough to hide latency, few enough that each
// thread loops a while.
inline constexpr int kGridStrideBlocksPerSm = 8;

// Blocks of `threads` covering `items` (≥ 0), at least 1, at most `max_blocks` (a grid-stride
// kernel loops over the rest).
constexpr int64_t BlocksFor(int64_t items, int threads, int64_t max_blocks) {
  const int64_t needed = (items + threads - 1) / threads;
  return needed < 1 ? 1 : (needed > max_blocks ? max_blocks : needed);
}

// The grid of a grid-stride kernel over `items` on a device of `multiprocessors` SMs.
constexpr int64_t GridStrideBlocks(int64_t items, int multiprocessors,
                                   int threads = kThreadsPerBlock) {
  return BlocksFor(items, threads, static_cast<int64_t>(multiprocessors) * kGridStrideBlocksPerSm);
}

// Whether rows of `columns` elements of `element_bytes` at `base` can be moved in 16-byte
// vectors: the base and every row's start 16-byte aligned.
constexpr bool CanUse16ByteVectors(uint64_t base, int64_t columns, int element_bytes) {
  return base % 16 == 0 && (columns * element_bytes) % 16 == 0;
}

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_COMMON_LAUNCH_GEOMETRY_H_
