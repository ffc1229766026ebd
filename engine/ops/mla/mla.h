// Multi-head Latent Attention's layout ops (DeepSeek-V3; engine/model/model_config.h): between
// the projections' outputs and the attention core's q, k, v (ops/attention), with RoPE on the
// rope features, and back. T = B·S tokens; H heads; a head's query/key has Dqk = nope + rope
// features, [nope | rope], and its value v ≤ Dqk features.
//
// RoPE is DeepSeek-V3's interleaved form: the rope features of a projection are pairs
// (x_2i, x_2i+1), pair i rotated by the angle p·θ^(−2i/rope) at position p. The ops write the
// rotated pairs to q and k de-interleaved, (y_i, y_{i+rope/2}) = rotated pair i: the attention
// core only sums q·k over the features, so any one order for both gives the same scores. The
// values are padded with zeros to Dqk so that the core sees one head width; its output heads are
// narrowed back to v features for o_proj.
//
// Every element is written by one thread, and the one sum (the shared key's gradient over the
// heads) runs over the heads in order: results do not depend on the thread count. The per-element
// math is mla_math.h, shared with the CUDA kernels.
#ifndef MOETRAIN_ENGINE_OPS_MLA_MLA_H_
#define MOETRAIN_ENGINE_OPS_MLA_MLA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

struct MlaShape {
  int64_t batch = 1;       // B sequences
  int64_t seq_len = 1;     // S positions each
  int64_t num_heads = 1;   // H
  int64_t qk_nope = 0;     // per-head query/key features without RoPE; even
  int64_t qk_rope = 2;     // per-head query/key features with RoPE; even, >= 2
  int64_t v_head_dim = 1;  // per-head value features, in [1, qk_nope + qk_rope]

  int64_t qk_head_dim() const { return qk_nope + qk_rope; }
  int64_t tokens() const { return batch * seq_len; }
};

// OK, or InvalidArgument naming the field and its value.
absl::Status CheckMlaShape(const MlaShape& shape);

// From q_full (T, H·Dqk) (the query projection), k_rope (T, rope) (the last rope columns of
// kv_a_proj_with_mqa's output) and kv (T, H·(nope + v)) (kv_b_proj's output, per head
// [k_nope | v]), all f32, writes the attention core's inputs, each (T, H·Dqk) f32:
//   q[h] = [q_full[h].nope | RoPE(q_full[h].rope)],  k[h] = [kv[h].k_nope | RoPE(k_rope)],
//   v[h] = [kv[h].v | 0 …].
absl::Status MlaQkvForward(const ExecContext& ctx, const MlaShape& shape, float theta,
                           TensorView q_full, TensorView k_rope, TensorView kv, TensorView q,
                           TensorView k, TensorView v);

// The gradients of MlaQkvForward's inputs from those of its outputs d_q, d_k, d_v (T, H·Dqk) f32
// (d_v's padding columns are ignored). d_q_full (T, H·Dqk), d_k_rope (T, rope) (the sum over the
// heads) and d_kv (T, H·(nope + v)) f32 are written.
absl::Status MlaQkvBackward(const ExecContext& ctx, const MlaShape& shape, float theta,
                            TensorView d_q, TensorView d_k, TensorView d_v, TensorView d_q_full,
                            TensorView d_k_rope, TensorView d_kv);

// narrow (T, H·v) f32 = the first v features of each head of wide (T, H·Dqk) f32: the attention
// core's output as o_proj reads it.
absl::Status MlaNarrowHeads(const ExecContext& ctx, const MlaShape& shape, TensorView wide,
                            TensorView narrow);
// Its backward: wide (T, H·Dqk) f32 = narrow (T, H·v) f32 with each head zero-padded to Dqk.
absl::Status MlaWidenHeads(const ExecContext& ctx, const MlaShape& shape, TensorView narrow,
                           TensorView wide);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_MLA_MLA_H_
