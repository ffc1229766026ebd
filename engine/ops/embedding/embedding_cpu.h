// The CPU side of embedding.h; shapes arrive validated, token ids are checked here.
#ifndef MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CPU_H_
#define MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CPU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

// OK when every id of `tokens` lies in [0, vocab), else InvalidArgument "name[i] = id is outside
// the vocabulary [0, vocab)".
absl::Status CheckTokenIds(TensorView tokens, int64_t vocab, const char* name);

absl::Status SplitTokens(TensorView windows, int64_t vocab, int64_t offset, TensorView inputs,
                         TensorView targets);
absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out);
absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CPU_H_
