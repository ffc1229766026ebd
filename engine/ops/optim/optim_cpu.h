// The CPU side of optim.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/optim/optim.h"

namespace moetrain::cpu {

// SquaredNorm's fixed order, which the CUDA backend reproduces bit for bit: the flat range is cut
// into blocks of kNormBlock elements; within a block, the piece of each tensor it overlaps (in
// tensor order) adds element k of the piece (counted from the piece's start) to lane k % kNormLanes
// in f64, in ascending k; a block's sum is 0 + lane 0 + lane 1 + ... in lane order, and the norm is
// 0 + block 0 + block 1 + ... in block order. No multiply-add is fused anywhere.
inline constexpr int64_t kNormBlock = 1 << 16;
inline constexpr int kNormLanes = 16;

// The error naming the first bad element j (m_j, v_j its values; AdamWMomentsValid is false) of
// a saved AdamW state: m is named when it is bad, v otherwise (the CUDA backend reads the element
// back and reports it through this, so both backends say the same).
absl::Status AdamWMomentsError(std::string_view m_name, std::string_view v_name, int64_t j,
                               float m_j, float v_j);

void AdamWStep(const ExecContext& ctx, const ops::AdamWStepArgs& args);
double SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors);
void ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors, float scale);
bool AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors);
absl::Status CheckAdamWMoments(std::string_view m_name, TensorView m, std::string_view v_name,
                               TensorView v);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_
