// SwiGLU per element, for the CPU and CUDA kernels alike: silu(g)·u with silu(g) = g·σ(g), and
// its derivative silu'(g) = σ(g)·(1 + g·(1 − σ(g))), σ through FastExp. The devices run the same
// operations; where a compiler fuses a multiply-add (nvcc by default, the CPU's x86-64-v3/v4
// clones) the last bit can differ.
#ifndef MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_MATH_H_
#define MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_MATH_H_

#include "engine/core/fast_math.h"
#include "engine/core/host_device.h"

namespace moetrain {

MOETRAIN_HOST_DEVICE float SwigluSigmoid(float x) { return 1.0f / (1.0f + FastExp(-x)); }

// silu(gate) · up.
MOETRAIN_HOST_DEVICE float SwigluForwardValue(float gate, float up) {
  return gate * SwigluSigmoid(gate) * up;
}

// The gradients of silu(gate) · up for the output gradient d.
MOETRAIN_HOST_DEVICE void SwigluBackwardValue(float gate, float up, float d, float* d_gate,
                                              float* d_up) {
  const float s = SwigluSigmoid(gate);
  *d_up = d * gate * s;
  *d_gate = d * up * s * (1.0f + gate * (1.0f - s));
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_SWIGLU_SWIGLU_MATH_H_
