// A float64 reference of the MoE layer, written from the definitions at the top of
// engine/ops/router/router.h and engine/moe/moe_layer.h with naive per-token loops, and its
// hand-written backward. It shares no code with the engine; moe_layer_gradient_test.cc proves it
// against central differences, and moe_layer_test.cc then holds the engine to it.
#ifndef MOETRAIN_TESTS_ENGINE_MOE_MOE_REFERENCE_H_
#define MOETRAIN_TESTS_ENGINE_MOE_MOE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "engine/moe/moe_config.h"

namespace moetrain::reference {

// E experts, D hidden, F expert_ffn_dim, S·F shared width. Layouts as in MoeWeights.
struct Weights {
  int64_t num_experts = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
  int64_t shared_ffn = 0;              // S·F; 0 = no shared experts
  std::vector<double> router;          // (E, D)
  std::vector<double> expert_bias;     // (E); empty when the config has none
  std::vector<double> expert_gate_up;  // (E, 2F, D): rows [0, F) gate, [F, 2F) up
  std::vector<double> expert_down;     // (E, D, F)
  std::vector<double> shared_gate_up;  // (2SF, D)
  std::vector<double> shared_down;     // (D, SF)
};

// Gradients of L = Σ out·d_out + aux_loss + z_loss, same layouts as the weights, plus d_x (T, D).
struct Grads {
  std::vector<double> x;
  std::vector<double> router;
  std::vector<double> expert_gate_up;
  std::vector<double> expert_down;
  std::vector<double> shared_gate_up;
  std::vector<double> shared_down;
};

struct Routing {
  std::vector<double> logits;              // (T, E)
  std::vector<double> scores;              // (T, E) s
  std::vector<double> probs;               // (T, E) p, for the aux loss
  std::vector<int> experts;                // (T, k), best selection score first
  std::vector<double> weights;             // (T, k) g
  std::vector<char> kept;                  // (T, k) 1 = computed, 0 = dropped by capacity
  std::vector<int64_t> tokens_per_expert;  // (E) pairs chosen, before drops
  int64_t capacity = 0;                    // per expert; T·k when dropless
  int64_t dropped = 0;
  double aux_loss = 0.0;
  double z_loss = 0.0;
  // The smallest gap between the last chosen and the first rejected candidate (experts, groups,
  // and pairs at the capacity cut), relative where the engine's rounding error is (softmax
  // scores without bias, combine weights): an error below it cannot change the decision.
  double selection_margin = std::numeric_limits<double>::infinity();
  double capacity_margin = std::numeric_limits<double>::infinity();
};

struct ForwardResult {
  Routing routing;
  std::vector<double> out;  // (T, D)
};

inline double Sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
inline double Silu(double v) { return v * Sigmoid(v); }
inline double SiluGrad(double v) {
  const double sg = Sigmoid(v);
  return sg * (1.0 + v * (1.0 - sg));
}

// Indices of `values` ordered by value, largest first; equal values keep the lower index first.
inline std::vector<int> OrderDescending(const std::vector<double>& values) {
  std::vector<int> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return values[a] > values[b]; });
  return order;
}

// y (D) = (silu(x·Gᵀ) ⊙ (x·Uᵀ))·Downᵀ for gate_up (2F, D), down (D, F), x (D).
inline void SwiGluForward(const double* gate_up, const double* down, int64_t hidden, int64_t ffn,
                          const double* x, double* y) {
  std::vector<double> activated(ffn);
  for (int64_t f = 0; f < ffn; ++f) {
    double gate = 0.0, up = 0.0;
    for (int64_t d = 0; d < hidden; ++d) {
      gate += gate_up[f * hidden + d] * x[d];
      up += gate_up[(ffn + f) * hidden + d] * x[d];
    }
    activated[f] = Silu(gate) * up;
  }
  for (int64_t d = 0; d < hidden; ++d) {
    double sum = 0.0;
    for (int64_t f = 0; f < ffn; ++f) sum += down[d * ffn + f] * activated[f];
    y[d] = sum;
  }
}

