// The router's per-token math, for the CPU and CUDA kernels alike (router.h defines what it
// computes): score functions, group-limited top-k selection, the combine weights, one token's
// forward and backward, the loss terms and the expert-bias step. Both backends call these
// functions and sum their per-token results serially in token order.
#ifndef MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_
#define MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_

#include <math.h>

#include <cstdint>

#include "engine/core/host_device.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/common/softmax_math.h"

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
  bool sigmoid;    // sigmoid scores (else softmax)

  static RoutingParams Of(const MoeConfig& config) {
    return {config.num_experts,
            config.top_k,
            config.num_groups,
            config.group_top_k,
            config.group_score_members(),
            config.score_function == ScoreFunction::kSoftmax && !config.softmax_before_topk,
            config.normalize_topk_weights,
            config.routed_scaling_factor,
            config.score_function == ScoreFunction::kSigmoid};
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

// Per-token scratch of SelectTopK: values and indices hold max(k, G) each (E always suffices),
// the group arrays G each.
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

// One token's forward from its finite logits z (E): the scores s (E), the chosen experts (k, best
// first) and their combine weights (k). `bias` (E, `bias_stride` apart) is added to the
// selection scores only; null without expert bias. `selection` (E) and `topk` are scratch.
// Returns logsumexp(z) for the z-loss: always for softmax scores (a by-product), for sigmoid
// scores only when `want_lse` (else 0).
MOETRAIN_HOST_DEVICE double RouteToken(const RoutingParams& p, const float* z, const float* bias,
                                       int64_t bias_stride, bool want_lse, float* selection,
                                       const TopKScratch& topk, float* s, int32_t* chosen,
                                       float* weights) {
  const int64_t E = p.num_experts;
  double lse = 0.0;
  if (p.sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = Sigmoid(z[e]);
    if (want_lse) lse = LogSumExp(z, E);
  } else {
    lse = Softmax(z, E, s);
  }
  const float* base = p.softmax_after_topk ? z : s;
  for (int64_t e = 0; e < E; ++e) {
    selection[e] = bias != nullptr ? base[e] + bias[e * bias_stride] : base[e];
  }
  SelectTopK(p, selection, topk, chosen);
  CombineWeights(p, z, s, chosen, weights);
  return lse;
}

// The z-loss β·mean_t lse_t² from the serial sum of the lse_t² over T ≥ 1 tokens.
MOETRAIN_HOST_DEVICE float ZLossValue(float z_loss_coeff, double lse_squared_sum, int64_t tokens) {
  return static_cast<float>(z_loss_coeff * lse_squared_sum / tokens);
}

// One token's aux-loss term Σ_e n_e·p_{t,e} from its scores s (E) and the counts n (E) of its
// sequence (or of the call): p = s for softmax scores, s / Σ_e s for sigmoid ones.
MOETRAIN_HOST_DEVICE double AuxLossTokenTerm(const float* s, const int64_t* n, int64_t experts,
                                             bool sigmoid) {
  double dot = 0.0, sum = 0.0;
  for (int64_t e = 0; e < experts; ++e) {
    dot += static_cast<double>(n[e]) * s[e];
    sum += s[e];
  }
  return sigmoid ? dot / sum : dot;
}

// ∂aux/∂p_{t,e} per count: aux = this · Σ_t Σ_e n_{q(t),e}·p_{t,e}, from
// α·E·mean_q Σ_e (n_{q,e}/(L·k))·(Σ_{t∈q} p_{t,e}/L). `count_tokens` is the T of f_e = n_e/(T·k):
// L, or the group's token count with group counts.
MOETRAIN_HOST_DEVICE double AuxLossCoeff(float aux_loss_coeff, int64_t experts, int64_t tokens,
                                         int64_t count_tokens, int64_t top_k) {
  return static_cast<double>(aux_loss_coeff) * experts /
         (static_cast<double>(tokens) * count_tokens * top_k);
}

// What the losses add to one token's gradient.
struct RouterLossGrad {
  bool aux;          // an aux loss: n and aux_coeff are read
  double aux_coeff;  // w·AuxLossCoeff: ∂(w·aux)/∂p_{t,e} = aux_coeff·n_{q(t),e}
  bool z;            // a z-loss
  double z_coeff;    // 2·w·β/T
};

// Per-token scratch of RouterTokenBackward: d_scores and dz hold E each, softmax_z E for sigmoid
// scores with a z-loss (else unused).
struct RouterGradScratch {
  double* d_scores;  // ∂L/∂s_{t,·}
  double* dz;        // ∂L/∂z_{t,·}
  float* softmax_z;
};

// d_logits of one token (E, `d_logits_stride` apart): the gradient of Σ_j g_j·G_j + the losses
// with respect to its logits z (E), given its forward's scores s (E), chosen experts (k, each in
// [0, E)) and weights g (k), G = d_g (k, `d_g_stride` apart), and the counts n (E) of its
// sequence when loss.aux.
MOETRAIN_HOST_DEVICE void RouterTokenBackward(const RoutingParams& p, const RouterLossGrad& loss,
                                              const float* z, const float* s, const int32_t* chosen,
                                              const float* g, const float* d_g, int64_t d_g_stride,
                                              const int64_t* n, const RouterGradScratch& scratch,
                                              float* d_logits, int64_t d_logits_stride) {
  const int64_t E = p.num_experts, k = p.top_k;
  const double rho = p.scale;
  double* d_scores = scratch.d_scores;
  double* dz = scratch.dz;
  for (int64_t e = 0; e < E; ++e) {
    d_scores[e] = 0.0;
    dz[e] = 0.0;
  }
  double grad_dot_g = 0.0;  // Σ_j G_j·g_j
  for (int64_t j = 0; j < k; ++j) grad_dot_g += static_cast<double>(d_g[j * d_g_stride]) * g[j];

  // Combine weights. G = ∂L/∂g.
  if (p.softmax_after_topk) {
    // g = ρ·q, q = softmax_j(z_{e_j}): ∂z_{e_i} = ρ·q_i·(G_i − Σ_j q_j·G_j) = g_i·(G_i − Σ_j
    // G_j·g_j/ρ).
    for (int64_t j = 0; j < k; ++j) {
      dz[chosen[j]] += g[j] * (d_g[j * d_g_stride] - grad_dot_g / rho);
    }
  } else if (p.normalize) {
    // g = ρ·s_i / S, S = Σ_j s_{e_j}: ∂s_{e_i} = (ρ·G_i − Σ_j G_j·g_j) / S.
    double chosen_sum = 0.0;
    for (int64_t j = 0; j < k; ++j) chosen_sum += s[chosen[j]];
    for (int64_t j = 0; j < k; ++j) {
      d_scores[chosen[j]] += (rho * d_g[j * d_g_stride] - grad_dot_g) / chosen_sum;
    }
  } else {
    for (int64_t j = 0; j < k; ++j) d_scores[chosen[j]] += rho * d_g[j * d_g_stride];
  }

  // Aux loss through p with f constant: ∂p_{t,e} = c_e = aux_coeff·n_{q(t),e}.
  if (loss.aux) {
    const double aux_coeff = loss.aux_coeff;
    if (p.sigmoid) {
      // p = s / Q, Q = Σ_e s_e: ∂s_e = (c_e − Σ_e' c_e'·p_e') / Q.
      double q = 0.0, c_dot_s = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        q += s[e];
        c_dot_s += aux_coeff * n[e] * s[e];
      }
      for (int64_t e = 0; e < E; ++e) d_scores[e] += (aux_coeff * n[e] - c_dot_s / q) / q;
    } else {
      for (int64_t e = 0; e < E; ++e) d_scores[e] += aux_coeff * n[e];
    }
  }

  // Through the score function.
  if (p.sigmoid) {
    for (int64_t e = 0; e < E; ++e) {
      if (d_scores[e] != 0.0) dz[e] += d_scores[e] * SigmoidGrad(z[e]);
    }
  } else if (!p.softmax_after_topk || loss.aux) {
    // s = softmax(z): ∂z_e = s_e·(∂s_e − Σ_e' s_e'·∂s_e').
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += s[e] * d_scores[e];
    for (int64_t e = 0; e < E; ++e) dz[e] += s[e] * (d_scores[e] - dot);
  }

  // z-loss β·mean_t lse_t²: ∂z_{t,e} = (2β/T)·lse_t·softmax(z_t)_e.
  if (loss.z) {
    double lse;
    const float* softmax = s;  // softmax(z): the scores already, unless they are sigmoids
    if (p.sigmoid) {
      lse = Softmax(z, E, scratch.softmax_z);
      softmax = scratch.softmax_z;
    } else {
      lse = LogSumExp(z, E);
    }
    for (int64_t e = 0; e < E; ++e) dz[e] += loss.z_coeff * lse * softmax[e];
  }
  for (int64_t e = 0; e < E; ++e) d_logits[e * d_logits_stride] = static_cast<float>(dz[e]);
}

// The step of b_e in aux-loss-free balancing: +rate when expert e's load is below the mean, −rate
// above it, 0 at it.
MOETRAIN_HOST_DEVICE float ExpertBiasStep(double mean_load, int64_t load, float rate) {
  const double gap = mean_load - static_cast<double>(load);
  return gap > 0.0 ? rate : (gap < 0.0 ? -rate : 0.0f);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_OPS_ROUTER_ROUTER_MATH_H_
