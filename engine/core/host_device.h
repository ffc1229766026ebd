// MOETRAIN_HOST_DEVICE marks the per-element math that the CPU and the CUDA kernels share: under
// nvcc it compiles for both (__host__ __device__, force-inlined); under the host compiler it is an
// always-inlined function, so that it disappears into the CPU's vectorised loops. Written once,
// the CPU tests then check the very math the GPU runs (engine/ops/*/..._math.h, core/*_math.h).
//
// Rules for such functions: no std:: algorithms or containers (they are host-only), no
// exceptions, no errno; std::exp and the like become their C names (expf, logf), which are the
// same functions on the host.
#ifndef MOETRAIN_ENGINE_CORE_HOST_DEVICE_H_
#define MOETRAIN_ENGINE_CORE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define MOETRAIN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MOETRAIN_HOST_DEVICE inline __attribute__((always_inline))
#endif

#endif  // MOETRAIN_ENGINE_CORE_HOST_DEVICE_H_
