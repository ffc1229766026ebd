// How the CUDA Fp8Gemm (fp8_gemm_cuda.cu) multiplies a pair of FP8 operands: cuBLASLt's FP8 GEMM
// with per-tensor or block scales, or, where cuBLASLt on Hopper cannot, a GEMM of the dequantised
// values. A pure function, so that the CPU tests check the choice (tests/engine/ops/fp8/).
#ifndef MOETRAIN_ENGINE_OPS_FP8_FP8_GEMM_PATH_H_
#define MOETRAIN_ENGINE_OPS_FP8_FP8_GEMM_PATH_H_

#include <cstdint>

#include "engine/core/fp8_math.h"
#include "engine/ops/fp8/fp8.h"

namespace moetrain::ops {

enum class Fp8GemmPath : uint8_t {
  // cuBLASLt FP8, scale pointers = the two per-tensor scale_invs.
  kCublasLtPerTensor,
  // cuBLASLt FP8 with the VEC128_32F (1×128) / BLK128x128_32F (128×128) scale modes.
  kCublasLtBlockwise,
  // Both operands dequantised to f32 (exact: one RN multiply, as on the CPU), then the f32
  // cuBLASLt GEMM: block scalings whose shape cuBLASLt's block-scaled kernels refuse.
  kDequantizedF32,
  // Both dequantised to bf16, then the bf16 GEMM: MXFP8, which Hopper cannot multiply. An FP8
  // value (at most 4 significant bits) times a power of two is exact in bf16 unless it falls
  // below bf16's normal range (2^-126), so this matches the CPU's f32 dequantisation.
  kDequantizedBf16,
  // Not a combination fp8.h allows (2D×2D, kTensor with a block scaling, MXFP8 with anything
  // else, E5M2×E5M2).
  kUnsupported,
};

// The path of c (M, N) = a (M, K) · bᵀ, b (N, K). `n` is N, the row length of c: cuBLASLt's m
// once the product is transposed into its column-major terms (fp8_gemm_cuda.cu). Transformer Engine
// requires m % 8 == 0 of block-scaled FP8 GEMMs (it derives it from the 16-byte alignment of
// C's columns at the smallest output type); other shapes go through the dequantised f32 GEMM.
constexpr Fp8GemmPath ChooseFp8GemmPath(Fp8Scaling a, Fp8Scaling b, Fp8Format a_format,
                                        Fp8Format b_format, int64_t n) {
  if (a_format == Fp8Format::kE5M2 && b_format == Fp8Format::kE5M2) {
    return Fp8GemmPath::kUnsupported;
  }
  if (a == Fp8Scaling::kTensor || b == Fp8Scaling::kTensor) {
    return a == b ? Fp8GemmPath::kCublasLtPerTensor : Fp8GemmPath::kUnsupported;
  }
  if (a == Fp8Scaling::kMx1x32 || b == Fp8Scaling::kMx1x32) {
    return a == b ? Fp8GemmPath::kDequantizedBf16 : Fp8GemmPath::kUnsupported;
  }
  if (a == Fp8Scaling::kBlock128x128 && b == Fp8Scaling::kBlock128x128) {
    return Fp8GemmPath::kUnsupported;
  }
  return n % 8 == 0 ? Fp8GemmPath::kCublasLtBlockwise : Fp8GemmPath::kDequantizedF32;
}

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_FP8_FP8_GEMM_PATH_H_
