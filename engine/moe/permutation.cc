#include "engine/moe/permutation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain {

int64_t ExpertCapacity(const MoeConfig& config, int64_t tokens) {
  const int64_t pairs = tokens * config.top_k;
  if (config.capacity_factor <= 0.0f) return pairs;
  // In double so that cf·T·k/E lands on an integer exactly when it should.
  return static_cast<int64_t>(std::ceil(static_cast<double>(config.capacity_factor) * pairs /
                                        static_cast<double>(config.num_experts)));
}

absl::Status BuildPermutation(const MoeConfig& config, TensorView topk_experts,
                              TensorView topk_weights, Permutation* out) {
  const int64_t num_experts = config.num_experts, k = config.top_k;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(topk_experts, "topk_experts", DType::kI32, {-1, k}));
  const int64_t tokens = topk_experts.dim(0), pairs = tokens * k;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(topk_weights, "topk_weights", DType::kF32, {tokens, k}));
  const int32_t* experts = topk_experts.data<int32_t>();

  // Counting sort of pair indices p = t·k + j by expert; stable, so each bucket is in
  // (token, slot) order.
  std::vector<int64_t> bucket_start(num_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    if (experts[p] < 0 || experts[p] >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("topk_experts[", p / k, ", ", p % k,
                                                     "] = ", experts[p], " is outside [0, ",
                                                     num_experts, ")"));
    }
    ++bucket_start[experts[p] + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) bucket_start[e + 1] += bucket_start[e];
  std::vector<int64_t> sorted_pairs(pairs);
  {
    std::vector<int64_t> next(bucket_start.begin(), bucket_start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) sorted_pairs[next[experts[p]]++] = p;
  }

  // Capacity: an over-full expert keeps `capacity` pairs of its bucket, still in bucket order.
  const int64_t capacity = ExpertCapacity(config, tokens);
  std::vector<int64_t> kept(num_experts);
  const float* weights = topk_weights.data<float>();
  for (int64_t e = 0; e < num_experts; ++e) {
    auto first = sorted_pairs.begin() + bucket_start[e];
    auto last = sorted_pairs.begin() + bucket_start[e + 1];
    kept[e] = std::min<int64_t>(last - first, capacity);
    if (last - first > capacity && config.drop_policy == DropPolicy::kProbability) {
      std::stable_sort(first, last, [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
      std::sort(first, first + capacity);
    }
  }

  out->expert_offsets.assign(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    out->expert_offsets[e + 1] = out->expert_offsets[e] + kept[e];
  }
  out->num_rows = out->expert_offsets[num_experts];
  out->dropped = pairs - out->num_rows;
  if (out->row_token.empty() || out->row_token.dim(0) != out->num_rows) {
    out->row_token = Tensor::Empty(DType::kI32, {out->num_rows});
  }
  if (out->pair_row.empty() || out->pair_row.dim(0) != tokens || out->pair_row.dim(1) != k) {
    out->pair_row = Tensor::Empty(DType::kI32, {tokens, k});
  }
  int32_t* row_token = out->row_token.data<int32_t>();
  int32_t* pair_row = out->pair_row.data<int32_t>();
  std::fill(pair_row, pair_row + pairs, -1);
  for (int64_t e = 0; e < num_experts; ++e) {
    for (int64_t i = 0; i < kept[e]; ++i) {
      const int64_t p = sorted_pairs[bucket_start[e] + i];
      const int64_t row = out->expert_offsets[e] + i;
      row_token[row] = static_cast<int32_t>(p / k);
      pair_row[p] = static_cast<int32_t>(row);
    }
  }
  return absl::OkStatus();
}

}  // namespace moetrain
