// Per-element ops on whole tensors: dtype conversion, copies between devices, the residual add,
// constant fills and the Philox weight init. Tensors are dense; "act" = f32 or bf16. Each element
// is computed alone: results do not depend on the thread count.
#ifndef MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_H_
#define MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

// dst = src converted element by element (f32 ↔ bf16, or a copy): same shape, both act.
absl::Status ConvertTensor(const ExecContext& ctx, TensorView src, TensorView dst);

// dst = src, same dtype and shape, between any two of ctx's device and the CPU (the one explicit
// way data crosses between the host and a device). dst is dense; src too, unless it is on the
// host (a strided host view is gathered).
absl::Status CopyTensor(const ExecContext& ctx, TensorView src, TensorView dst);

// dst[:, dst_col : dst_col + cols] = src[:, src_col : src_col + cols]: columns of src (T, Ns)
// into columns of dst (T, Nd), both dense, of one dtype (f32 or bf16): the concatenation of two
// tensors along their columns, and its split.
absl::Status CopyColumns(const ExecContext& ctx, TensorView src, int64_t src_col, TensorView dst,
                         int64_t dst_col, int64_t cols);

// out (T, D) f32 = a (T, D) f32 + b (T, D) act: a branch's output joining the residual stream.
// out may be a.
absl::Status Add(const ExecContext& ctx, TensorView a, TensorView b, TensorView out);

// Every element of t (f32, bf16, i32 or i64; dense, or any strides on the host) = value (rounded
// to bf16, or truncated to an integer).
absl::Status Fill(const ExecContext& ctx, TensorView t, float value);

// t (f32) element j = mean + stddev · the j-th normal value of `rng` (Rng::FillNormal's stream),
// so the values depend only on the stream, not on how the elements are split among threads.
absl::Status FillNormal(const ExecContext& ctx, TensorView t, const Rng& rng, float mean,
                        float stddev);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_ELEMENTWISE_ELEMENTWISE_H_
