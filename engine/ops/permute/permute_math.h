// The per-element steps of the combine family (permute.h) that the CPU and the CUDA kernels share,
// so that both sum in the same order with the same operations.
#ifndef MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_MATH_H_
#define MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_MATH_H_

#include "engine/core/host_device.h"

namespace moetrain {

// acc + weight·value: one term of every combine sum. Written as one expression so that each
// compiler fuses it the same way wherever it can (nvcc always; GCC in the FMA clones).
MOETRAIN_HOST_DEVICE float AddWeighted(float acc, float weight, float value) {
  return acc + weight * value;
}

// The dot products of CombineRowsBackward (the router weights' gradient) are summed in this many
// interleaved partial sums: element i of the first D − D mod 16 goes into partial i mod 16, the
// rest into partial 0, in column order; then the partials are added in lane order from 0. A fixed
// order that vectorises on the CPU and maps onto 16 lanes of a warp on the GPU.
inline constexpr int kDotLanes = 16;

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_PERMUTE_PERMUTE_MATH_H_
