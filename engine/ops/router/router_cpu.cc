#include "engine/ops/router/router_cpu.h"

#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/router/router_math.h"

namespace moetrain::cpu {
namespace {

// A token costs O(E) work: fewer than this many per chunk would not pay for the hand-off.
constexpr int64_t kGrainTokens = 64;

// Element (row, col) of a rank-2 view with any strides.
template <typename T>
T& At(const TensorView& v, int64_t row, int64_t col) {
  return v.data<T>()[row * v.stride(0) + col * v.stride(1)];
}

bool HasAuxLoss(const MoeConfig& config) {
  return config.aux_loss != AuxLossType::kNone && config.aux_loss_coeff > 0.0f;
}
bool HasZLoss(const MoeConfig& config) { return config.z_loss_coeff > 0.0f; }

// One chunk's scratch, so that tokens allocate nothing.
struct SelectScratch {
  explicit SelectScratch(const MoeConfig& config)
      : logits(config.num_experts),
        selection(config.num_experts),
        best_values(config.num_experts),
        best_indices(config.num_experts),
        group_score(config.num_groups),
        group_allowed(config.num_groups) {}
  TopKScratch topk() {
    return {best_values.data(), best_indices.data(), group_score.data(), group_allowed.data()};
  }
  std::vector<float> logits;       // (E) z of the token, made contiguous
  std::vector<float> selection;    // (E) s + b, or z + b for softmax after top-k
  std::vector<float> best_values;  // (≤ E) BestK storage
  std::vector<int32_t> best_indices;
  std::vector<float> group_score;      // (G)
  std::vector<uint8_t> group_allowed;  // (G)
};

// n_{q,e}: pairs chosen for expert e within aux-loss sequence q, (num_sequences, E). The chosen
// experts index the counts: a stale or foreign `forward` must not write out of bounds.
absl::StatusOr<std::vector<int64_t>> CountPerSequence(const RouterExtents& x,
                                                      const int32_t* topk_experts) {
  std::vector<int64_t> counts(std::max<int64_t>(x.num_sequences(), 1) * x.experts, 0);
  for (int64_t t = 0; t < x.tokens; ++t) {
    int64_t* row = counts.data() + (t / x.seq_len) * x.experts;
    for (int64_t j = 0; j < x.top_k; ++j) {
      const int32_t e = topk_experts[t * x.top_k + j];
      if (e < 0 || e >= x.experts) {
        return absl::InvalidArgumentError(absl::StrCat("forward.topk_experts[", t, ", ", j,
                                                       "] = ", e, " is not an expert in [0, ",
                                                       x.experts, ")"));
      }
      ++row[e];
    }
  }
  return counts;
}

// router_math.h's AuxLossCoeff of this call.
double AuxLossCoeffOf(const MoeConfig& config, const RouterExtents& x, int64_t count_tokens) {
  return AuxLossCoeff(config.aux_loss_coeff, x.experts, x.tokens, count_tokens, x.top_k);
}

// The counts f_e uses, (num_sequences, E) for the sequence loss or (E) for the switch loss (then
// aux_counts, possibly summed over a group), and the T they count.
struct AuxCounts {
  std::vector<int64_t> counts;
  int64_t count_tokens;
};

absl::StatusOr<AuxCounts> CountsOfAuxLoss(const MoeConfig& config, const RouterExtents& x,
                                          const ops::RouterOutput& forward) {
  if (config.aux_loss == AuxLossType::kSequence) {
    MOETRAIN_ASSIGN_OR_RETURN(std::vector<int64_t> counts,
                              CountPerSequence(x, forward.topk_experts.data<int32_t>()));
    return AuxCounts{std::move(counts), x.seq_len};
  }
  const int64_t* aux = forward.aux_counts.data<int64_t>();
  const int64_t count_tokens = aux[x.experts];
  if (count_tokens < x.tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aux_counts: ", count_tokens, " tokens, fewer than this call's T = ", x.tokens));
  }
  return AuxCounts{std::vector<int64_t>(aux, aux + x.experts), count_tokens};
}

}  // namespace

absl::Status RouterForward(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                           const ops::RouterArgs& args, ops::RouterOutput* out) {
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
  const RoutingParams params = RoutingParams::Of(config);
  const float* bias = config.expert_bias ? args.expert_bias.data<float>() : nullptr;
  const int64_t bias_stride = config.expert_bias ? args.expert_bias.stride(0) : 0;
  for (int64_t e = 0; bias != nullptr && e < E; ++e) {
    if (!std::isfinite(bias[e * bias_stride])) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert_bias[", e, "] = ", bias[e * bias_stride], " is not finite"));
    }
  }
  float* scores = out->scores.data<float>();
  int32_t* topk_experts = out->topk_experts.data<int32_t>();
  float* topk_weights = out->topk_weights.data<float>();

  // Cross-token sums are taken serially over these per-token terms, so that they do not depend
  // on how the tokens were split among threads.
  std::vector<double> lse_squared(HasZLoss(config) ? T : 0);  // (T) (logsumexp z_t)²
  std::atomic<int64_t> first_bad_token{T};

