#include "engine/model/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/gemm.h"
#include "engine/backend/cpu/rows.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"

namespace moetrain {
namespace {

using cpu::CheckAct;
using cpu::FinishRow;
using cpu::ReadRow;
using cpu::RowGrain;
using cpu::Scratch;
using cpu::WriteRow;

// Σ a_i·b_i with 16 independent partial sums (so the loop vectorises) combined in a fixed order.
MOETRAIN_CLONES float Dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

MOETRAIN_CLONES void RmsNormRow(const float* x, const float* w, float rstd, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * rstd * w[i];
}

// d_x (+)= rstd·(g − x̂·⟨g, x̂⟩/D) with g = dy ⊙ w, x̂ = x·rstd; d_w_partial += dy ⊙ x̂.
MOETRAIN_CLONES void RmsNormBackwardRow(const float* x, const float* w, const float* dy, float rstd,
                                        int64_t n, bool accumulate, float* scratch, float* d_x,
                                        float* d_w_partial) {
  float* g = scratch;
  for (int64_t i = 0; i < n; ++i) g[i] = dy[i] * w[i];
  const float c = Dot(g, x, n) * rstd * rstd / static_cast<float>(n);
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) d_x[i] += rstd * (g[i] - x[i] * c);
  } else {
    for (int64_t i = 0; i < n; ++i) d_x[i] = rstd * (g[i] - x[i] * c);
  }
  for (int64_t i = 0; i < n; ++i) d_w_partial[i] += dy[i] * (x[i] * rstd);
}

MOETRAIN_CLONES void AddRow(const float* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

absl::Status CheckTokens(TensorView tokens, int64_t vocab, const char* name) {
  const int32_t* ids = tokens.data<int32_t>();
  for (int64_t t = 0; t < tokens.numel(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "[", t, "] = ", ids[t], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

TensorView Workspace(Tensor& storage, DType dtype, std::initializer_list<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t words = (numel * static_cast<int64_t>(DTypeSize(dtype)) + 3) / 4;
  if (storage.empty() || storage.numel() < words) storage = Tensor::Empty(DType::kF32, {words});
  return TensorView(storage.view().raw(), dtype, shape);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

absl::Status RmsNormForward(TensorView x, TensorView weight, float eps, TensorView out,
                            TensorView rstd) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(x, "rms_norm x", DType::kF32, {-1, -1}));
  const int64_t t = x.dim(0), d = x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weight, "rms_norm weight", DType::kF32, {d}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "rms_norm out", {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rstd, "rms_norm rstd", DType::kF32, {t}));
  const float* w = weight.data<float>();
  DefaultThreadPool().ParallelFor(t, RowGrain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x.data<float>() + r * d;
      const float mean_square = Dot(row, row, d) / static_cast<float>(d);
      const float s = 1.0f / std::sqrt(mean_square + eps);
      rstd.data<float>()[r] = s;
      float* o = WriteRow(out, r, d, 0);
      RmsNormRow(row, w, s, d, o);
      FinishRow(out, r, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status RmsNormBackward(const RmsNormBackwardArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.x, "rms_norm x", DType::kF32, {-1, -1}));
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.weight, "rms_norm weight", DType::kF32, {d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.rstd, "rms_norm rstd", DType::kF32, {t}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.d_out, "rms_norm d_out", {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.d_x, "rms_norm d_x", DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.d_weight, "rms_norm d_weight", DType::kF32, {d}));
  if (t == 0) return absl::OkStatus();

  // The weight gradient sums over tokens: each block of rows sums into its own partial row, and
  // the partials are added in block order. Blocks depend only on T, not on the thread count.
  constexpr int64_t kMaxBlocks = 64;
  const int64_t block_rows = std::max<int64_t>((t + kMaxBlocks - 1) / kMaxBlocks, 16);
  const int64_t blocks = (t + block_rows - 1) / block_rows;
  std::vector<float> partials(blocks * d, 0.0f);
  const float* w = args.weight.data<float>();
  DefaultThreadPool().ParallelFor(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t b = block_begin; b < block_end; ++b) {
      float* partial = partials.data() + b * d;
      for (int64_t r = b * block_rows; r < std::min(t, (b + 1) * block_rows); ++r) {
        const float* dy = ReadRow(args.d_out, r, d, 0);
        RmsNormBackwardRow(args.x.data<float>() + r * d, w, dy, args.rstd.data<float>()[r], d,
                           args.accumulate_d_x, Scratch(1, d), args.d_x.data<float>() + r * d,
                           partial);
      }
    }
  });
  float* d_w = args.d_weight.data<float>();
  DefaultThreadPool().ParallelFor(d, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) sum += partials[b * d + i];
      d_w[i] += sum;
    }
  });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Token embedding

