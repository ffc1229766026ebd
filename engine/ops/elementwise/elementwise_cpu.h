// The CPU side of elementwise.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CPU_H_
#define MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CPU_H_

#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

// dst (dense) = src (any strides), both on the host.
void CopyToDense(TensorView src, TensorView dst);
void ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst);
void CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                 int64_t dst_col, int64_t cols);
void Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out);
// Dense tensors in parallel; strided ones element by element.
void Fill(const ExecContext& ctx, TensorView t, float value);
void FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean, float stddev);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_CPU_H_
