// The causal self-attention core, multi-head or grouped-query, in f32; RoPE is in ops/rope.
//
// Tokens are B sequences of S consecutive positions; q holds H heads and k, v hold Hkv heads of
// Dh each (query head h reads key/value head h / (H / Hkv)). RoPE uses the rotate-half convention
// (Llama, ops/rope/rope.h).
// Scores are q·kᵀ/√Dh with keys at positions ≤ the query's. The forward never materialises more
// than one (query block × key block) score tile per thread: it keeps the running max and sum of
// each row (online softmax) and saves the row logsumexp for the backward, which recomputes tiles.
//
// Tiles are 64 × 64 (on CUDA, 32 × 32 from head_dim 65 on: attention_cuda.h); tiles above the
// diagonal are skipped. The forward runs one task per (b, h, query block); the backward one per
// (b, kv head, key block) for d_k and d_v (summing the kv head's H / Hkv query heads) and one per
// (b, h, query block) for d_q, so every output has one writer and the results are bit-identical
// run to run and for any thread count. Tensors must be dense (row-major contiguous); a bad
// argument is InvalidArgument naming the tensor or field and its value ("lse: expected (2, 8,
// 512) f32, got ...", "shape.head_dim = 7 ...").
#ifndef MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_H_
#define MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

struct AttentionShape {
  int64_t batch = 1;         // B sequences
  int64_t seq_len = 1;       // S positions each
  int64_t num_heads = 1;     // H
  int64_t num_kv_heads = 1;  // Hkv, divides H
  int64_t head_dim = 1;      // Dh, even
};

// OK, or InvalidArgument naming the field: every extent positive, Hkv divides H, Dh even.
absl::Status CheckAttentionShape(const AttentionShape& shape);

// q (B·S, H·Dh), k and v (B·S, Hkv·Dh) f32, RoPE already applied to q and k.
// out (B·S, H·Dh) f32 and lse (B, H, S) f32 are written.
absl::Status CausalAttentionForward(const ExecContext& ctx, const AttentionShape& shape,
                                    TensorView q, TensorView k, TensorView v, TensorView out,
                                    TensorView lse);

// Gradients of the forward's inputs from d_out (B·S, H·Dh) f32, given the forward's q, k, v,
// out and lse. d_q (B·S, H·Dh), d_k and d_v (B·S, Hkv·Dh) f32 are written.
absl::Status CausalAttentionBackward(const ExecContext& ctx, const AttentionShape& shape,
                                     TensorView q, TensorView k, TensorView v, TensorView out,
                                     TensorView lse, TensorView d_out, TensorView d_q,
                                     TensorView d_k, TensorView d_v);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_ATTENTION_ATTENTION_H_
