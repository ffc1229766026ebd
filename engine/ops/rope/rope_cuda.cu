// The CUDA side of rope.h: one grid-stride kernel over the (row, head, pair) rotations, int64
// indices throughout. The cos/sin values are the CPU's own table (rope_table.h, computed in
// double on the host), copied to the device once per (device, S, Dh, θ): the device's double
// cos, sin and pow need not round as glibc's do, and a copy makes the angles the same f32 values
// on both. The rotation rounds each product (rope_math.h), so the result is within a few ulps of
// the CPU's (whose FMA clones fuse one product), not bit for bit.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/ops/common/cuda_elements.cuh"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/rope/rope_cuda.h"
#include "engine/ops/rope/rope_cuda_table.cuh"
#include "engine/ops/rope/rope_math.h"
#include "engine/ops/rope/rope_table.h"

namespace moetrain::ops::cuda {
namespace {

// x (rows, cols) f32 in place, cols = heads·2·half: pair (row, head, i) rotates x[row, head·Dh +
// i] and x[row, head·Dh + half + i] by the angle of position row mod S and pair i; cos and sin
// are (S, half) f32. One thread per pair; consecutive threads take consecutive i, so both
// halves' loads coalesce. sign = −1 rotates back.
__global__ void __launch_bounds__(kThreadsPerBlock)
    RopeKernel(float* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
               int64_t rows, int64_t cols, int64_t seq_len, int64_t half, float sign) {
  const int64_t pairs_per_row = cols / 2;
  const int64_t pairs = rows * pairs_per_row;
  for (int64_t p = GridStart(); p < pairs; p += GridStride()) {
    const int64_t row = p / pairs_per_row;
    const int64_t in_row = p - row * pairs_per_row;
    const int64_t head = in_row / half;
    const int64_t i = in_row - head * half;
    const int64_t at = row % seq_len * half + i;
    float* head_x = x + row * cols + head * 2 * half;
    RopeRotate(head_x[i], head_x[i + half], cos[at], sign * sin[at], &head_x[i], &head_x[i + half]);
  }
}

// The device tables of the last few (device, S, Dh, θ). A table is filled on the compute stream
// of its device, before the entry is published: every op on that device runs on that stream,
// so it runs after the copy. An evicted table is freed once no caller holds it; its memory's
// reuse is ordered on the same stream (caching_allocator.h).
class DeviceRopeCache {
 public:
  absl::StatusOr<std::shared_ptr<const DeviceRopeTable>> Get(const ExecContext& ctx,
                                                             const CudaOp& op, int64_t seq_len,
                                                             int64_t head_dim, float theta) {
    const int ordinal = op.context->ordinal();
    absl::MutexLock lock(&mu_);
    for (const auto& table : tables_) {
      if (table->ordinal == ordinal && table->host->seq_len == seq_len &&
          table->host->head_dim == head_dim && table->host->theta == theta) {
        return table;
      }
    }
    auto table = std::make_shared<DeviceRopeTable>();
    table->ordinal = ordinal;
    table->host = CachedRopeTable(seq_len, head_dim, theta);
    const int64_t half = head_dim / 2;
    MOETRAIN_ASSIGN_OR_RETURN(table->values,
                              Tensor::Allocate(ctx.allocator(), DType::kF32, {2, seq_len, half}));
    auto* cos = static_cast<float*>(table->values.view().raw());
    const size_t bytes = static_cast<size_t>(seq_len * half) * sizeof(float);
    MOETRAIN_CUDA_RETURN_IF_ERROR("rope", cudaMemcpyAsync(cos, table->host->cos.data(), bytes,
                                                          cudaMemcpyHostToDevice, op.stream));
    MOETRAIN_CUDA_RETURN_IF_ERROR(
        "rope", cudaMemcpyAsync(cos + seq_len * half, table->host->sin.data(), bytes,
                                cudaMemcpyHostToDevice, op.stream));
    if (tables_.size() >= kMaxTables) tables_.erase(tables_.begin());
    tables_.push_back(table);
    return std::shared_ptr<const DeviceRopeTable>(std::move(table));
  }

 private:
  static constexpr size_t kMaxTables = 8;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<const DeviceRopeTable>> tables_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace

absl::StatusOr<std::shared_ptr<const DeviceRopeTable>> DeviceRopeTableFor(
    const ExecContext& ctx, const CudaOp& op, int64_t seq_len, int64_t head_dim, float theta) {
  static DeviceRopeCache* cache = new DeviceRopeCache();
  return cache->Get(ctx, op, seq_len, head_dim, theta);
}

absl::Status ApplyRope(const ExecContext& ctx, const AttentionShape& shape, float theta,
                       bool inverse, TensorView x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (rows * cols == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "rope"));
  MOETRAIN_ASSIGN_OR_RETURN(const std::shared_ptr<const DeviceRopeTable> table,
                            DeviceRopeTableFor(ctx, op, shape.seq_len, shape.head_dim, theta));
  const int64_t half = shape.head_dim / 2;
  const auto* cos = static_cast<const float*>(table->values.view().raw());
  const float* sin = cos + shape.seq_len * half;
  const int64_t pairs = rows * (cols / 2);
  RopeKernel<<<static_cast<int>(GridStrideBlocks(pairs, op.context->multiprocessors())),
               kThreadsPerBlock, 0, op.stream>>>(static_cast<float*>(x.raw()), cos, sin, rows, cols,
                                                 shape.seq_len, half, inverse ? -1.0f : 1.0f);
  MOETRAIN_CUDA_CHECK_LAUNCH("rope");
  return absl::OkStatus();
}

}  // namespace moetrain::ops::cuda
