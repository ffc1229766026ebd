// The CUDA side of fp8.h: quantise and dequantise kernels (the same per-element math as the CPU,
// engine/core/fp8_math.h), and the FP8 GEMM through cuBLASLt. Arguments arrive validated.
// Host-safe: no CUDA headers.
#ifndef MOETRAIN_ENGINE_OPS_FP8_FP8_CUDA_H_
#define MOETRAIN_ENGINE_OPS_FP8_FP8_CUDA_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/ops/fp8/fp8.h"

namespace moetrain::ops::cuda {

absl::Status Fp8Quantize(const ExecContext& ctx, const Fp8QuantizeArgs& args);
absl::Status Fp8Dequantize(const ExecContext& ctx, const Fp8Tensor& src, TensorView dst);
absl::Status Fp8Gemm(const ExecContext& ctx, const Fp8GemmArgs& args);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_FP8_FP8_CUDA_H_
