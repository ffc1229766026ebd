// A float64 reference of the router, written from the definitions at the top of
// engine/ops/router/router.h: naive loops, full sorts and explicit Jacobians. It shares no code
// with router_cpu.cc or router_math.h; router_test.cc proves its gradient against central
// differences and then holds the engine to it.
#ifndef MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_REFERENCE_H_
#define MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "engine/moe/moe_config.h"

namespace moetrain::router_test {

// One router call: the config, the inputs and the upstream gradient of the combine weights.
struct Problem {
  MoeConfig config;
  int64_t tokens = 0;               // T
  int64_t tokens_per_sequence = 0;  // 0 = T
  std::vector<float> logits;        // (T, E)
  std::vector<float> bias;          // (E)
  std::vector<float> d_weights;     // (T, k): ∂L/∂g
};

struct Reference {
  std::vector<double> scores;   // (T, E)
  std::vector<int> experts;     // (T, k)
  std::vector<double> weights;  // (T, k)
  std::vector<int64_t> counts;  // (E)
  double aux_loss = 0.0;
  double z_loss = 0.0;
};

inline bool IsSigmoid(const MoeConfig& c) { return c.score_function == ScoreFunction::kSigmoid; }
inline bool IsPostSoftmax(const MoeConfig& c) { return !IsSigmoid(c) && !c.softmax_before_topk; }

inline int64_t AuxSequenceLength(const Problem& p) {
  if (p.config.aux_loss != AuxLossType::kSequence || p.tokens_per_sequence == 0) return p.tokens;
  return p.tokens_per_sequence;
}

inline std::vector<double> RefSoftmax(const std::vector<double>& z) {
  double max = z[0];
  for (double v : z) max = std::max(max, v);
  std::vector<double> s(z.size());
  double sum = 0.0;
  for (size_t i = 0; i < z.size(); ++i) sum += std::exp(z[i] - max);
  for (size_t i = 0; i < z.size(); ++i) s[i] = std::exp(z[i] - max) / sum;
  return s;
}

inline double RefLogSumExp(const std::vector<double>& z) {
  double max = z[0];
  for (double v : z) max = std::max(max, v);
  double sum = 0.0;
  for (double v : z) sum += std::exp(v - max);
  return max + std::log(sum);
}

inline std::vector<double> Row(const std::vector<double>& m, int64_t row, int64_t width) {
  return std::vector<double>(m.begin() + row * width, m.begin() + (row + 1) * width);
}

// Forward of the reference on logits `z` (T, E) in double.
inline Reference RefForward(const Problem& p, const std::vector<double>& z) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, E = c.num_experts, k = c.top_k;
  Reference r;
  r.scores.resize(T * E);
  r.experts.resize(T * k);
  r.weights.resize(T * k);
  r.counts.assign(E, 0);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> zt = Row(z, t, E);
    std::vector<double> s(E);
    if (IsSigmoid(c)) {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-zt[e]));
    } else {
      s = RefSoftmax(zt);
    }
    std::copy(s.begin(), s.end(), r.scores.begin() + t * E);

    std::vector<double> sel(E);
    for (int64_t e = 0; e < E; ++e) {
      sel[e] = (IsPostSoftmax(c) ? zt[e] : s[e]) + (c.expert_bias ? p.bias[e] : 0.0);
    }
    std::vector<bool> allowed(E, true);
    if (c.num_groups > 1) {
      const int64_t size = E / c.num_groups;
      const int64_t members = std::max<int64_t>(1, k / c.group_top_k);
      std::vector<std::pair<double, int>> groups;  // (−score, index): ascending sort = best first
      for (int g = 0; g < c.num_groups; ++g) {
        std::vector<double> v(sel.begin() + g * size, sel.begin() + (g + 1) * size);
        std::sort(v.begin(), v.end(), std::greater<double>());
        double sum = 0.0;
        for (int64_t i = 0; i < members; ++i) sum += v[i];
        groups.push_back({-sum, g});
      }
      std::sort(groups.begin(), groups.end());
      std::fill(allowed.begin(), allowed.end(), false);
      for (int64_t i = 0; i < c.group_top_k; ++i) {
        for (int64_t e = 0; e < size; ++e) allowed[groups[i].second * size + e] = true;
      }
    }
    std::vector<std::pair<double, int>> order;  // (−selection score, expert)
    for (int e = 0; e < E; ++e) {
      if (allowed[e]) order.push_back({-sel[e], e});
    }
    std::sort(order.begin(), order.end());
    std::vector<int> chosen(k);
    for (int64_t j = 0; j < k; ++j) chosen[j] = order[j].second;

    std::vector<double> g(k);
    if (IsPostSoftmax(c)) {
      std::vector<double> zc(k);
      for (int64_t j = 0; j < k; ++j) zc[j] = zt[chosen[j]];
      const std::vector<double> q = RefSoftmax(zc);
      for (int64_t j = 0; j < k; ++j) g[j] = c.routed_scaling_factor * q[j];
    } else {
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
      for (int64_t j = 0; j < k; ++j) {
        g[j] = c.routed_scaling_factor * s[chosen[j]] / (c.normalize_topk_weights ? sum : 1.0);
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      r.experts[t * k + j] = chosen[j];
      r.weights[t * k + j] = g[j];
      ++r.counts[chosen[j]];
    }
  }

  if (c.aux_loss != AuxLossType::kNone) {
    const int64_t L = AuxSequenceLength(p);
    const int64_t num_sequences = T / L;
    double total = 0.0;
    for (int64_t q = 0; q < num_sequences; ++q) {
      std::vector<double> f(E, 0.0), P(E, 0.0);
      for (int64_t t = q * L; t < (q + 1) * L; ++t) {
        for (int64_t j = 0; j < k; ++j) f[r.experts[t * k + j]] += 1.0 / (L * k);
        double row_sum = 0.0;
        for (int64_t e = 0; e < E; ++e) row_sum += r.scores[t * E + e];
        for (int64_t e = 0; e < E; ++e) {
          const double prob = IsSigmoid(c) ? r.scores[t * E + e] / row_sum : r.scores[t * E + e];
          P[e] += prob / L;
        }
      }
      double loss = 0.0;
      for (int64_t e = 0; e < E; ++e) loss += f[e] * P[e];
      total += c.aux_loss_coeff * E * loss;
    }
    r.aux_loss = total / num_sequences;
  }
  if (c.z_loss_coeff != 0.0f) {
    double sum = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const double lse = RefLogSumExp(Row(z, t, E));
      sum += lse * lse;
    }
    r.z_loss = c.z_loss_coeff * sum / T;
  }
  return r;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Σ g·d_weights + aux + z at logits z (the selection of these logits).