// Adds the gradients of y·d_y (y = SwiGluForward(x)) to d_gate_up, d_down and d_x.
inline void SwiGluBackward(const double* gate_up, const double* down, int64_t hidden, int64_t ffn,
                           const double* x, const double* d_y, double* d_gate_up, double* d_down,
                           double* d_x) {
  for (int64_t f = 0; f < ffn; ++f) {
    double gate = 0.0, up = 0.0;
    for (int64_t d = 0; d < hidden; ++d) {
      gate += gate_up[f * hidden + d] * x[d];
      up += gate_up[(ffn + f) * hidden + d] * x[d];
    }
    const double activated = Silu(gate) * up;
    double d_activated = 0.0;
    for (int64_t d = 0; d < hidden; ++d) {
      d_activated += down[d * ffn + f] * d_y[d];
      d_down[d * ffn + f] += d_y[d] * activated;
    }
    const double d_gate = d_activated * up * SiluGrad(gate);
    const double d_up = d_activated * Silu(gate);
    for (int64_t d = 0; d < hidden; ++d) {
      d_gate_up[f * hidden + d] += d_gate * x[d];
      d_gate_up[(ffn + f) * hidden + d] += d_up * x[d];
      d_x[d] += gate_up[f * hidden + d] * d_gate + gate_up[(ffn + f) * hidden + d] * d_up;
    }
  }
}

inline bool SoftmaxScores(const MoeConfig& c) {
  return c.score_function == ScoreFunction::kSoftmax;
}
inline bool SoftmaxAfterTopk(const MoeConfig& c) {
  return SoftmaxScores(c) && !c.softmax_before_topk;
}

// Tokens of one aux-loss sequence: tokens_per_sequence for the sequence loss (0 = all), T else.
inline int64_t AuxSequenceLength(const MoeConfig& c, int64_t tokens, int64_t tokens_per_sequence) {
  if (c.aux_loss == AuxLossType::kSequence && tokens_per_sequence > 0) return tokens_per_sequence;
  return tokens;
}

