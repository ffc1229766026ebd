#include "engine/moe/router.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"

namespace moetrain {
namespace {

// A token costs O(E) work: fewer than this many per chunk would not pay for the hand-off.
constexpr int64_t kGrainTokens = 64;

// Element (row, col) of a rank-2 view with any strides.
template <typename T>
T& At(const TensorView& v, int64_t row, int64_t col) {
  return v.data<T>()[row * v.stride(0) + col * v.stride(1)];
}

bool IsSoftmaxAfterTopK(const MoeConfig& config) {
  return config.score_function == ScoreFunction::kSoftmax && !config.softmax_before_topk;
}
bool HasAuxLoss(const MoeConfig& config) {
  return config.aux_loss != AuxLossType::kNone && config.aux_loss_coeff > 0.0f;
}
bool HasZLoss(const MoeConfig& config) { return config.z_loss_coeff > 0.0f; }

// exp of a non-positive argument cannot overflow, so each branch is safe for any |z|.
float Sigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + std::exp(-z));
  const float e = std::exp(z);
  return e / (1.0f + e);
}

// σ'(z) = σ(z)·σ(−z) = a / (1 + a)² with a = e^{−|z|}: no cancellation in 1 − s near s = 1.
float SigmoidGrad(float z) {
  const float a = std::exp(-std::fabs(z));
  return a / ((1.0f + a) * (1.0f + a));
}

// s = softmax(z) over n entries; returns logsumexp(z). Shifted by the max so exp cannot overflow.
double Softmax(const float* z, int64_t n, float* s) {
  const float max = *std::max_element(z, z + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(z[i] - max);
    sum += s[i];
  }
  const double inv_sum = 1.0 / sum;
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(s[i] * inv_sum);
  return max + std::log(sum);
}

double LogSumExp(const float* z, int64_t n) {
  const float max = *std::max_element(z, z + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(z[i] - max);
  return max + std::log(sum);
}

// The validated extents of one router call.
struct Extents {
  int64_t tokens;   // T
  int64_t experts;  // E
  int64_t top_k;    // k
  int64_t seq_len;  // L: tokens per aux-loss sequence (T for the switch loss)
  int64_t num_sequences() const { return seq_len > 0 ? tokens / seq_len : 0; }
};

absl::StatusOr<Extents> CheckRouterArgs(const MoeConfig& config, const RouterArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  const int64_t num_experts = config.num_experts;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(args.logits, "logits", DType::kF32, {-1, num_experts}));
  if (config.expert_bias) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(args.expert_bias, "expert_bias", DType::kF32, {num_experts}));
    for (int64_t e = 0; e < num_experts; ++e) {
      const float b = args.expert_bias.data<float>()[e * args.expert_bias.stride(0)];
      if (!std::isfinite(b)) {
        return absl::InvalidArgumentError(
            absl::StrCat("expert_bias[", e, "] = ", b, " is not finite"));
      }
    }
  }
  const int64_t tokens = args.logits.dim(0);
  if (args.tokens_per_sequence < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens_per_sequence = ", args.tokens_per_sequence,
                     " must not be negative (0 = all tokens)"));
  }
  const int64_t seq_len = args.tokens_per_sequence == 0 ? tokens : args.tokens_per_sequence;
  if (seq_len > 0 && tokens % seq_len != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logits has T = ", tokens,
        " tokens, not a multiple of tokens_per_sequence = ", args.tokens_per_sequence));
  }
  return Extents{tokens, num_experts, config.top_k,
                 config.aux_loss == AuxLossType::kSequence ? seq_len : tokens};
}

// Reuses `t` when it already has this dtype and shape.
void EnsureTensor(Tensor* t, DType dtype, std::initializer_list<int64_t> shape) {
  if (!t->empty() && t->dtype() == dtype && t->view().shape() == absl::Span<const int64_t>(shape)) {
    return;
  }
  *t = Tensor::Empty(dtype, shape);
}

