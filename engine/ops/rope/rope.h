// Rotary position embedding (rope_math.h) of query or key heads in place, at positions 0..S-1 of
// each sequence. Its cos/sin tables, computed in double on the host, are cached per (S, Dh, θ)
// (rope_table.h); the CUDA backend rotates by a device copy of the same table, so both give the
// same bits. Each element is written by one thread: results do not depend on the thread count.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_H_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_H_

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"

namespace moetrain::ops {

// Rotates x (B·S, Hx·Dh) f32 in place, any number of heads Hx (q with H, k with Hkv); `inverse`
// rotates back (the backward of the rotation is the inverse rotation). shape.num_heads and
// num_kv_heads are checked but not used.
absl::Status ApplyRope(const ExecContext& ctx, const AttentionShape& shape, float theta,
                       bool inverse, TensorView x);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_H_
