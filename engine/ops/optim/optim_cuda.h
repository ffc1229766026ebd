// The CUDA side of optim.h (optim_cuda.cu); arguments arrive validated by the dispatch in
// optim.cc, ctx is on a CUDA device. Host-safe: no CUDA headers.
//
// AdamWStep, ScaleTensors and AllFinite are multi-tensor kernels: the tensors' pointers and
// sizes travel as the kernel's parameters (up to kMaxTensorsPerLaunch per launch, so a model's
// whole parameter list is one launch or a few), and each block walks fixed tiles of one tensor.
// Their results are the CPU's bits (adamw_math.h rounds every operation alike on both sides);
// only NaN payloads may differ. SquaredNorm reproduces the CPU's fixed summation order exactly
// (optim_cpu.h), so it returns the CPU's bits too. The tiling and searches are host-device
// functions (multi_tensor_math.h) that the CPU tests check.
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CUDA_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CUDA_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/optim/optim.h"

namespace moetrain::ops::cuda {

// Queued on the compute stream; no host wait.
absl::Status AdamWStep(const ExecContext& ctx, const AdamWStepArgs& args);
absl::Status ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors,
                          float scale);

// These return a value to the host, so they wait for the compute stream.
absl::StatusOr<double> SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors);
absl::StatusOr<bool> AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors);
absl::Status CheckAdamWMoments(const ExecContext& ctx, std::string_view m_name, TensorView m,
                               std::string_view v_name, TensorView v);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CUDA_H_