  ctx.thread_pool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
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
      const double lse =
          RouteToken(params, z, bias, bias_stride, HasZLoss(config), scratch.selection.data(),
                     scratch.topk(), scores + t * E, topk_experts + t * k, topk_weights + t * k);
      if (HasZLoss(config)) lse_squared[t] = lse * lse;
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

  int64_t* tokens_per_expert = out->tokens_per_expert.data<int64_t>();
  int64_t* aux_counts = out->aux_counts.data<int64_t>();
  std::fill(tokens_per_expert, tokens_per_expert + E, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) ++tokens_per_expert[topk_experts[t * k + j]];
  }
  std::copy(tokens_per_expert, tokens_per_expert + E, aux_counts);
  aux_counts[E] = T;

  float* losses = out->losses.data<float>();
  losses[0] = 0.0f;
  losses[1] = 0.0f;
  if (HasZLoss(config) && T > 0) {
    double total = 0.0;
    for (int64_t t = 0; t < T; ++t) total += lse_squared[t];
    losses[1] = ZLossValue(config.z_loss_coeff, total, T);
  }
  return absl::OkStatus();
}

absl::Status RouterAuxLoss(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                           ops::RouterOutput* out) {
  const int64_t T = x.tokens, E = x.experts;
  float* losses = out->losses.data<float>();
  losses[0] = 0.0f;
  if (!HasAuxLoss(config) || T == 0) return absl::OkStatus();
  MOETRAIN_ASSIGN_OR_RETURN(const AuxCounts aux, CountsOfAuxLoss(config, x, *out));
  const bool per_sequence = config.aux_loss == AuxLossType::kSequence;
  const bool sigmoid = config.score_function == ScoreFunction::kSigmoid;
  const float* scores = out->scores.data<float>();
  // aux = aux_coeff · Σ_t Σ_e n_{q(t),e}·p_{t,e}; p = s, or s / Σ_e s for sigmoid. Summed
  // serially over the per-token terms.
  std::vector<double> token_terms(T);
  ctx.thread_pool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t* n = aux.counts.data() + (per_sequence ? (t / x.seq_len) * E : 0);
      token_terms[t] = AuxLossTokenTerm(scores + t * E, n, E, sigmoid);
    }
  });
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) total += token_terms[t];
  losses[0] = static_cast<float>(AuxLossCoeffOf(config, x, aux.count_tokens) * total);
  return absl::OkStatus();
}

absl::Status RouterBackward(const ExecContext& ctx, const MoeConfig& config, const RouterExtents& x,
                            const ops::RouterArgs& args, const ops::RouterOutput& forward,
                            TensorView d_topk_weights, TensorView d_logits, float loss_weight) {
  const int64_t T = x.tokens, E = x.experts, k = x.top_k;
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

  const RoutingParams params = RoutingParams::Of(config);
  AuxCounts aux = {{}, 0};
  if (HasAuxLoss(config)) {
    MOETRAIN_ASSIGN_OR_RETURN(aux, CountsOfAuxLoss(config, x, forward));
  }
  const bool per_sequence = config.aux_loss == AuxLossType::kSequence;
  const RouterLossGrad loss = {
      HasAuxLoss(config),
      HasAuxLoss(config) ? loss_weight * AuxLossCoeffOf(config, x, aux.count_tokens) : 0.0,
      HasZLoss(config), T > 0 ? 2.0 * loss_weight * config.z_loss_coeff / T : 0.0};

  ctx.thread_pool().ParallelFor(T, kGrainTokens, [&](int64_t begin, int64_t end) {
    std::vector<double> d_scores(E), dz(E);
    std::vector<float> z(E), softmax_z(params.sigmoid ? E : 0);
    const RouterGradScratch scratch = {d_scores.data(), dz.data(), softmax_z.data()};
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t e = 0; e < E; ++e) z[e] = At<float>(args.logits, t, e);
      const int64_t* n =
          loss.aux ? aux.counts.data() + (per_sequence ? (t / x.seq_len) * E : 0) : nullptr;
      RouterTokenBackward(params, loss, z.data(), scores + t * E, topk_experts + t * k,
                          topk_weights + t * k, &At<float>(d_topk_weights, t, 0),
                          d_topk_weights.stride(1), n, scratch, &At<float>(d_logits, t, 0),
                          d_logits.stride(1));
    }
  });
  return absl::OkStatus();
}

absl::Status UpdateExpertBias(TensorView tokens_per_expert, float rate, TensorView bias) {
  const int64_t num_experts = tokens_per_expert.dim(0);
  const int64_t* counts = tokens_per_expert.data<int64_t>();
  double total = 0.0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (counts[e] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens_per_expert[", e, "] = ", counts[e], " is negative"));
    }
    total += static_cast<double>(counts[e]);
  }
  const double mean = total / num_experts;
  for (int64_t e = 0; e < num_experts; ++e) {
    bias.data<float>()[e * bias.stride(0)] += ExpertBiasStep(mean, counts[e], rate);
  }
  return absl::OkStatus();
}

}  // namespace moetrain::cpu
