// The AdamW update per element, for the CPU and CUDA kernels alike (train/optimizer.h defines
// the step; AdamWScalars carries its per-step numbers). Every operation rounds on its own, in
// this order, on both sides, so every CPU and every GPU give the same bits:
// - the CPU's loops that inline these are compiled with MOETRAIN_NO_FP_CONTRACT, so no clone fuses
//   a multiply-add;
// - on the device nvcc would fuse a·b + c into an FMA (its default), so the arithmetic goes
//   through MulRn, AddRn, SubRn, DivRn and SqrtRn (engine/core/rn_math.h), which are the IEEE
//   round-to-nearest intrinsics there (never fused, and exact division and square root whatever
//   -prec-div/-prec-sqrt say).
//   m ← β1·m + (1 − β1)·g,  v ← β2·v + (1 − β2)·g²,
//   p ← p·decay − step_size · m / (√v · inv_sqrt_bias2 + eps).
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_

#include <math.h>
#include <string.h>

#include "engine/core/dtype_math.h"
#include "engine/core/host_device.h"
#include "engine/core/rn_math.h"

namespace moetrain {

// The f32 scalars of one AdamW step.
struct AdamWScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;       // lr / (1 − β1^t)
  float inv_sqrt_bias2;  // 1 / √(1 − β2^t): √v̂ = √v · inv_sqrt_bias2
  float eps;
  float decay;  // 1 − lr·wd, or exactly 1 for parameters without weight decay
};

MOETRAIN_HOST_DEVICE void AdamWMoments(float g, float* m, float* v, const AdamWScalars& s) {
  *m = AddRn(MulRn(s.beta1, *m), MulRn(s.one_minus_beta1, g));
  *v = AddRn(MulRn(s.beta2, *v), MulRn(s.one_minus_beta2, MulRn(g, g)));
}

// The new parameter from the updated m and √v.
MOETRAIN_HOST_DEVICE float AdamWParameter(float p, float m, float sqrt_v, const AdamWScalars& s) {
  const float denom = AddRn(MulRn(sqrt_v, s.inv_sqrt_bias2), s.eps);
  return SubRn(MulRn(p, s.decay), MulRn(s.step_size, DivRn(m, denom)));
}

// The whole update of one element.
MOETRAIN_HOST_DEVICE void AdamWUpdateElement(float* p, float g, float* m, float* v,
                                             const AdamWScalars& s) {
  AdamWMoments(g, m, v, s);
  *p = AdamWParameter(*p, *m, SqrtRn(*v), s);
}

// The same update with the moments kept in bf16 (train.optimizer.moment_dtype = BF16, as
// DeepSeek-V3 keeps them): m and v widen to f32 exactly, update in f32 as above, and the parameter
// takes the f32 m and √v; only the stored moments round, to nearest even.
MOETRAIN_HOST_DEVICE void AdamWUpdateElementBf16(float* p, float g, uint16_t* m, uint16_t* v,
                                                 const AdamWScalars& s) {
  float mf = BF16BitsToFloat(*m), vf = BF16BitsToFloat(*v);
  AdamWUpdateElement(p, g, &mf, &vf, s);
  *m = FloatToBF16Bits(mf);
  *v = FloatToBF16Bits(vf);
}

// Not NaN or ±Inf: the exponent field is not all ones. Testing the bits needs no float
// compare, which -ffinite-math-only or a signalling NaN could upset.
MOETRAIN_HOST_DEVICE bool AdamWIsFinite(float x) {
#if defined(__CUDA_ARCH__)
  const unsigned int bits = __float_as_uint(x);
#else
  unsigned int bits;
  memcpy(&bits, &x, sizeof(bits));
#endif
  return (bits & 0x7F800000u) != 0x7F800000u;
}

// Whether one element of a saved AdamW state is valid: m finite, v non-negative and finite
// (−0 counts as non-negative).
MOETRAIN_HOST_DEVICE bool AdamWMomentsValid(float m, float v) {
  return AdamWIsFinite(m) && v >= 0.0f && AdamWIsFinite(v);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_ADAMW_MATH_H_
