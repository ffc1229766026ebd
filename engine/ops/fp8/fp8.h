// FP8 tensors and the ops that make and use them: quantise, dequantise, and the FP8 GEMM. The
// formulas are in engine/core/fp8_math.h; the recipes that choose scalings and scales are in
// engine/fp8/.
//
// Layout. An Fp8Tensor holds `rows` × `cols` values, quantised along `cols` (the GEMM's inner,
// K dimension), row-major, each row zero-padded to a multiple of 16 bytes (Hopper's FP8 GEMMs
// need ld % 16 == 0; the padding is zero so it adds nothing). Quantising with `transpose` reads a
// source (R, C) by columns and writes the tensor (C, R): the "columnwise" copy that the
// weight-gradient and data-gradient GEMMs need, because Hopper multiplies FP8 only in TN form.
//
// Scalings and the shape of scale_inv (f32, the factors that turn stored values back into real
// ones; cuBLASLt's "GEMM-ready" layouts, GPU-NOTES.md §2):
//   kTensor         (1)
//   kBlock1x128     [ceil(cols/128)][pad4(rows)]: one per 128 consecutive elements of a row,
//                   stored transposed (rows contiguous, padded to 4)
//   kBlock128x128   [ceil(rows/128)][pad4(ceil(cols/128))]: one per 128×128 tile
//   kMx1x32         [rows][ceil(cols/32)]: one per 32 elements of a row, each a power of two
//                   2^(e−127) from an E8M0 exponent (MXFP8; our own layout: Hopper has no MXFP8
//                   GEMM, so it is emulated everywhere)
#ifndef MOETRAIN_ENGINE_OPS_FP8_FP8_H_
#define MOETRAIN_ENGINE_OPS_FP8_FP8_H_

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/fp8_math.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

enum class Fp8Scaling : uint8_t { kTensor, kBlock1x128, kBlock128x128, kMx1x32 };

// The storage dtype of a format: kF8E4M3 or kF8E5M2.
DType Fp8DType(Fp8Format format);
// cols rounded up to a multiple of 16.
int64_t Fp8PaddedCols(int64_t cols);
// The shape of scale_inv for a (rows, cols) tensor (see above).
std::array<int64_t, 2> Fp8ScaleShape(Fp8Scaling scaling, int64_t rows, int64_t cols);

struct Fp8Tensor {
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  int64_t rows = 0;
  int64_t cols = 0;
  TensorView data;       // (rows, Fp8PaddedCols(cols)) Fp8DType(format); padding zero
  TensorView scale_inv;  // Fp8ScaleShape(scaling, rows, cols) f32, flattened to 2-D
};

// An Fp8Tensor of the given shape with its storage, on ctx's device (contents undefined).
struct OwnedFp8Tensor {
  Fp8Tensor view;
  Tensor data;
  Tensor scale_inv;
};
absl::StatusOr<OwnedFp8Tensor> AllocateFp8Tensor(const ExecContext& ctx, Fp8Format format,
                                                 Fp8Scaling scaling, int64_t rows, int64_t cols);

struct Fp8QuantizeArgs {
  TensorView src;          // (R, C) f32 or bf16, contiguous
  bool transpose = false;  // quantise src's columns: out is (C, R)
  // Scales of kTensor (current scaling) and the block scalings: round down to a power of two.
  bool pow2_scales = false;
  float amax_epsilon = 0.0f;  // amaxes below it count as it (kTensor current, block scalings)
  // kTensor: `scale` (1) f32 on the device. With compute_scale false (delayed scaling) the op
  // quantises with the scale found there; with compute_scale true (current scaling) it computes
  // ScaleFromAmax(amax of src) and writes it there first.
  TensorView scale;
  bool compute_scale = false;
  // Written: data, scale_inv (scale_inv = RN(1 / scale) for kTensor). format, scaling, rows and
  // cols must match src and transpose.
  Fp8Tensor out;
  // Statistics, each optional (empty view = not kept):
  //   amax (1) f32: max(amax, max |src|), a NaN element makes it NaN;
  //   saturated (1) i64: += elements whose scaled magnitude was above the format's max (±inf
  //   included; NaN not).
  TensorView amax;
  TensorView saturated;
};
absl::Status Fp8Quantize(const ExecContext& ctx, const Fp8QuantizeArgs& args);

// dst (src.rows, src.cols) f32 or bf16 = the values src stands for: stored value × its scale_inv
// (one f32 multiply, rounded to dst's dtype).
absl::Status Fp8Dequantize(const ExecContext& ctx, const Fp8Tensor& src, TensorView dst);

// c (M, N) f32 [+]= a · bᵀ, a (M, K) and b (N, K) FP8 quantised along K (TN, the one form
// Hopper multiplies). Scalings may be kTensor×kTensor, kBlock1x128 with kBlock1x128 or
// kBlock128x128 (either side), or kMx1x32×kMx1x32; formats E4M3×E4M3, E4M3×E5M2 or E5M2×E4M3.
// The CPU runs ops::Gemm on exact values: per-tensor scalings multiply the stored values in bf16
// (exact) and scale the f32 result by both factors, as the FP8 GEMM does; block scalings
// dequantise both sides, to bf16 when every scale is a power of two (exact), else to f32. CUDA
// runs cuBLASLt's FP8 GEMM with per-tensor or VEC128/BLK128x128 scales and split accumulation;
// MXFP8, which Hopper's cuBLASLt cannot multiply, is dequantised to bf16 and multiplied there.
struct Fp8GemmArgs {
  Fp8Tensor a;
  Fp8Tensor b;
  TensorView c;
  bool accumulate = false;
};
absl::Status Fp8Gemm(const ExecContext& ctx, const Fp8GemmArgs& args);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_FP8_FP8_H_