inline Routing Route(const MoeConfig& c, const Weights& w, const std::vector<double>& x,
                     int64_t tokens, int64_t tokens_per_sequence) {
  const int64_t num_experts = w.num_experts, hidden = w.hidden, k = c.top_k;
  const double rho = c.routed_scaling_factor;
  Routing r;
  r.logits.assign(tokens * num_experts, 0.0);
  r.scores.assign(tokens * num_experts, 0.0);
  r.probs.assign(tokens * num_experts, 0.0);
  r.experts.assign(tokens * k, -1);
  r.weights.assign(tokens * k, 0.0);
  r.kept.assign(tokens * k, 1);
  r.tokens_per_expert.assign(num_experts, 0);

  double z_loss_sum = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> z(num_experts), s(num_experts), p(num_experts), sel(num_experts);
    for (int64_t e = 0; e < num_experts; ++e) {
      double sum = 0.0;
      for (int64_t d = 0; d < hidden; ++d) sum += w.router[e * hidden + d] * x[t * hidden + d];
      z[e] = sum;
    }
    const double z_max = *std::max_element(z.begin(), z.end());
    double exp_sum = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) exp_sum += std::exp(z[e] - z_max);
    const double lse = z_max + std::log(exp_sum);
    z_loss_sum += lse * lse;
    std::vector<double> softmax(num_experts);
    for (int64_t e = 0; e < num_experts; ++e) softmax[e] = std::exp(z[e] - lse);

    if (SoftmaxScores(c)) {
      s = softmax;
      p = softmax;
    } else {
      double s_sum = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) s_sum += s[e] = Sigmoid(z[e]);
      for (int64_t e = 0; e < num_experts; ++e) p[e] = s[e] / s_sum;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      sel[e] = SoftmaxAfterTopk(c) ? z[e] : s[e];
      if (c.expert_bias) sel[e] += w.expert_bias[e];
    }

    // Group-limited routing: experts outside the best group_top_k groups cannot be chosen.
    // Softmax scores carry a relative rounding error, s + b and z + b an absolute one.
    const bool relative = SoftmaxScores(c) && c.softmax_before_topk && !c.expert_bias;
    auto gap = [relative](double chosen, double rejected) {
      return relative ? (chosen - rejected) / std::abs(chosen) : chosen - rejected;
    };
    std::vector<char> allowed(num_experts, 1);
    if (c.num_groups > 1) {
      const int64_t per_group = num_experts / c.num_groups;
      const int64_t members = std::max<int64_t>(1, k / c.group_top_k);
      std::vector<double> group_score(c.num_groups);
      for (int64_t g = 0; g < c.num_groups; ++g) {
        std::vector<double> member(sel.begin() + g * per_group, sel.begin() + (g + 1) * per_group);
        std::sort(member.begin(), member.end(), std::greater<>());
        group_score[g] = std::accumulate(member.begin(), member.begin() + members, 0.0);
      }
      const std::vector<int> group_order = OrderDescending(group_score);
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int64_t i = 0; i < c.group_top_k; ++i) {
        for (int64_t j = 0; j < per_group; ++j) allowed[group_order[i] * per_group + j] = 1;
      }
      if (c.group_top_k < c.num_groups) {
        r.selection_margin =
            std::min(r.selection_margin, gap(group_score[group_order[c.group_top_k - 1]],
                                             group_score[group_order[c.group_top_k]]));
      }
    }
    std::vector<double> candidate = sel;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (!allowed[e]) candidate[e] = -std::numeric_limits<double>::infinity();
    }
    const std::vector<int> order = OrderDescending(candidate);
    if (k < num_experts && std::isfinite(candidate[order[k]])) {
      r.selection_margin =
          std::min(r.selection_margin, gap(candidate[order[k - 1]], candidate[order[k]]));
    }

    double chosen_sum = 0.0, chosen_exp_sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const int e = order[j];
      r.experts[t * k + j] = e;
      ++r.tokens_per_expert[e];
      chosen_sum += s[e];
      chosen_exp_sum += std::exp(z[e] - z_max);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int e = order[j];
      double g;
      if (SoftmaxAfterTopk(c)) {
        g = std::exp(z[e] - z_max) / chosen_exp_sum;
      } else {
        g = c.normalize_topk_weights ? s[e] / chosen_sum : s[e];
      }
      r.weights[t * k + j] = rho * g;
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      r.logits[t * num_experts + e] = z[e];
      r.scores[t * num_experts + e] = s[e];
      r.probs[t * num_experts + e] = p[e];
    }
  }
  r.z_loss = tokens > 0 ? c.z_loss_coeff * z_loss_sum / static_cast<double>(tokens) : 0.0;

  if (c.aux_loss != AuxLossType::kNone) {
    const int64_t seq_len = AuxSequenceLength(c, tokens, tokens_per_sequence);
    const int64_t num_seq = tokens / seq_len;
    for (int64_t q = 0; q < num_seq; ++q) {
      std::vector<double> count(num_experts, 0.0), prob_sum(num_experts, 0.0);
      for (int64_t t = q * seq_len; t < (q + 1) * seq_len; ++t) {
        for (int64_t j = 0; j < k; ++j) count[r.experts[t * k + j]] += 1.0;
        for (int64_t e = 0; e < num_experts; ++e) prob_sum[e] += r.probs[t * num_experts + e];
      }
      double seq_loss = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) {
        seq_loss += (count[e] / static_cast<double>(seq_len * k)) *
                    (prob_sum[e] / static_cast<double>(seq_len));
      }
      r.aux_loss += c.aux_loss_coeff * num_experts * seq_loss / static_cast<double>(num_seq);
    }
  }

  // Capacity: per expert, its pairs in (token, slot) order; keep the first C by position, or the
  // C largest g (stable, so ties go to the earlier token).
  r.capacity = tokens * k;
  if (c.capacity_factor > 0.0f) {
    r.capacity = static_cast<int64_t>(std::ceil(static_cast<double>(c.capacity_factor) * tokens *
                                                k / static_cast<double>(num_experts)));
    for (int64_t e = 0; e < num_experts; ++e) {
      std::vector<int64_t> pairs;
      for (int64_t i = 0; i < tokens * k; ++i) {
        if (r.experts[i] == e) pairs.push_back(i);
      }
      if (static_cast<int64_t>(pairs.size()) <= r.capacity) continue;
      if (c.drop_policy == DropPolicy::kProbability) {
        std::stable_sort(pairs.begin(), pairs.end(),
                         [&](int64_t a, int64_t b) { return r.weights[a] > r.weights[b]; });
        const double kept_weight = r.weights[pairs[r.capacity - 1]];
        r.capacity_margin =
            std::min(r.capacity_margin, (kept_weight - r.weights[pairs[r.capacity]]) / kept_weight);
      }
      for (size_t i = r.capacity; i < pairs.size(); ++i) {
        r.kept[pairs[i]] = 0;
        ++r.dropped;
      }
    }
  }
  return r;
}

