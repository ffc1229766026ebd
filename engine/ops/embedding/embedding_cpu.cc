#include "engine/ops/embedding/embedding_cpu.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/rows.h"
#include "engine/core/fast_math.h"
#include "engine/core/status.h"

namespace moetrain::cpu {
namespace {

MOETRAIN_CLONES void AddRow(const float* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

absl::Status CheckTokenIds(TensorView tokens, int64_t vocab, const char* name) {
  const int32_t* ids = tokens.data<int32_t>();
  for (int64_t t = 0; t < tokens.numel(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", t, "] = ", ids[t], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status SplitTokens(TensorView windows, int64_t vocab, int64_t offset, TensorView inputs,
                         TensorView targets) {
  const int64_t b = windows.dim(0), w = windows.dim(1), s = inputs.dim(0) / b;
  const int32_t* ids = windows.data<int32_t>();
  for (int64_t i = 0; i < windows.numel(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", i / w, ", ", i % w, "] = ", ids[i],
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  for (int64_t row = 0; row < b; ++row) {
    const int32_t* src = ids + row * w + offset;
    std::memcpy(inputs.data<int32_t>() + row * s, src, s * sizeof(int32_t));
    std::memcpy(targets.data<int32_t>() + row * s, src + 1, s * sizeof(int32_t));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingForward(const ExecContext& ctx, TensorView table, TensorView tokens,
                              TensorView out) {
  const int64_t v = table.dim(0), d = table.dim(1), t = tokens.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckTokenIds(tokens, v, "tokens"));
  const int32_t* ids = tokens.data<int32_t>();
  ctx.thread_pool().ParallelFor(t, RowGrain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(out.data<float>() + r * d, table.data<float>() + ids[r] * d, d * sizeof(float));
    }
  });
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const ExecContext& ctx, TensorView tokens, TensorView d_out,
                               TensorView d_table) {
  const int64_t v = d_table.dim(0), d = d_table.dim(1), t = tokens.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckTokenIds(tokens, v, "tokens"));
  // Counting sort of positions by token id (stable), so each vocabulary row is owned by one
  // task and adds its tokens' gradients in position order.
  const int32_t* ids = tokens.data<int32_t>();
  std::vector<int64_t> row_begin(v + 1, 0);
  for (int64_t r = 0; r < t; ++r) ++row_begin[ids[r] + 1];
  for (int64_t i = 0; i < v; ++i) row_begin[i + 1] += row_begin[i];
  std::vector<int64_t> positions(t);
  {
    std::vector<int64_t> next(row_begin.begin(), row_begin.end() - 1);
    for (int64_t r = 0; r < t; ++r) positions[next[ids[r]]++] = r;
  }
  // Rows per task so that a task adds ~64 KiB of gradients on average.
  const int64_t row_cost = d + t * d / v;
  ctx.thread_pool().ParallelFor(v, RowGrain(row_cost), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* dst = d_table.data<float>() + row * d;
      for (int64_t j = row_begin[row]; j < row_begin[row + 1]; ++j) {
        AddRow(d_out.data<float>() + positions[j] * d, d, dst);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace moetrain::cpu