// The k best of values offered in ascending index order, best first. Insertion into a sorted
// array of k: for k ≤ 8 of E = 256 this beats a heap, and most offers fail the first compare.
// A strict > keeps an earlier (lower-index) offer ahead of an equal later one.
class BestK {
 public:
  BestK(int64_t k, float* values, int32_t* indices) : k_(k), values_(values), indices_(indices) {}
  void Offer(float value, int32_t index) {
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

// One chunk's scratch, so that tokens allocate nothing.
struct SelectScratch {
  explicit SelectScratch(const MoeConfig& config)
      : logits(config.num_experts),
        selection(config.num_experts),
        best_values(config.num_experts),
        best_indices(config.num_experts),
        group_score(config.num_groups),
        group_allowed(config.num_groups) {}
  std::vector<float> logits;       // (E) z of the token, made contiguous
  std::vector<float> selection;    // (E) s + b, or z + b for softmax after top-k
  std::vector<float> best_values;  // (≤ E) BestK storage
  std::vector<int32_t> best_indices;
  std::vector<float> group_score;      // (G)
  std::vector<uint8_t> group_allowed;  // (G)
};

// Writes to `chosen` (k) the experts with the highest scratch->selection, best first, ties to
// the lower index; when group-limited, only from the best group_top_k groups.
void SelectTopK(const MoeConfig& config, SelectScratch* scratch, int32_t* chosen) {
  const float* sel = scratch->selection.data();
  float* values = scratch->best_values.data();
  int32_t* indices = scratch->best_indices.data();
  const int64_t group_size = config.experts_per_group();
  std::fill(scratch->group_allowed.begin(), scratch->group_allowed.end(), 1);
  if (config.num_groups > 1) {
    for (int64_t g = 0; g < config.num_groups; ++g) {
      BestK members(config.group_score_members(), values, indices);
      for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) members.Offer(sel[e], e);
      float sum = 0.0f;
      for (int64_t i = 0; i < config.group_score_members(); ++i) sum += values[i];
      scratch->group_score[g] = sum;
    }
    BestK groups(config.group_top_k, values, indices);
    for (int64_t g = 0; g < config.num_groups; ++g) groups.Offer(scratch->group_score[g], g);
    std::fill(scratch->group_allowed.begin(), scratch->group_allowed.end(), 0);
    for (int64_t i = 0; i < config.group_top_k; ++i) scratch->group_allowed[indices[i]] = 1;
  }
  // Offered in ascending expert order, as BestK's tie rule needs.
  BestK experts(config.top_k, values, chosen);
  for (int64_t g = 0; g < config.num_groups; ++g) {
    if (!scratch->group_allowed[g]) continue;
    for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) experts.Offer(sel[e], e);
  }
}

// g (k) for the chosen experts of one token from its logits z (E) and scores s (E).
void CombineWeights(const MoeConfig& config, const float* z, const float* s, const int32_t* chosen,
                    float* weights) {
  const int64_t k = config.top_k;
  const double rho = config.routed_scaling_factor;
  if (IsSoftmaxAfterTopK(config)) {
    float max = z[chosen[0]];
    for (int64_t j = 1; j < k; ++j) max = std::max(max, z[chosen[j]]);
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      weights[j] = std::exp(z[chosen[j]] - max);
      sum += weights[j];
    }
    for (int64_t j = 0; j < k; ++j) weights[j] = static_cast<float>(rho * weights[j] / sum);
    return;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
  const double scale = config.normalize_topk_weights ? rho / sum : rho;
  for (int64_t j = 0; j < k; ++j) weights[j] = static_cast<float>(s[chosen[j]] * scale);
}

// n_{q,e}: pairs chosen for expert e within aux-loss sequence q, (num_sequences, E).
std::vector<int64_t> CountPerSequence(const Extents& x, const int32_t* topk_experts) {
  std::vector<int64_t> counts(std::max<int64_t>(x.num_sequences(), 1) * x.experts, 0);
  for (int64_t t = 0; t < x.tokens; ++t) {
    int64_t* row = counts.data() + (t / x.seq_len) * x.experts;
    for (int64_t j = 0; j < x.top_k; ++j) ++row[topk_experts[t * x.top_k + j]];
  }
  return counts;
}

// ∂aux/∂p_{t,e} = aux_coeff · n_{q(t),e}: from α·E·mean_q Σ_e (n_{q,e}/(L·k))·(Σ_{t∈q} p_{t,e}/L).
// `count_tokens` is the T of f_e = n_e/(T·k): L, or the group's token count with a count group.
double AuxLossCoeff(const MoeConfig& config, const Extents& x, int64_t count_tokens) {
  return static_cast<double>(config.aux_loss_coeff) * x.experts /
         (static_cast<double>(x.tokens) * count_tokens * x.top_k);
}

