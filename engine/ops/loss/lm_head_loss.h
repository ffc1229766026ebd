// The LM head fused with the next-token cross-entropy: loss = mean_t (logsumexp_v z_{t,v} −
// z_{t,target_t}), z = h·Wᵀ. The logits are computed for `chunk_tokens` tokens at a time and never
// exist for all T at once; the backward of a chunk runs right after its forward, so each logit is
// computed once. Per-token losses are summed in token order, so the result does not depend on the
// thread count.
#ifndef MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_H_
#define MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/core/workspace.h"

namespace moetrain::ops {

struct LmHeadLossArgs {
  TensorView hidden;         // (T, D) act: the final norm's output
  TensorView weight;         // (V, D) act, same dtype: lm_head, or the tied embedding
  TensorView targets;        // (T) i32 in [0, V)
  int64_t chunk_tokens = 0;  // tokens per logits chunk; 0 = about 16 MiB of f32 logits
};

// Tokens per logits chunk when chunk_tokens is 0: as many as make about 16 MiB of f32 logits of
// `vocab` columns (at least 1), and at most `tokens`.
inline int64_t DefaultLmHeadChunkTokens(int64_t tokens, int64_t vocab) {
  constexpr int64_t kChunkLogits = int64_t{4} << 20;
  return std::min(tokens, std::max<int64_t>(1, kChunkLogits / std::max<int64_t>(1, vocab)));
}

// Scratch of the LM head loss, reused across calls that do not overlap.
class LmHeadLossWorkspace {
 public:
  explicit LmHeadLossWorkspace(const ExecContext& ctx) : buffers_(kNumBuffers, ctx.allocator()) {}
  Workspace& buffers() { return buffers_; }
  const Workspace& buffers() const { return buffers_; }
  enum Buffer { kLogits, kDLogits, kTokenLoss, kNumBuffers };

 private:
  Workspace buffers_;
};

// The mean loss. `workspace` may be null (then allocated per call).
absl::StatusOr<float> LmHeadLossForward(const ExecContext& ctx, const LmHeadLossArgs& args,
                                        LmHeadLossWorkspace* workspace);

struct LmHeadLossGrads {
  float d_loss = 1.0f;  // gradient of the objective with respect to the mean loss
  TensorView d_hidden;  // (T, D) f32: written
  TensorView d_weight;  // (V, D) f32: accumulated
};

// The mean loss, and its gradients scaled by grads.d_loss.
absl::StatusOr<float> LmHeadLossForwardBackward(const ExecContext& ctx, const LmHeadLossArgs& args,
                                                const LmHeadLossGrads& grads,
                                                LmHeadLossWorkspace* workspace);

// The step between a chunk's GEMMs on its own, so that the backends can be compared row by row:
// for each row r of logits z (rows, V) f32 with rows >= 1, token_loss[r] (rows, f32) = its
// cross-entropy against targets[r] (rows, i32 in [0, V)); with d_logits (rows, V) act (f32 or
// bf16; may be empty), also d_logits[r] = scale · (softmax − one_hot). z is scratch: the CPU
// overwrites it with its exponentials, CUDA leaves it. Checks the targets first (on CUDA that
// waits), which the LM head loss does once for all its chunks.
absl::Status CrossEntropyRows(const ExecContext& ctx, TensorView z, TensorView targets,
                              TensorView token_loss, TensorView d_logits, float scale);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_LOSS_LM_HEAD_LOSS_H_