absl::Status EmbeddingForward(TensorView table, TensorView tokens, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(table, "embedding table", DType::kF32, {-1, -1}));
  const int64_t v = table.dim(0), d = table.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(tokens, "embedding tokens", DType::kI32, {-1}));
  const int64_t t = tokens.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(out, "embedding out", DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTokens(tokens, v, "tokens"));
  const int32_t* ids = tokens.data<int32_t>();
  DefaultThreadPool().ParallelFor(t, RowGrain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(out.data<float>() + r * d, table.data<float>() + ids[r] * d, d * sizeof(float));
    }
  });
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(TensorView tokens, TensorView d_out, TensorView d_table) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_table, "embedding d_table", DType::kF32, {-1, -1}));
  const int64_t v = d_table.dim(0), d = d_table.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(tokens, "embedding tokens", DType::kI32, {-1}));
  const int64_t t = tokens.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_out, "embedding d_out", DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTokens(tokens, v, "tokens"));

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
  DefaultThreadPool().ParallelFor(v, RowGrain(row_cost), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      float* dst = d_table.data<float>() + row * d;
      for (int64_t j = row_begin[row]; j < row_begin[row + 1]; ++j) {
        AddRow(d_out.data<float>() + positions[j] * d, d, dst);
      }
    }
  });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// LM head and cross-entropy

namespace {

absl::Status CheckLmHeadArgs(const LmHeadLossArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.hidden, "lm_head hidden", {-1, -1}));
  const int64_t t = args.hidden.dim(0), d = args.hidden.dim(1);
  if (t < 1) return absl::InvalidArgumentError("lm_head hidden: needs at least one token");
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(args.weight, "lm_head weight", args.hidden.dtype(), {-1, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.targets, "lm_head targets", DType::kI32, {t}));
  if (args.chunk_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lm_head chunk_tokens = ", args.chunk_tokens, " must not be negative"));
  }
  return CheckTokens(args.targets, args.weight.dim(0), "targets");
}

// Forward (and with `grads`, backward) over the chunks.
absl::StatusOr<float> LmHeadLoss(const LmHeadLossArgs& args, const LmHeadLossGrads* grads,
                                 LmHeadLossWorkspace* workspace) {
  MOETRAIN_RETURN_IF_ERROR(CheckLmHeadArgs(args));
  const int64_t t = args.hidden.dim(0), d = args.hidden.dim(1), v = args.weight.dim(0);
  const DType act = args.hidden.dtype();
  if (grads != nullptr) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckDenseTensor(grads->d_hidden, "lm_head d_hidden", DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(
        CheckDenseTensor(grads->d_weight, "lm_head d_weight", DType::kF32, {v, d}));
  }
  LmHeadLossWorkspace local;
  LmHeadLossWorkspace& ws = workspace != nullptr ? *workspace : local;
  constexpr int64_t kChunkLogits = int64_t{4} << 20;  // 16 MiB of f32
  const int64_t chunk = std::min(
      t, args.chunk_tokens > 0 ? args.chunk_tokens : std::max<int64_t>(1, kChunkLogits / v));
  TensorView logits = Workspace(ws.logits, DType::kF32, {chunk, v});
  TensorView d_logits = grads != nullptr ? Workspace(ws.d_logits, act, {chunk, v}) : TensorView();
  TensorView token_loss = Workspace(ws.token_loss, DType::kF32, {t});
  const int32_t* targets = args.targets.data<int32_t>();
  // d loss / d z_{t,v} = (softmax(z_t)_v − [v = target_t]) / T, times d_loss.
  const float scale = grads != nullptr ? grads->d_loss / static_cast<float>(t) : 0.0f;

  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t rows = std::min(chunk, t - t0);
    TensorView hidden = args.hidden.Slice(t0, t0 + rows);
    TensorView z = logits.Slice(0, rows);
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = hidden, .b = args.weight, .c = z, .trans_b = true}));
    DefaultThreadPool().ParallelFor(rows, RowGrain(v), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* row = z.data<float>() + r * v;
        const int32_t target = targets[t0 + r];
        const float target_logit = row[target];
        const float max = *std::max_element(row, row + v);
        // Exponentials overwrite the logits: the backward needs softmax = e / Σ e.
        float sum = 0.0f;
        for (int64_t i = 0; i < v; ++i) {
          row[i] = std::exp(row[i] - max);
          sum += row[i];
        }
        token_loss.data<float>()[t0 + r] = (max + std::log(sum)) - target_logit;
        if (grads == nullptr) continue;
        float* d = WriteRow(d_logits, r, v, 0);
        const float p_scale = scale / sum;
        for (int64_t i = 0; i < v; ++i) d[i] = row[i] * p_scale;
        d[target] -= scale;
        FinishRow(d_logits, r, v, d);
      }
    });
    if (grads == nullptr) continue;
    TensorView dz = d_logits.Slice(0, rows);
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = dz, .b = args.weight, .c = grads->d_hidden.Slice(t0, t0 + rows)}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
        {.a = dz, .b = hidden, .c = grads->d_weight, .trans_a = true, .accumulate = true}));
  }
  double total = 0.0;
  for (int64_t r = 0; r < t; ++r) total += token_loss.data<float>()[r];
  return static_cast<float>(total / static_cast<double>(t));
}

}  // namespace

absl::StatusOr<float> LmHeadLossForward(const LmHeadLossArgs& args,
                                        LmHeadLossWorkspace* workspace) {
  return LmHeadLoss(args, nullptr, workspace);
}

absl::StatusOr<float> LmHeadLossForwardBackward(const LmHeadLossArgs& args,
                                                const LmHeadLossGrads& grads,
                                                LmHeadLossWorkspace* workspace) {
  return LmHeadLoss(args, &grads, workspace);
}

}  // namespace moetrain
