// The token embedding, forward and backward, and the split of a batch of token windows into the
// model's inputs and next-token targets. Tokens are i32 ids in [0, V); a bad id is
// InvalidArgument naming its position.
#ifndef MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_H_
#define MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops {

// windows (B, S + 1) i32 → inputs (B·S) = windows[:, :S] and targets (B·S) = windows[:, 1:].
// Every id must lie in [0, vocab): InvalidArgument "tokens[b, i] = id is outside the vocabulary
// [0, V)" otherwise.
absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab,
                         TensorView inputs, TensorView targets);
// The same from column `offset` on: windows (B, W) i32 → inputs (B·S) = windows[:, offset :
// offset + S] and targets (B·S) = windows[:, offset + 1 : offset + S + 1], with S the inputs'
// length over B and offset + S + 1 <= W (multi-token prediction reads the tokens past S + 1).
// Every id of the windows is checked.
absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab, int64_t offset,
                         TensorView inputs, TensorView targets);

// out_t = table[token_t]: table (V, D) f32, tokens (T) i32; out (T, D) f32 written.
absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out);

// d_table[v] += Σ_{t: token_t = v} d_out_t, summed in token order for each row (a sorted
// segmented sum: no atomics, so the result does not depend on the thread count). tokens (T) i32,
// d_out (T, D) f32, d_table (V, D) f32.
absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_H_
