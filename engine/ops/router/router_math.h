// The router's per-token math, for the CPU and CUDA kernels alike (router.h defines what it
// computes): score functions, group-limited top-k selection and the combine weights.
#ifndef MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_
#define MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"
#include "engine/moe/moe_config.h"

namespace moetrain {

// The routing fields of a MoeConfig as plain numbers, which device code can read.
struct RoutingParams {
  int64_t num_experts;    // E
  int64_t top_k;          // k
  int64_t num_groups;     // G (1 = not group-limited)
  int64_t group_top_k;    // groups an expert may come from
  int64_t group_members;  // best selection scores that make a group's score
  bool softmax_after_topk;
  bool normalize;  // divide the chosen weights by their sum (not for softmax after top-k)
  double scale;    // ρ, the routed scaling factor

  static RoutingParams Of(const MoeConfig& config) {
    return {config.num_experts,
            config.top_k,
            config.num_groups,
            config.group_top_k,
            config.group_score_members(),
            config.score_function == ScoreFunction::kSoftmax && !config.softmax_before_topk,
            config.normalize_topk_weights,
            config.routed_scaling_factor};
  }
};

// exp of a non-positive argument cannot overflow, so each branch is safe for any |z|.
MOETRAIN_HOST_DEVICE float Sigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  const float e = expf(z);
  return e / (1.0f + e);
}

// σ'(z) = σ(z)·σ(−z) = a / (1 + a)² with a = e^{−|z|}: no cancellation in 1 − s near s = 1.
MOETRAIN_HOST_DEVICE float SigmoidGrad(float z) {
  const float a = expf(-fabsf(z));
  return a / ((1.0f + a) * (1.0f + a));
}

// The k best of values offered in ascending index order, best first. Insertion into a sorted
// array of k: for k ≤ 8 of E = 256 this beats a heap, and most offers fail the first compare.
// A strict > keeps an earlier (lower-index) offer ahead of an equal later one.
class BestK {
 public:
  MOETRAIN_HOST_DEVICE BestK(int64_t k, float* values, int32_t* indices)
      : k_(k), values_(values), indices_(indices) {}
  MOETRAIN_HOST_DEVICE void Offer(float value, int32_t index) {
    if (size_ == k_ && !(value > values_[k_ - 1])) return;
    int64_t pos = size_ < k_ ? size_++ : k_ - 1;
    for (; pos > 0 && value > values_[pos - 1]; --pos) {
      values_[pos] = values_[pos - 1];
      indices_[pos] = indices_[pos - 1];
    }
    values_[pos] = value;
    indices_[pos] = index;
  }

 private:
  int64_t k_, size_ = 0;
  float* values_;
  int32_t* indices_;
};

// Per-token scratch of SelectTopK: values and indices hold E each, the group arrays G each.
struct TopKScratch {
  float* values;
  int32_t* indices;
  float* group_score;
  uint8_t* group_allowed;
};

// Writes to `chosen` (k) the experts with the highest `selection` (E) scores, best first, ties to
// the lower index; when group-limited, only from the best group_top_k groups (a group scores the
// sum of its best group_members selection scores; ties to the lower group).
MOETRAIN_HOST_DEVICE void SelectTopK(const RoutingParams& p, const float* selection,
                                     const TopKScratch& scratch, int32_t* chosen) {
  const int64_t group_size = p.num_experts / p.num_groups;
  for (int64_t g = 0; g < p.num_groups; ++g) scratch.group_allowed[g] = 1;
  if (p.num_groups > 1) {
    for (int64_t g = 0; g < p.num_groups; ++g) {
      BestK members(p.group_members, scratch.values, scratch.indices);
      for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
        members.Offer(selection[e], static_cast<int32_t>(e));
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < p.group_members; ++i) sum += scratch.values[i];
      scratch.group_score[g] = sum;
    }
    BestK groups(p.group_top_k, scratch.values, scratch.indices);
    for (int64_t g = 0; g < p.num_groups; ++g) {
      groups.Offer(scratch.group_score[g], static_cast<int32_t>(g));
    }
    for (int64_t g = 0; g < p.num_groups; ++g) scratch.group_allowed[g] = 0;
    for (int64_t i = 0; i < p.group_top_k; ++i) scratch.group_allowed[scratch.indices[i]] = 1;
  }
  // Offered in ascending expert order, as BestK's tie rule needs.
  BestK experts(p.top_k, scratch.values, chosen);
  for (int64_t g = 0; g < p.num_groups; ++g) {
    if (!scratch.group_allowed[g]) continue;
    for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
      experts.Offer(selection[e], static_cast<int32_t>(e));
    }
  }
}

// g (k) for the chosen experts of one token from its logits z (E) and scores s (E):
//   softmax after top-k:             g = ρ·softmax over j of z_{e_j}
//   softmax before top-k / sigmoid:  g = ρ·s_e / Σ_j s_{e_j} when normalising, else ρ·s_e
MOETRAIN_HOST_DEVICE void CombineWeights(const RoutingParams& p, const float* z, const float* s,
                                         const int32_t* chosen, float* weights) {
  const int64_t k = p.top_k;
  const double rho = p.scale;
  if (p.softmax_after_topk) {
    float max = z[chosen[0]];
    for (int64_t j = 1; j < k; ++j) {
      // std::max(max, z): the later value only when strictly larger.
      if (max < z[chosen[j]]) max = z[chosen[j]];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      weights[j] = expf(z[chosen[j]] - max);
      sum += weights[j];
    }
    for (int64_t j = 0; j < k; ++j) weights[j] = static_cast<float>(rho * weights[j] / sum);
    return;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
  const double scale = p.normalize ? rho / sum : rho;
  for (int64_t j = 0; j < k; ++j) weights[j] = static_cast<float>(s[chosen[j]] * scale);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_
