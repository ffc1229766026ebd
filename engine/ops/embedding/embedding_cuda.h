// The CUDA side of embedding.h (embedding_cuda.cu); arguments arrive validated by the dispatch in
// embedding.cc and ctx is on a CUDA device. Host-safe: no CUDA headers.
//
// Where the host waits for the device:
// - CheckTokenIds, SplitTokens and EmbeddingForward wait once, to return the CPU's
//   InvalidArgument naming the first bad id in row-major order (a kernel keeps the smallest bad
//   flat index with an integer atomicMin, which does not depend on the order). On an error the
//   outputs are left untouched, as on the CPU: the copy or gather kernel reads the verdict first.
//   In a training step the wait costs little: SplitTokens has just waited anyway.
// - EmbeddingBackward does not wait. Its tokens are the forward's, which refused any bad id; a
//   bad id that reaches it anyway adds nothing to d_table.
//
// EmbeddingBackward is deterministic and gives the CPU's bits: a stable radix sort (CUB) of the
// (token, position) pairs, then for each distinct token one thread per column adds its rows to
// d_table in position order, starting from d_table's value, as the CPU's AddRow does. No atomics.
#ifndef MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CUDA_H_
#define MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CUDA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"

namespace moetrain::ops::cuda {

// cpu::CheckTokenIds on the device: tokens dense i32 of any shape, named `name` in the error
// ("name[i] = id is outside the vocabulary [0, vocab)", i the flat index). Waits.
absl::Status CheckTokenIds(const ExecContext& ctx, TensorView tokens, int64_t vocab,
                           const char* name);

// ---- The ops (embedding.h's, same arguments). ----

absl::Status SplitTokens(const ExecContext& ctx, TensorView windows, int64_t vocab, int64_t offset,
                         TensorView inputs, TensorView targets);
absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out);
absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table);

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_EMBEDDING_EMBEDDING_CUDA_H_