inline ForwardResult Forward(const MoeConfig& c, const Weights& w, const std::vector<double>& x,
                             int64_t tokens, int64_t tokens_per_sequence) {
  const int64_t hidden = w.hidden, ffn = w.ffn, k = c.top_k;
  ForwardResult result;
  result.routing = Route(c, w, x, tokens, tokens_per_sequence);
  const Routing& r = result.routing;
  result.out.assign(tokens * hidden, 0.0);
  std::vector<double> y(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    double* out = &result.out[t * hidden];
    for (int64_t j = 0; j < k; ++j) {
      if (!r.kept[t * k + j]) continue;
      const int64_t e = r.experts[t * k + j];
      SwiGluForward(&w.expert_gate_up[e * 2 * ffn * hidden], &w.expert_down[e * hidden * ffn],
                    hidden, ffn, &x[t * hidden], y.data());
      for (int64_t d = 0; d < hidden; ++d) out[d] += r.weights[t * k + j] * y[d];
    }
    if (w.shared_ffn > 0) {
      SwiGluForward(w.shared_gate_up.data(), w.shared_down.data(), hidden, w.shared_ffn,
                    &x[t * hidden], y.data());
      for (int64_t d = 0; d < hidden; ++d) out[d] += y[d];
    }
  }
  return result;
}

// L = Σ out·d_out + aux_loss + z_loss.
inline double Loss(const ForwardResult& f, const std::vector<double>& d_out) {
  double loss = f.routing.aux_loss + f.routing.z_loss;
  for (size_t i = 0; i < d_out.size(); ++i) loss += f.out[i] * d_out[i];
  return loss;
}

