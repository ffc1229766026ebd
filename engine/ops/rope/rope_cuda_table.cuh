// RoPE's cos/sin table on a CUDA device: a copy of the host's (rope_table.h), shared by the
// kernels that rotate (ops/rope, ops/mla). Included by .cu files only.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_TABLE_CUH_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_TABLE_CUH_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/rope/rope_table.h"

namespace moetrain::ops::cuda {

// One device's copy of a host table: cos then sin, each (S, Dh/2) f32.
struct DeviceRopeTable {
  int ordinal;
  std::shared_ptr<const RopeTable> host;  // what it was copied from, kept while it may be read
  Tensor values;                          // (2, S, Dh/2) f32 on device `ordinal`

  const float* cos() const { return static_cast<const float*>(values.view().raw()); }
  const float* sin() const { return cos() + host->seq_len * (host->head_dim / 2); }
};

// The table of (S, Dh, θ) on op's device, from a cache of the last few; filled on op's stream
// when new. Valid while the pointer is held.
absl::StatusOr<std::shared_ptr<const DeviceRopeTable>> DeviceRopeTableFor(
    const ExecContext& ctx, const CudaOp& op, int64_t seq_len, int64_t head_dim, float theta);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_CUDA_TABLE_CUH_
