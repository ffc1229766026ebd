// One correctly rounded f32 operation each, for the math the CPU and the CUDA kernels share
// (host_device.h): the plain operator on the host (whose callers that could fuse a multiply-add
// are compiled without contraction), the IEEE round-to-nearest intrinsic on the device, which nvcc
// never contracts into an FMA and which -use_fast_math, -prec-div and -prec-sqrt do not relax.
// So both sides give the same bits (adamw_math.h, fp8_math.h).
#ifndef MOETRAIN_ENGINE_CORE_RN_MATH_H_
#define MOETRAIN_ENGINE_CORE_RN_MATH_H_

#include <math.h>

#include "engine/core/host_device.h"

namespace moetrain {

MOETRAIN_HOST_DEVICE float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MOETRAIN_HOST_DEVICE float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MOETRAIN_HOST_DEVICE float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MOETRAIN_HOST_DEVICE float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// IEEE √ on both sides (sqrtss on x86-64; std::sqrt is the same correctly rounded function).
MOETRAIN_HOST_DEVICE float SqrtRn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return sqrtf(x);
#endif
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_RN_MATH_H_