inline Grads Backward(const MoeConfig& c, const Weights& w, const std::vector<double>& x,
                      int64_t tokens, int64_t tokens_per_sequence, const ForwardResult& f,
                      const std::vector<double>& d_out) {
  const int64_t num_experts = w.num_experts, hidden = w.hidden, ffn = w.ffn, k = c.top_k;
  const double rho = c.routed_scaling_factor;
  const Routing& r = f.routing;
  Grads grads;
  grads.x.assign(tokens * hidden, 0.0);
  grads.router.assign(w.router.size(), 0.0);
  grads.expert_gate_up.assign(w.expert_gate_up.size(), 0.0);
  grads.expert_down.assign(w.expert_down.size(), 0.0);
  grads.shared_gate_up.assign(w.shared_gate_up.size(), 0.0);
  grads.shared_down.assign(w.shared_down.size(), 0.0);

  // dL/dp of the aux loss: α·E·f_e / (sequence length · number of sequences), f_e per sequence.
  std::vector<double> d_probs(tokens * num_experts, 0.0);
  if (c.aux_loss != AuxLossType::kNone) {
    const int64_t seq_len = AuxSequenceLength(c, tokens, tokens_per_sequence);
    const int64_t num_seq = tokens / seq_len;
    for (int64_t q = 0; q < num_seq; ++q) {
      std::vector<double> count(num_experts, 0.0);
      for (int64_t t = q * seq_len; t < (q + 1) * seq_len; ++t) {
        for (int64_t j = 0; j < k; ++j) count[r.experts[t * k + j]] += 1.0;
      }
      for (int64_t t = q * seq_len; t < (q + 1) * seq_len; ++t) {
        for (int64_t e = 0; e < num_experts; ++e) {
          d_probs[t * num_experts + e] = c.aux_loss_coeff * num_experts *
                                         (count[e] / static_cast<double>(seq_len * k)) /
                                         static_cast<double>(seq_len * num_seq);
        }
      }
    }
  }

  std::vector<double> y(hidden), d_y(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    const double* xt = &x[t * hidden];
    const double* dot = &d_out[t * hidden];
    double* dxt = &grads.x[t * hidden];

    // Experts: d_y = g·d_out, and d_g = y·d_out; dropped pairs have neither.
    std::vector<double> d_weights(k, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      if (!r.kept[t * k + j]) continue;
      const int64_t e = r.experts[t * k + j];
      const double* gate_up = &w.expert_gate_up[e * 2 * ffn * hidden];
      const double* down = &w.expert_down[e * hidden * ffn];
      SwiGluForward(gate_up, down, hidden, ffn, xt, y.data());
      for (int64_t d = 0; d < hidden; ++d) {
        d_weights[j] += y[d] * dot[d];
        d_y[d] = r.weights[t * k + j] * dot[d];
      }
      SwiGluBackward(gate_up, down, hidden, ffn, xt, d_y.data(),
                     &grads.expert_gate_up[e * 2 * ffn * hidden],
                     &grads.expert_down[e * hidden * ffn], dxt);
    }
    if (w.shared_ffn > 0) {
      SwiGluBackward(w.shared_gate_up.data(), w.shared_down.data(), hidden, w.shared_ffn, xt, dot,
                     grads.shared_gate_up.data(), grads.shared_down.data(), dxt);
    }

    const double* z = &r.logits[t * num_experts];
    const double* s = &r.scores[t * num_experts];
    const double* p = &r.probs[t * num_experts];
    std::vector<double> d_z(num_experts, 0.0), d_s(num_experts, 0.0);

    // Combine weights → logits.
    if (SoftmaxAfterTopk(c)) {
      // g_j = ρ·q_j with q = softmax of the chosen logits: dz_j = ρ·q_j·(dg_j − Σ_i q_i·dg_i).
      double weighted = 0.0;
      for (int64_t j = 0; j < k; ++j) weighted += r.weights[t * k + j] / rho * d_weights[j];
      for (int64_t j = 0; j < k; ++j) {
        d_z[r.experts[t * k + j]] += r.weights[t * k + j] * (d_weights[j] - weighted);
      }
    } else {
      double chosen_sum = 0.0, weighted = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const int e = r.experts[t * k + j];
        chosen_sum += s[e];
        weighted += d_weights[j] * s[e];
      }
      for (int64_t j = 0; j < k; ++j) {
        const int e = r.experts[t * k + j];
        d_s[e] += c.normalize_topk_weights
                      ? rho * (d_weights[j] / chosen_sum - weighted / (chosen_sum * chosen_sum))
                      : rho * d_weights[j];
      }
    }

    // Aux loss p → scores / logits.
    const double* dp = &d_probs[t * num_experts];
    if (SoftmaxScores(c)) {
      double dot_p = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) dot_p += p[e] * dp[e];
      for (int64_t e = 0; e < num_experts; ++e) d_z[e] += p[e] * (dp[e] - dot_p);
      // s is the same softmax: its gradient from the combine weights.
      double dot_s = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) dot_s += s[e] * d_s[e];
      for (int64_t e = 0; e < num_experts; ++e) d_z[e] += s[e] * (d_s[e] - dot_s);
    } else {
      // p = s / Σ s.
      double s_sum = 0.0, dot_p = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) {
        s_sum += s[e];
        dot_p += dp[e] * p[e];
      }
      for (int64_t e = 0; e < num_experts; ++e) d_s[e] += (dp[e] - dot_p) / s_sum;
      for (int64_t e = 0; e < num_experts; ++e) d_z[e] += d_s[e] * s[e] * (1.0 - s[e]);
    }

    // z-loss: β/T·lse², d lse / dz = softmax(z).
    if (c.z_loss_coeff != 0.0f) {
      const double z_max = *std::max_element(z, z + num_experts);
      double exp_sum = 0.0;
      for (int64_t e = 0; e < num_experts; ++e) exp_sum += std::exp(z[e] - z_max);
      const double lse = z_max + std::log(exp_sum);
      const double d_lse = c.z_loss_coeff * 2.0 * lse / static_cast<double>(tokens);
      for (int64_t e = 0; e < num_experts; ++e) d_z[e] += d_lse * std::exp(z[e] - lse);
    }

    for (int64_t e = 0; e < num_experts; ++e) {
      for (int64_t d = 0; d < hidden; ++d) {
        grads.router[e * hidden + d] += d_z[e] * xt[d];
        dxt[d] += w.router[e * hidden + d] * d_z[e];
      }
    }
  }
  return grads;
}

}  // namespace moetrain::reference

#endif  // MOETRAIN_TESTS_ENGINE_MOE_MOE_REFERENCE_H_