// Whether f_e of the switch aux loss counts the pairs of every rank in args.count_group.
bool UsesGroupCounts(const MoeConfig& config, const RouterArgs& args) {
  return args.count_group != nullptr && HasAuxLoss(config) &&
         config.aux_loss == AuxLossType::kSwitch;
}

// out->aux_counts, aux_tokens ← the E counts and T summed over the count group.
absl::Status SumCountsOverGroup(const RouterArgs& args, int64_t tokens, RouterOutput* out) {
  std::vector<int64_t> sums = out->tokens_per_expert;  // (E + 1): n_e, then T
  sums.push_back(tokens);
  MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                            args.count_group->StartAllReduceSum(
                                sums.data(), static_cast<int64_t>(sums.size()), DType::kI64));
  MOETRAIN_RETURN_IF_ERROR(request->Wait());
  out->aux_tokens = sums.back();
  sums.pop_back();
  out->aux_counts = std::move(sums);
  return absl::OkStatus();
}

}  // namespace

absl::Status RouterForward(const MoeConfig& config, const RouterArgs& args, RouterOutput* out) {
  MOETRAIN_ASSIGN_OR_RETURN(const Extents x, CheckRouterArgs(config, args));
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
  EnsureTensor(&out->scores, DType::kF32, {T, E});
  EnsureTensor(&out->topk_experts, DType::kI32, {T, k});
  EnsureTensor(&out->topk_weights, DType::kF32, {T, k});
  float* scores = out->scores.data<float>();
  int32_t* topk_experts = out->topk_experts.data<int32_t>();
  float* topk_weights = out->topk_weights.data<float>();
  const bool sigmoid = config.score_function == ScoreFunction::kSigmoid;
  const float* bias = config.expert_bias ? args.expert_bias.data<float>() : nullptr;
  const int64_t bias_stride = config.expert_bias ? args.expert_bias.stride(0) : 0;

  // Cross-token sums are taken serially over these per-token terms, so that they do not depend
  // on how the tokens were split among threads.
  std::vector<double> lse_squared(HasZLoss(config) ? T : 0);  // (T) (logsumexp z_t)²
  std::atomic<int64_t> first_bad_token{T};

  DefaultThreadPool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
    SelectScratch scratch(config);
    float* z = scratch.logits.data();
    for (int64_t t = begin; t < end; ++t) {
      bool finite = true;
      for (int64_t e = 0; e < E; ++e) {
        z[e] = At<float>(args.logits, t, e);
        finite = finite && std::isfinite(z[e]);
      }
      if (!finite) {
        int64_t seen = first_bad_token.load();
        while (t < seen && !first_bad_token.compare_exchange_weak(seen, t)) {
        }
        continue;
      }
      float* s = scores + t * E;
      double lse = 0.0;
      if (sigmoid) {
        for (int64_t e = 0; e < E; ++e) s[e] = Sigmoid(z[e]);
        if (HasZLoss(config)) lse = LogSumExp(z, E);
      } else {
        lse = Softmax(z, E, s);
      }
      if (HasZLoss(config)) lse_squared[t] = lse * lse;

      const float* base = IsSoftmaxAfterTopK(config) ? z : s;
      for (int64_t e = 0; e < E; ++e) {
        scratch.selection[e] = bias != nullptr ? base[e] + bias[e * bias_stride] : base[e];
      }
      SelectTopK(config, &scratch, topk_experts + t * k);
      CombineWeights(config, z, s, topk_experts + t * k, topk_weights + t * k);
    }
  });
  if (const int64_t t = first_bad_token.load(); t < T) {
    for (int64_t e = 0; e < E; ++e) {
      const float z = At<float>(args.logits, t, e);
      if (!std::isfinite(z)) {
        return NonFiniteError(absl::StrCat("logits[", t, ", ", e, "] = ", z, " is not finite"));
      }
    }
  }

  const std::vector<int64_t> counts = CountPerSequence(x, topk_experts);
  out->tokens_per_expert.assign(E, 0);
  for (size_t i = 0; i < counts.size(); ++i) out->tokens_per_expert[i % E] += counts[i];

  out->aux_counts.clear();
  out->aux_tokens = 0;
  const bool group_counts = UsesGroupCounts(config, args);
  if (group_counts) MOETRAIN_RETURN_IF_ERROR(SumCountsOverGroup(args, T, out));

  out->aux_loss = 0.0f;
  if (HasAuxLoss(config) && T > 0) {
    // aux = aux_coeff · Σ_t Σ_e n_{q(t),e}·p_{t,e}; p = s, or s / Σ_e s for sigmoid.
    std::vector<double> token_terms(T);
    DefaultThreadPool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* s = scores + t * E;
        const int64_t* n =
            group_counts ? out->aux_counts.data() : counts.data() + (t / x.seq_len) * E;
        double dot = 0.0, sum = 0.0;
        for (int64_t e = 0; e < E; ++e) {
          dot += static_cast<double>(n[e]) * s[e];
          sum += s[e];
        }
        token_terms[t] = sigmoid ? dot / sum : dot;
      }
    });
    double total = 0.0;
    for (int64_t t = 0; t < T; ++t) total += token_terms[t];
    const int64_t count_tokens = group_counts ? out->aux_tokens : x.seq_len;
    out->aux_loss = static_cast<float>(AuxLossCoeff(config, x, count_tokens) * total);
  }

  out->z_loss = 0.0f;
  if (HasZLoss(config) && T > 0) {
    double total = 0.0;
    for (int64_t t = 0; t < T; ++t) total += lse_squared[t];
    out->z_loss = static_cast<float>(config.z_loss_coeff * total / T);
  }
  return absl::OkStatus();
}

