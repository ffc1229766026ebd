#include "engine/model/compute_copy.h"

#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"

namespace moetrain {

absl::StatusOr<TensorView> ComputeCopy(const ExecContext& ctx, Workspace& workspace, DType dtype,
                                       TensorView src, int slot) {
  if (dtype == DType::kF32) return src;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView dst, workspace.Get(slot, dtype, {src.dim(0), src.dim(1)}));
  MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx, src, dst));
  return dst;
}

}  // namespace moetrain