inline double RefLoss(const Problem& p, const std::vector<double>& z) {
  const Reference r = RefForward(p, z);
  double loss = r.aux_loss + r.z_loss;
  for (size_t i = 0; i < r.weights.size(); ++i) loss += r.weights[i] * p.d_weights[i];
  return loss;
}

// ∂RefLoss/∂z with the selection and f held constant, through explicit Jacobians.
inline std::vector<double> RefGradient(const Problem& p) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, E = c.num_experts, k = c.top_k;
  const std::vector<double> z = ToDouble(p.logits);
  const Reference r = RefForward(p, z);
  const double rho = c.routed_scaling_factor;
  const int64_t L = AuxSequenceLength(p);
  std::vector<double> grad(T * E, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> s = Row(r.scores, t, E);
    const int* chosen = &r.experts[t * k];
    const float* dg = &p.d_weights[t * k];
    std::vector<double> d_s(E, 0.0), d_z(E, 0.0);

    if (IsPostSoftmax(c)) {
      std::vector<double> zc(k);
      for (int64_t j = 0; j < k; ++j) zc[j] = z[t * E + chosen[j]];
      const std::vector<double> q = RefSoftmax(zc);
      for (int64_t i = 0; i < k; ++i) {  // ∂g_i/∂z_{e_l} = ρ·q_i·(δ_il − q_l)
        for (int64_t l = 0; l < k; ++l) {
          d_z[chosen[l]] += dg[i] * rho * q[i] * ((i == l ? 1.0 : 0.0) - q[l]);
        }
      }
    } else {
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t l = 0; l < k; ++l) {  // ∂g_j/∂s_{e_l}
          double dgj_dsl = (j == l ? 1.0 : 0.0);
          if (c.normalize_topk_weights) dgj_dsl = dgj_dsl / sum - s[chosen[j]] / (sum * sum);
          d_s[chosen[l]] += dg[j] * rho * dgj_dsl;
        }
      }
    }

    if (c.aux_loss != AuxLossType::kNone) {
      const int64_t q = t / L;
      std::vector<double> n(E, 0.0);
      for (int64_t u = q * L; u < (q + 1) * L; ++u) {
        for (int64_t j = 0; j < k; ++j) n[r.experts[u * k + j]] += 1.0;
      }
      std::vector<double> d_p(E);
      for (int64_t e = 0; e < E; ++e) {
        d_p[e] = c.aux_loss_coeff * E * (n[e] / (L * k)) / L / (T / L);
      }
      if (IsSigmoid(c)) {
        double Q = 0.0;
        for (double v : s) Q += v;
        for (int64_t a = 0; a < E; ++a) {  // ∂p_a/∂s_b = δ_ab/Q − s_a/Q²
          for (int64_t b = 0; b < E; ++b) {
            d_s[b] += d_p[a] * ((a == b ? 1.0 / Q : 0.0) - s[a] / (Q * Q));
          }
        }
      } else {
        for (int64_t e = 0; e < E; ++e) d_s[e] += d_p[e];
      }
    }

    for (int64_t a = 0; a < E; ++a) {  // d_z += (∂s/∂z)ᵀ·d_s
      for (int64_t b = 0; b < E; ++b) {
        const double ds_a_dz_b = IsSigmoid(c) ? (a == b ? s[a] * (1.0 - s[a]) : 0.0)
                                              : s[a] * ((a == b ? 1.0 : 0.0) - s[b]);
        d_z[b] += d_s[a] * ds_a_dz_b;
      }
    }

    if (c.z_loss_coeff != 0.0f) {
      const std::vector<double> zt = Row(z, t, E);
      const double lse = RefLogSumExp(zt);
      const std::vector<double> sm = RefSoftmax(zt);
      for (int64_t e = 0; e < E; ++e) d_z[e] += c.z_loss_coeff * 2.0 * lse * sm[e] / T;
    }
    std::copy(d_z.begin(), d_z.end(), grad.begin() + t * E);
  }
  return grad;
}

}  // namespace moetrain::router_test

#endif  // MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_REFERENCE_H_