absl::Status RouterBackward(const MoeConfig& config, const RouterArgs& args,
                            const RouterOutput& forward, TensorView d_topk_weights,
                            TensorView d_logits, float loss_weight) {
  MOETRAIN_ASSIGN_OR_RETURN(const Extents x, CheckRouterArgs(config, args));
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(forward.scores, "forward.scores", DType::kF32, {T, E}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(forward.topk_experts, "forward.topk_experts", DType::kI32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(forward.topk_weights, "forward.topk_weights", DType::kF32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_topk_weights, "d_topk_weights", DType::kF32, {T, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_logits, "d_logits", DType::kF32, {T, E}));
  const float* scores = forward.scores.data<float>();
  const int32_t* topk_experts = forward.topk_experts.data<int32_t>();
  const float* topk_weights = forward.topk_weights.data<float>();
  // The chosen experts index rows below: a stale or foreign `forward` must not read out of bounds.
  for (int64_t i = 0; i < T * k; ++i) {
    if (topk_experts[i] < 0 || topk_experts[i] >= E) {
      return absl::InvalidArgumentError(absl::StrCat("forward.topk_experts[", i / k, ", ", i % k,
                                                     "] = ", topk_experts[i],
                                                     " is not an expert in [0, ", E, ")"));
    }
  }

  const bool sigmoid = config.score_function == ScoreFunction::kSigmoid;
  const bool softmax_after = IsSoftmaxAfterTopK(config);
  const double rho = config.routed_scaling_factor;
  // f_e's counts: those RouterForward summed over its count group, else this call's own.
  const bool group_counts = !forward.aux_counts.empty();
  if (group_counts && (static_cast<int64_t>(forward.aux_counts.size()) != E ||
                       forward.aux_tokens < T || config.aux_loss != AuxLossType::kSwitch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward.aux_counts has ", forward.aux_counts.size(),
                     " counts over aux_tokens = ", forward.aux_tokens, " tokens; expected E = ", E,
                     " over at least T = ", T, " tokens, and a switch aux loss"));
  }
  const std::vector<int64_t> counts = !HasAuxLoss(config) ? std::vector<int64_t>()
                                      : group_counts      ? forward.aux_counts
                                                          : CountPerSequence(x, topk_experts);
  if (!(loss_weight > 0.0f) || !std::isfinite(loss_weight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_weight = ", loss_weight, " must be positive and finite"));
  }
  const int64_t count_tokens = group_counts ? forward.aux_tokens : x.seq_len;
  const double aux_coeff =
      HasAuxLoss(config) ? loss_weight * AuxLossCoeff(config, x, count_tokens) : 0.0;
  const double z_coeff = T > 0 ? 2.0 * loss_weight * config.z_loss_coeff / T : 0.0;

  DefaultThreadPool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
    std::vector<double> d_scores(E);  // ∂L/∂s_{t,·}
    std::vector<double> dz(E);        // ∂L/∂z_{t,·}
    std::vector<float> z(E), softmax_z(sigmoid ? E : 0);
    for (int64_t t = begin; t < end; ++t) {
      const float* s = scores + t * E;
      const int32_t* chosen = topk_experts + t * k;
      const float* g = topk_weights + t * k;
      for (int64_t e = 0; e < E; ++e) z[e] = At<float>(args.logits, t, e);
      std::fill(d_scores.begin(), d_scores.end(), 0.0);
      std::fill(dz.begin(), dz.end(), 0.0);
      double grad_dot_g = 0.0;  // Σ_j G_j·g_j
      for (int64_t j = 0; j < k; ++j)
        grad_dot_g += static_cast<double>(At<float>(d_topk_weights, t, j)) * g[j];

      // Combine weights. G = ∂L/∂g.
      if (softmax_after) {
        // g = ρ·q, q = softmax_j(z_{e_j}): ∂z_{e_i} = ρ·q_i·(G_i − Σ_j q_j·G_j) = g_i·(G_i − Σ_j
        // G_j·g_j/ρ).
        for (int64_t j = 0; j < k; ++j) {
          dz[chosen[j]] += g[j] * (At<float>(d_topk_weights, t, j) - grad_dot_g / rho);
        }
      } else if (config.normalize_topk_weights) {
        // g = ρ·s_i / S, S = Σ_j s_{e_j}: ∂s_{e_i} = (ρ·G_i − Σ_j G_j·g_j) / S.
        double chosen_sum = 0.0;
        for (int64_t j = 0; j < k; ++j) chosen_sum += s[chosen[j]];
        for (int64_t j = 0; j < k; ++j) {
          d_scores[chosen[j]] += (rho * At<float>(d_topk_weights, t, j) - grad_dot_g) / chosen_sum;
        }
      } else {
        for (int64_t j = 0; j < k; ++j)
          d_scores[chosen[j]] += rho * At<float>(d_topk_weights, t, j);
      }

      // Aux loss through p with f constant: ∂p_{t,e} = c_e = aux_coeff·n_{q(t),e}.
      if (HasAuxLoss(config)) {
        const int64_t* n = counts.data() + (t / x.seq_len) * E;
        if (sigmoid) {
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
      if (sigmoid) {
        for (int64_t e = 0; e < E; ++e) {
          if (d_scores[e] != 0.0) dz[e] += d_scores[e] * SigmoidGrad(z[e]);
        }
      } else if (!softmax_after || HasAuxLoss(config)) {
        // s = softmax(z): ∂z_e = s_e·(∂s_e − Σ_e' s_e'·∂s_e').
        double dot = 0.0;
        for (int64_t e = 0; e < E; ++e) dot += s[e] * d_scores[e];
        for (int64_t e = 0; e < E; ++e) dz[e] += s[e] * (d_scores[e] - dot);
      }

      // z-loss β·mean_t lse_t²: ∂z_{t,e} = (2β/T)·lse_t·softmax(z_t)_e.
      if (HasZLoss(config)) {
        double lse;
        const float* p = s;  // softmax(z): the scores already, unless they are sigmoids
        if (sigmoid) {
          lse = Softmax(z.data(), E, softmax_z.data());
          p = softmax_z.data();
        } else {
          lse = LogSumExp(z.data(), E);
        }
        for (int64_t e = 0; e < E; ++e) dz[e] += z_coeff * lse * p[e];
      }
      for (int64_t e = 0; e < E; ++e) At<float>(d_logits, t, e) = static_cast<float>(dz[e]);
    }
  });
  return absl::OkStatus();
}

absl::Status UpdateExpertBias(const std::vector<int64_t>& tokens_per_expert, float rate,
                              TensorView bias) {
  const int64_t num_experts = static_cast<int64_t>(tokens_per_expert.size());
  if (num_experts == 0) return absl::InvalidArgumentError("tokens_per_expert is empty");
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(bias, "bias", DType::kF32, {num_experts}));
  if (!(rate >= 0.0f) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rate = ", rate, " must be non-negative and finite"));
  }
  double total = 0.0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (tokens_per_expert[e] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens_per_expert[", e, "] = ", tokens_per_expert[e], " is negative"));
    }
    total += static_cast<double>(tokens_per_expert[e]);
  }
  const double mean = total / num_experts;
  for (int64_t e = 0; e < num_experts; ++e) {
    const double gap = mean - static_cast<double>(tokens_per_expert[e]);
    const float step = gap > 0.0 ? rate : (gap < 0.0 ? -rate : 0.0f);
    bias.data<float>()[e * bias.stride(0)] += step;
  }
  return absl::OkStatus();
}

}  // namespace moetrain
