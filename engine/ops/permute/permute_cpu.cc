#include "engine/ops/permute/permute_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/rows.h"
#include "engine/core/fast_math.h"
#include "engine/core/status.h"
#include "engine/ops/permute/permute_math.h"

namespace moetrain::cpu {
namespace {

// out += w·y.
MOETRAIN_CLONES void AxpyRow(float w, const float* y, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = AddWeighted(out[i], w, y[i]);
}

// d_y = w·g, and returns ⟨g, y⟩, summed in kDotLanes interleaved partial sums (permute_math.h): a
// fixed order (the same result on every run, thread count and backend), and one that vectorises
// without -ffast-math.
MOETRAIN_CLONES float ScaleAndDotRow(float w, const float* g, const float* y, float* d_y,
                                     int64_t n) {
  constexpr int kLanes = kDotLanes;
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      partial[l] = AddWeighted(partial[l], g[i + l], y[i + l]);
      d_y[i + l] = w * g[i + l];
    }
  }
  for (; i < n; ++i) {
    partial[0] = AddWeighted(partial[0], g[i], y[i]);
    d_y[i] = w * g[i];
  }
  float dot = 0.0f;
  for (int l = 0; l < kLanes; ++l) dot += partial[l];
  return dot;
}

// Checks pair_row (T, k) i32 against R rows.
absl::Status CheckPairRows(const TensorView& pair_row, int64_t rows) {
  const int32_t* p = pair_row.data<int32_t>();
  for (int64_t i = 0; i < pair_row.numel(); ++i) {
    if (p[i] < -1 || p[i] >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("pair_row[", i, "] = ", p[i], " is outside [-1, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BuildPermutation(const MoeConfig& config, const ops::PermutationArgs& args,
                              ops::Permutation* out) {
  const int64_t num_experts = config.num_experts, k = config.top_k;
  const int64_t tokens = args.topk_experts.dim(0), pairs = tokens * k;
  const int32_t* experts = args.topk_experts.data<int32_t>();
  const int32_t* order = args.expert_order.empty() ? nullptr : args.expert_order.data<int32_t>();
  if (order != nullptr) {
    std::vector<bool> seen(num_experts, false);
    for (int64_t e = 0; e < num_experts; ++e) {
      if (order[e] < 0 || order[e] >= num_experts || seen[order[e]]) {
        return absl::InvalidArgumentError(absl::StrCat("expert_order[", e, "] = ", order[e],
                                                       " repeats a position or is outside [0, ",
                                                       num_experts, ")"));
      }
      seen[order[e]] = true;
    }
  }

  // Counting sort of pair indices p = t·k + j by expert (or by its place in `order`); stable, so
  // each bucket is in (token, slot) order.
  std::vector<int32_t> bucket_of(pairs);
  std::vector<int64_t> bucket_start(num_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    if (experts[p] < 0 || experts[p] >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("topk_experts[", p / k, ", ", p % k,
                                                     "] = ", experts[p], " is outside [0, ",
                                                     num_experts, ")"));
    }
    bucket_of[p] = order != nullptr ? order[experts[p]] : experts[p];
    ++bucket_start[bucket_of[p] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) bucket_start[e + 1] += bucket_start[e];
  std::vector<int64_t> sorted_pairs(pairs);
  {
    std::vector<int64_t> next(bucket_start.begin(), bucket_start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) sorted_pairs[next[bucket_of[p]]++] = p;
  }

  // Capacity: an over-full expert keeps `capacity` pairs of its bucket, still in bucket order. The
  // caller's offsets must give each bucket exactly the rows it keeps.
  const int64_t capacity = ops::ExpertCapacity(config, tokens);
  const absl::Span<const int64_t> offsets = args.expert_offsets;
  std::vector<int64_t> kept(num_experts);
  const float* weights = args.topk_weights.data<float>();
  for (int64_t e = 0; e < num_experts; ++e) {
    auto first = sorted_pairs.begin() + bucket_start[e];
    auto last = sorted_pairs.begin() + bucket_start[e + 1];
    kept[e] = std::min<int64_t>(last - first, capacity);
    if (kept[e] != offsets[e + 1] - offsets[e]) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert_offsets: position ", e, " keeps ", kept[e], " of its ", last - first,
                       " pairs, but the offsets give it ", offsets[e + 1] - offsets[e], " rows"));
    }
    if (last - first > capacity && config.drop_policy == DropPolicy::kProbability) {
      std::stable_sort(first, last, [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
      std::sort(first, first + capacity);
    }
  }
  std::copy(offsets.begin(), offsets.end(), out->expert_offsets.data<int64_t>());
  int32_t* row_token = out->row_token.data<int32_t>();
  int32_t* pair_row = out->pair_row.data<int32_t>();
  std::fill(pair_row, pair_row + pairs, -1);
  for (int64_t e = 0; e < num_experts; ++e) {
    for (int64_t i = 0; i < kept[e]; ++i) {
      const int64_t p = sorted_pairs[bucket_start[e] + i];
      const int64_t row = offsets[e] + i;
      row_token[row] = static_cast<int32_t>(p / k);
      pair_row[p] = static_cast<int32_t>(row);
    }
  }
  return absl::OkStatus();
}

absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst) {
  const int64_t rows = index.dim(0), cols = src.dim(1), tokens = src.dim(0);
  const size_t row_bytes = cols * DTypeSize(src.dtype());
  const int32_t* idx = index.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (idx[r] < 0 || idx[r] >= tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather index[", r, "] = ", idx[r], " is outside [0, ", tokens, ")"));
    }
  }
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  ctx.thread_pool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::memcpy(d + r * row_bytes, s + idx[r] * row_bytes, row_bytes);
  });
  return absl::OkStatus();
}

absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  ctx.thread_pool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = WriteRow(out, t, d, 0);
      if (extra.empty()) {
        std::memset(o, 0, d * sizeof(float));
      } else {
        std::memcpy(o, extra.data<float>() + t * d, d * sizeof(float));
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) continue;
        AxpyRow(weights.data<float>()[t * k + j], rows.data<float>() + row * d, o, d);
      }
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights) {
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  ctx.thread_pool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = ReadRow(d_out, t, d, 0);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) {
          d_weights.data<float>()[t * k + j] = 0.0f;
          continue;
        }
        const float w = weights.data<float>()[t * k + j];
        const float* y = rows.data<float>() + row * d;
        float* dy = WriteRow(d_rows, row, d, 1);
        d_weights.data<float>()[t * k + j] = ScaleAndDotRow(w, g, y, dy, d);
        FinishRow(d_rows, row, d, dy);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  ctx.thread_pool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = WriteRow(out, t, d, 0);
      std::memset(o, 0, d * sizeof(float));
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) continue;
        AxpyRow(1.0f, rows.data<float>() + row * d, o, d);
      }
      for (const TensorView& a : addends) AxpyRow(1.0f, a.data<float>() + t * d, o, d);
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

}  // namespace moetrain::cpu
