// Device helpers the ops' element-wise and row kernels share (included by .cu files only): the
// grid-stride loop's start and stride over 64-bit indices, and act elements (f32, or bf16 held as
// its 16 bits) read as f32 and written from f32, rounded to nearest even (dtype_math.h, as on the
// CPU).
#ifndef MOETRAIN_ENGINE_OPS_COMMON_CUDA_ELEMENTS_CUH_
#define MOETRAIN_ENGINE_OPS_COMMON_CUDA_ELEMENTS_CUH_

#include <cstdint>

#include "engine/core/dtype_math.h"

namespace moetrain::ops::cuda {

__device__ __forceinline__ int64_t GridStart() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float LoadAct(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadAct(const uint16_t* p, int64_t i) {
  return BF16BitsToFloat(p[i]);
}
__device__ __forceinline__ void StoreAct(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void StoreAct(uint16_t* p, int64_t i, float v) {
  p[i] = FloatToBF16Bits(v);
}

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_COMMON_CUDA_ELEMENTS_CUH_
