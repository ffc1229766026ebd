// The CPU side of fp8.h: exact emulation of the quantise and dequantise kernels, with the
// per-element math of engine/core/fp8_math.h. Arguments arrive validated (fp8.cc). Threaded over
// rows (or 128-row blocks for kBlock128x128); every amax is a NaN-sticky max (Fp8AmaxFold) and the
// saturated count an integer sum, so the result does not depend on the thread count.
//
// kMx1x32 takes no pow2_scales or amax_epsilon (its E8M0 scales are powers of two by
// construction, and TE's MXFP8 has no epsilon).
//
// The padding of the GEMM-ready scale layouts (kBlock1x128's rows beyond `rows`, kBlock128x128's
// column blocks beyond ceil(cols/128)) is written as 0, like the data's padding columns.
#ifndef MOETRAIN_ENGINE_OPS_FP8_FP8_CPU_H_
#define MOETRAIN_ENGINE_OPS_FP8_FP8_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/fp8/fp8.h"

namespace moetrain::cpu {

void Fp8Quantize(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args);
void Fp8Dequantize(const ExecContext& ctx, const ops::Fp8Tensor& src, TensorView dst);

// Whether every value of t dequantises exactly into bf16: each scale_inv is 0 or a power of two
// from 2^-100 (so that even the smallest FP8 subnormal times it is a bf16 normal) to 2^100.
bool Fp8ValuesExactInBf16(const ops::Fp8Tensor& t);
// c (M, N) f32 = [c +] factor · products (M, N) f32.
void ScaleProducts(const ExecContext& ctx, TensorView products, float factor, bool accumulate,
                   TensorView c);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_FP8_FP8_CPU_H_
