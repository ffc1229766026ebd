// What the model's layers do before each GEMM that takes an f32 activation: hand it over in the
// compute dtype (ModelConfig's f32 or bf16).
#ifndef MOETRAIN_ENGINE_MODEL_COMPUTE_COPY_H_
#define MOETRAIN_ENGINE_MODEL_COMPUTE_COPY_H_

#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"

namespace moetrain {

// `src` (T, cols) f32 as a `dtype` tensor: src itself for f32, else converted into `workspace`'s
// slot `slot` (valid until that slot is asked for again).
absl::StatusOr<TensorView> ComputeCopy(const ExecContext& ctx, Workspace& workspace, DType dtype,
                                       TensorView src, int slot);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_COMPUTE_COPY_H_
