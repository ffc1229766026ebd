// The CPU side of optim.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_
#define MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/optim/optim.h"

namespace moetrain::cpu {

void AdamWStep(const ExecContext& ctx, const ops::AdamWStepArgs& args);
double SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors);
void ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors, float scale);
bool AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors);
absl::Status CheckAdamWMoments(std::string_view m_name, TensorView m, std::string_view v_name,
                               TensorView v);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_OPTIM_OPTIM_CPU_H_
