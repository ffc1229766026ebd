// The transformer's layers outside attention and the MoE FFN, on the CPU: RMSNorm, the token
// embedding, and the LM head fused with the next-token cross-entropy. Forward next to backward.
//
// T = tokens, D = hidden size, V = vocabulary. "act" = f32 or bf16 (the compute dtype); the
// residual stream, statistics and gradients are f32. Backward passes add into parameter
// gradients (+=), so that micro-batches accumulate. Every reduction runs in a fixed order that
// does not depend on the number of threads, so results are bit-reproducible.
#ifndef MOETRAIN_ENGINE_MODEL_LAYERS_H_
#define MOETRAIN_ENGINE_MODEL_LAYERS_H_

#include <cstdint>
#include <initializer_list>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/tensor.h"

namespace moetrain {

// A view of `shape` over `storage`, which grows (uninitialised) when too small: activation
// buffers live across steps, so a steady-state step allocates nothing.
TensorView Workspace(Tensor& storage, DType dtype, std::initializer_list<int64_t> shape);

// ---------------------------------------------------------------------------------------------
// RMSNorm: out_t = x_t · rstd_t ⊙ w, rstd_t = 1 / sqrt(mean_i x_{t,i}² + eps).

// x (T, D) f32, weight (D) f32; out (T, D) act and rstd (T) f32 are written.
absl::Status RmsNormForward(TensorView x, TensorView weight, float eps, TensorView out,
                            TensorView rstd);

struct RmsNormBackwardArgs {
  TensorView x;         // (T, D) f32: the forward's input
  TensorView weight;    // (D) f32
  TensorView rstd;      // (T) f32: saved by the forward
  TensorView d_out;     // (T, D) act
  TensorView d_x;       // (T, D) f32: written, or added to when accumulate_d_x (a residual)
  TensorView d_weight;  // (D) f32: accumulated
  bool accumulate_d_x = false;
};
absl::Status RmsNormBackward(const RmsNormBackwardArgs& args);

// ---------------------------------------------------------------------------------------------
// Token embedding: out_t = table[token_t].

// table (V, D) f32, tokens (T) i32 in [0, V); out (T, D) f32 written. InvalidArgument naming the
// position for a token out of range.
absl::Status EmbeddingForward(TensorView table, TensorView tokens, TensorView out);

// d_table[v] += Σ_{t: token_t = v} d_out_t, summed in token order for each row (no atomics).
// tokens (T) i32, d_out (T, D) f32, d_table (V, D) f32.
absl::Status EmbeddingBackward(TensorView tokens, TensorView d_out, TensorView d_table);

// ---------------------------------------------------------------------------------------------
// LM head and cross-entropy, fused: loss = mean_t (logsumexp_v z_{t,v} − z_{t,target_t}),
// z = h·Wᵀ. The logits are computed for `chunk_tokens` tokens at a time and never exist for all
// T at once; the backward of a chunk runs right after its forward, so each logit is computed once.

struct LmHeadLossArgs {
  TensorView hidden;         // (T, D) act: the final norm's output
  TensorView weight;         // (V, D) act, same dtype: lm_head, or the tied embedding
  TensorView targets;        // (T) i32 in [0, V)
  int64_t chunk_tokens = 0;  // tokens per logits chunk; 0 = about 16 MiB of f32 logits
};

// Scratch reused across calls; may be shared by calls that do not overlap.
struct LmHeadLossWorkspace {
  Tensor logits;      // (chunk, V) f32
  Tensor d_logits;    // (chunk, V) act
  Tensor token_loss;  // (T) f32
};

// The mean loss. `workspace` may be null (then allocated per call).
absl::StatusOr<float> LmHeadLossForward(const LmHeadLossArgs& args, LmHeadLossWorkspace* workspace);

struct LmHeadLossGrads {
  float d_loss = 1.0f;  // gradient of the objective with respect to the mean loss
  TensorView d_hidden;  // (T, D) f32: written
  TensorView d_weight;  // (V, D) f32: accumulated
};

// The mean loss, and its gradients scaled by grads.d_loss.
absl::StatusOr<float> LmHeadLossForwardBackward(const LmHeadLossArgs& args,
                                                const LmHeadLossGrads& grads,
                                                LmHeadLossWorkspace* workspace);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_MODEL_LAYERS_H_
