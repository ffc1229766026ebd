// How the optimizer's CUDA kernels find their way in a list of tensors laid end to end, as
// host-device functions: the kernels run them, and the CPU tests check them without a GPU.
//
// The element-wise passes (AdamW, scale, NaN check) cut each tensor into tiles of
// kOptimTileElements; one block handles one tile, which never crosses a tensor. SquaredNorm
// instead follows the CPU's fixed blocks over the flat range (optim_cpu.h), which do.
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_MULTI_TENSOR_MATH_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_MULTI_TENSOR_MATH_H_

#include <stdint.h>

#include "engine/core/host_device.h"

namespace moetrain {

// Elements per tile: 256 threads × 4-element vectors × 4 rounds, so a block moves enough bytes
// per tile to amortise its search for the tile's tensor.
inline constexpr int64_t kOptimTileElements = 4096;

MOETRAIN_HOST_DEVICE int64_t OptimTilesOf(int64_t numel) {
  return (numel + kOptimTileElements - 1) / kOptimTileElements;
}

// The last i in [0, count) with starts[i] ≤ x, for non-decreasing starts with starts[0] ≤ x:
// the tensor holding flat position x (or tile x) when starts[i] is tensor i's first one. Among
// tensors that start at x, the last is the one holding it (the others have no elements), as
// std::upper_bound(starts, x) − 1 on the CPU.
MOETRAIN_HOST_DEVICE int LastStartAtOrBelow(const int64_t* starts, int count, int64_t x) {
  int lo = 0, hi = count;  // starts[lo] ≤ x; the answer is in [lo, hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (starts[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Tile `tile` (0 ≤ tile < tile_start[count]) of `count` tensors of numel[i] elements, whose
// first tiles are tile_start[i] (tile_start[i + 1] = tile_start[i] + OptimTilesOf(numel[i])):
// elements [begin, begin + len) of tensor `tensor`, 1 ≤ len ≤ kOptimTileElements.
struct OptimTile {
  int tensor;
  int64_t begin;
  int64_t len;
};
MOETRAIN_HOST_DEVICE OptimTile OptimTileOf(const int64_t* tile_start, const int64_t* numel,
                                           int count, int64_t tile) {
  const int i = LastStartAtOrBelow(tile_start, count, tile);
  const int64_t begin = (tile - tile_start[i]) * kOptimTileElements;
  const int64_t rest = numel[i] - begin;
  return {i, begin, rest < kOptimTileElements ? rest : kOptimTileElements};
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_MULTI_TENSOR_MATH_H_
