#include "engine/moe/router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

// ---------------------------------------------------------------------------------------------
// A float64 reference, written from the definitions in router.h: naive loops, full sorts and
// explicit Jacobians. It shares no code with router.cc.
// ---------------------------------------------------------------------------------------------

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

bool IsSigmoid(const MoeConfig& c) { return c.score_function == ScoreFunction::kSigmoid; }
bool IsPostSoftmax(const MoeConfig& c) { return !IsSigmoid(c) && !c.softmax_before_topk; }

int64_t AuxSequenceLength(const Problem& p) {
  if (p.config.aux_loss != AuxLossType::kSequence || p.tokens_per_sequence == 0) return p.tokens;
  return p.tokens_per_sequence;
}

std::vector<double> RefSoftmax(const std::vector<double>& z) {
  double max = z[0];
  for (double v : z) max = std::max(max, v);
  std::vector<double> s(z.size());
  double sum = 0.0;
  for (size_t i = 0; i < z.size(); ++i) sum += std::exp(z[i] - max);
  for (size_t i = 0; i < z.size(); ++i) s[i] = std::exp(z[i] - max) / sum;
  return s;
}

double RefLogSumExp(const std::vector<double>& z) {
  double max = z[0];
  for (double v : z) max = std::max(max, v);
  double sum = 0.0;
  for (double v : z) sum += std::exp(v - max);
  return max + std::log(sum);
}

std::vector<double> Row(const std::vector<double>& m, int64_t row, int64_t width) {
  return std::vector<double>(m.begin() + row * width, m.begin() + (row + 1) * width);
}

// Forward of the reference on logits `z` (T, E) in double.
Reference RefForward(const Problem& p, const std::vector<double>& z) {
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

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Σ g·d_weights + aux + z at logits z (the selection of these logits).
double RefLoss(const Problem& p, const std::vector<double>& z) {
  const Reference r = RefForward(p, z);
  double loss = r.aux_loss + r.z_loss;
  for (size_t i = 0; i < r.weights.size(); ++i) loss += r.weights[i] * p.d_weights[i];
  return loss;
}

// ∂RefLoss/∂z with the selection and f held constant, through explicit Jacobians.
std::vector<double> RefGradient(const Problem& p) {
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

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

template <typename A, typename B>
double RelErr(const A& a, const B& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return ref > 0.0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

double ScalarRelErr(double a, double b) { return b != 0.0 ? std::fabs(a - b) / std::fabs(b) : a; }

double Norm(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

void ExpectError(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

void Fill(std::mt19937& rng, std::vector<float>* v, size_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  v->resize(n);
  for (float& x : *v) x = normal(rng);
}

Problem MakeProblem(const MoeConfig& config, int64_t tokens, int64_t tokens_per_sequence,
                    uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.config = config;
  p.tokens = tokens;
  p.tokens_per_sequence = tokens_per_sequence;
  Fill(rng, &p.logits, tokens * config.num_experts, 1.0f);
  // Selection scores s are in (0, 1): a bias of that order reorders experts without swamping s.
  Fill(rng, &p.bias, config.num_experts, IsPostSoftmax(config) ? 0.5f : 0.05f);
  Fill(rng, &p.d_weights, tokens * config.top_k, 1.0f);
  return p;
}

RouterArgs ArgsOf(Problem& p) {
  return RouterArgs{TensorView(p.logits.data(), DType::kF32, {p.tokens, p.config.num_experts}),
                    TensorView(p.bias.data(), DType::kF32, {p.config.num_experts}),
                    p.tokens_per_sequence};
}

struct EngineResult {
  RouterOutput out;
  std::vector<float> d_logits;  // (T, E)
};

absl::Status RunEngine(Problem& p, EngineResult* result) {
  const RouterArgs args = ArgsOf(p);
  absl::Status status = RouterForward(p.config, args, &result->out);
  if (!status.ok()) return status;
  result->d_logits.assign(p.tokens * p.config.num_experts, -1.0f);
  return RouterBackward(
      p.config, args, result->out,
      TensorView(p.d_weights.data(), DType::kF32, {p.tokens, p.config.top_k}),
      TensorView(result->d_logits.data(), DType::kF32, {p.tokens, p.config.num_experts}));
}

template <typename T>
std::vector<T> Contents(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// ---------------------------------------------------------------------------------------------
// Every router variant against the reference.
// ---------------------------------------------------------------------------------------------

struct Case {
  std::string name;
  MoeConfig config;
  int64_t tokens;
  int64_t tokens_per_sequence = 0;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

MoeConfig Softmax(int64_t experts, int64_t k) {
  MoeConfig c;
  c.num_experts = experts;
  c.top_k = k;
  return c;
}

MoeConfig Sigmoid(int64_t experts, int64_t k) {
  MoeConfig c = Softmax(experts, k);
  c.score_function = ScoreFunction::kSigmoid;
  c.expert_bias = true;
  return c;
}

MoeConfig With(MoeConfig c, auto edit) {
  edit(c);
  return c;
}

MoeConfig DeepSeekV3() {
  MoeConfig c = Sigmoid(256, 8);
  c.num_groups = 8;
  c.group_top_k = 4;
  c.routed_scaling_factor = 2.5f;
  return c;
}

std::vector<Case> ReferenceCases() {
  auto no_norm = [](MoeConfig& c) { c.normalize_topk_weights = false; };
  auto post = [](MoeConfig& c) { c.softmax_before_topk = false; };
  auto bias = [](MoeConfig& c) { c.expert_bias = true; };
  auto switch_aux = [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.01f;
  };
  auto seq_aux = [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.02f;
  };
  auto z_loss = [](MoeConfig& c) { c.z_loss_coeff = 1e-3f; };
  auto groups = [](int64_t g, int64_t gk) {
    return [g, gk](MoeConfig& c) {
      c.num_groups = g;
      c.group_top_k = gk;
    };
  };
  auto rho = [](float r) { return [r](MoeConfig& c) { c.routed_scaling_factor = r; }; };
  return {
      {"SoftmaxPreNorm", Softmax(8, 2), 300},
      {"SoftmaxPreNoNorm", With(Softmax(16, 4), no_norm), 257},
      {"SoftmaxPreNormRho", With(Softmax(8, 3), rho(1.7f)), 130},
      {"SoftmaxPreNoNormRho", With(With(Softmax(8, 3), no_norm), rho(2.5f)), 129},
      {"SoftmaxPreBias", With(Softmax(12, 3), bias), 200},
      {"SoftmaxPost", With(Softmax(16, 4), post), 200},
      {"SoftmaxPostBiasRho", With(With(With(Softmax(16, 2), post), bias), rho(2.0f)), 150},
      {"SigmoidBiasNorm", With(Sigmoid(64, 6), rho(2.5f)), 150},
      {"SigmoidBiasNoNorm", With(With(Sigmoid(32, 4), no_norm), rho(0.5f)), 140},
      {"SigmoidNoBias", With(Sigmoid(16, 3), [](MoeConfig& c) { c.expert_bias = false; }), 100},
      {"GroupSoftmax", With(Softmax(16, 4), groups(4, 2)), 130},
      {"GroupSoftmaxPost", With(With(Softmax(16, 4), post), groups(8, 3)), 100},
      {"GroupSigmoidOneMember", With(Sigmoid(24, 5), groups(6, 3)), 120},
      {"DeepSeekV3", DeepSeekV3(), 96},
      {"DeepSeekV3SeqAux", With(DeepSeekV3(), seq_aux), 96, 32},
      {"SwitchSoftmax", With(Softmax(8, 2), switch_aux), 256},
      {"SwitchSoftmaxPost", With(With(Softmax(8, 2), post), switch_aux), 100},
      {"SwitchSigmoid", With(Sigmoid(16, 4), switch_aux), 200},
      {"SequenceSoftmax", With(Softmax(8, 2), seq_aux), 96, 24},
      {"SequenceSoftmaxPost", With(With(Softmax(8, 3), post), seq_aux), 60, 5},
      {"SequenceSigmoid", With(Sigmoid(16, 4), seq_aux), 120, 8},
      {"SequenceOneTokenEach", With(Softmax(8, 2), seq_aux), 20, 1},
      {"SequenceZeroMeansAll", With(Softmax(8, 2), seq_aux), 50, 0},
      {"ZLossSoftmax", With(Softmax(8, 2), z_loss), 100},
      {"ZLossSoftmaxPost", With(With(Softmax(8, 2), post), z_loss), 100},
      {"ZLossSigmoid", With(Sigmoid(16, 2), z_loss), 100},
      {"AllLosses", With(With(With(DeepSeekV3(), switch_aux), z_loss), rho(1.0f)), 70},
      {"OneToken", With(Sigmoid(64, 6), z_loss), 1},
      {"OneTokenSoftmax", With(Softmax(8, 2), switch_aux), 1},
      // k = E: every n_e = T, so the switch loss is the constant α (its gradient is 0).
      {"KEqualsE", With(With(Softmax(6, 6), switch_aux), z_loss), 50},
      {"KEqualsENoNorm", With(Softmax(6, 6), no_norm), 50},
      {"KEqualsESigmoid", Sigmoid(5, 5), 40},
      {"KEqualsEPost", With(Softmax(4, 4), post), 40},
      {"OneExpert", With(With(Softmax(1, 1), switch_aux), z_loss), 20},
      {"OneExpertSigmoid", With(Sigmoid(1, 1), no_norm), 20},
      {"RaggedSixtyFive", With(Sigmoid(16, 2), switch_aux), 65},
  };
}

class RouterReferenceTest : public testing::TestWithParam<Case> {};

// Forward outputs against the reference; returns the reference.
Reference CheckForward(const Problem& p, const RouterOutput& out) {
  const int64_t T = p.tokens, E = p.config.num_experts, k = p.config.top_k;
  const Reference ref = RefForward(p, ToDouble(p.logits));
  EXPECT_EQ(out.scores.dim(0), T);
  EXPECT_EQ(out.scores.dim(1), E);
  EXPECT_EQ(out.topk_experts.dim(1), k);
  EXPECT_LT(RelErr(Contents<float>(out.scores), ref.scores), 1e-6);
  const std::vector<int32_t> experts = Contents<int32_t>(out.topk_experts);
  int mismatches = 0;
  for (int64_t i = 0; i < T * k; ++i) {
    if (experts[i] != ref.experts[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "token " << i / k << " slot " << i % k << ": engine chose " << experts[i]
                    << ", reference " << ref.experts[i];
    }
  }
  if (mismatches == 0) {
    EXPECT_LT(RelErr(Contents<float>(out.topk_weights), ref.weights), 1e-6);
    EXPECT_EQ(out.tokens_per_expert, ref.counts);
    EXPECT_LT(ScalarRelErr(out.aux_loss, ref.aux_loss), 1e-5)
        << out.aux_loss << " vs " << ref.aux_loss;
    EXPECT_LT(ScalarRelErr(out.z_loss, ref.z_loss), 1e-5) << out.z_loss << " vs " << ref.z_loss;
  }
  EXPECT_EQ(std::accumulate(out.tokens_per_expert.begin(), out.tokens_per_expert.end(), int64_t{0}),
            T * k);
  if (p.config.aux_loss == AuxLossType::kNone) {
    EXPECT_EQ(out.aux_loss, 0.0f);
  }
  if (p.config.z_loss_coeff == 0.0f) {
    EXPECT_EQ(out.z_loss, 0.0f);
  }
  return ref;
}

TEST_P(RouterReferenceTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  Problem p = MakeProblem(c.config, c.tokens, c.tokens_per_sequence, 1234);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok()) << RunEngine(p, &engine);
  const Reference ref = CheckForward(p, engine.out);
  if (HasFailure()) return;

  // Best-first order, distinct experts, and (group-limited) at most group_top_k groups.
  const int64_t k = p.config.top_k;
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::set<int> distinct, groups;
    for (int64_t j = 0; j < k; ++j) {
      const int e = engine.out.topk_experts.data<int32_t>()[t * k + j];
      distinct.insert(e);
      groups.insert(e / p.config.experts_per_group());
    }
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), k);
    EXPECT_LE(static_cast<int64_t>(groups.size()), p.config.group_top_k);
  }

  EXPECT_LT(RelErr(engine.d_logits, RefGradient(p)), 1e-5);

  // The losses alone: with d_weights = 0 only aux and z-loss reach the logits.
  if (p.config.aux_loss != AuxLossType::kNone || p.config.z_loss_coeff != 0.0f) {
    std::fill(p.d_weights.begin(), p.d_weights.end(), 0.0f);
    ASSERT_TRUE(RunEngine(p, &engine).ok());
    const std::vector<double> ref_grad = RefGradient(p);
    EXPECT_LT(RelErr(engine.d_logits, ref_grad), 1e-5);
    if (p.config.num_experts > 1) {
      EXPECT_GT(Norm(ref_grad), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RouterReferenceTest, testing::ValuesIn(ReferenceCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Finite differences of the reference loss, at tiny sizes, for every variant.
// ---------------------------------------------------------------------------------------------

std::vector<Case> FiniteDifferenceCases() {
  auto losses = [](AuxLossType aux) {
    return [aux](MoeConfig& c) {
      c.aux_loss = aux;
      c.aux_loss_coeff = 0.5f;
      c.z_loss_coeff = 0.1f;
    };
  };
  auto no_norm = [](MoeConfig& c) { c.normalize_topk_weights = false; };
  auto post = [](MoeConfig& c) { c.softmax_before_topk = false; };
  auto rho = [](MoeConfig& c) { c.routed_scaling_factor = 2.5f; };
  auto groups = [](MoeConfig& c) {
    c.num_groups = 4;
    c.group_top_k = 2;
  };
  return {
      {"SoftmaxPreNorm", Softmax(6, 2), 4},
      {"SoftmaxPreNoNormRho", With(With(Softmax(6, 2), no_norm), rho), 4},
      {"SoftmaxPost", With(With(Softmax(5, 3), post), rho), 3},
      {"SigmoidNorm", With(Sigmoid(8, 3), rho), 4},
      {"SigmoidNoNorm", With(Sigmoid(6, 2), no_norm), 5},
      {"GroupSigmoid", With(Sigmoid(8, 4), groups), 4},
      {"GroupSoftmax", With(Softmax(8, 2), groups), 4},
      {"SwitchZSoftmax", With(Softmax(6, 2), losses(AuxLossType::kSwitch)), 4},
      {"SwitchZSoftmaxPost", With(With(Softmax(6, 2), post), losses(AuxLossType::kSwitch)), 4},
      {"SwitchZSigmoid", With(Sigmoid(6, 2), losses(AuxLossType::kSwitch)), 5},
      {"SequenceZSoftmax", With(Softmax(4, 2), losses(AuxLossType::kSequence)), 4, 2},
      {"SequenceZSigmoidNoNorm", With(With(Sigmoid(6, 3), no_norm), losses(AuxLossType::kSequence)),
       6, 3},
      {"AllGroupSigmoid",
       With(With(With(Sigmoid(8, 4), groups), rho), losses(AuxLossType::kSequence)), 4, 2},
      {"KEqualsE", With(Softmax(4, 4), losses(AuxLossType::kSwitch)), 3},
  };
}

class RouterFiniteDifferenceTest : public testing::TestWithParam<Case> {};

// Central differences of RefLoss at p.logits; false if some perturbation changes the top-k.
bool FiniteDifferenceGradient(const Problem& p, std::vector<double>* fd) {
  constexpr double kStep = 1e-6;
  const std::vector<double> z = ToDouble(p.logits);
  const std::vector<int> selection = RefForward(p, z).experts;
  fd->resize(z.size());
  for (size_t i = 0; i < z.size(); ++i) {
    std::vector<double> plus = z, minus = z;
    plus[i] += kStep;
    minus[i] -= kStep;
    if (RefForward(p, plus).experts != selection || RefForward(p, minus).experts != selection) {
      return false;
    }
    (*fd)[i] = (RefLoss(p, plus) - RefLoss(p, minus)) / (2 * kStep);
  }
  return true;
}

// The reference's analytic gradient within 1e-6 of the central differences (both in double),
// the engine's f32 gradient within 1e-5 (it is near 1e-7 in practice; 1e-3 would be enough).
void CheckAgainstFiniteDifferences(Problem& p, const std::vector<double>& fd) {
  EXPECT_LT(RelErr(RefGradient(p), fd), 1e-6);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_LT(RelErr(engine.d_logits, fd), 1e-5);
}

TEST_P(RouterFiniteDifferenceTest, GradientsMatchCentralDifferences) {
  const Case& c = GetParam();
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    Problem p = MakeProblem(c.config, c.tokens, c.tokens_per_sequence, seed);
    std::vector<double> fd;
    if (!FiniteDifferenceGradient(p, &fd)) continue;  // near a top-k boundary: another draw
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    CheckAgainstFiniteDifferences(p, fd);
    // The losses alone (d_weights do not move the selection, so it stays stable).
    if (c.config.aux_loss != AuxLossType::kNone || c.config.z_loss_coeff != 0.0f) {
      std::fill(p.d_weights.begin(), p.d_weights.end(), 0.0f);
      ASSERT_TRUE(FiniteDifferenceGradient(p, &fd));
      CheckAgainstFiniteDifferences(p, fd);
    }
    return;
  }
  FAIL() << "no draw had a selection stable under perturbation";
}

INSTANTIATE_TEST_SUITE_P(Variants, RouterFiniteDifferenceTest,
                         testing::ValuesIn(FiniteDifferenceCases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Edges.
// ---------------------------------------------------------------------------------------------

TEST(RouterTest, ExpertThatNoTokenChooses) {
  MoeConfig config = With(Softmax(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.1f;
  });
  Problem p = MakeProblem(config, 100, 0, 7);
  for (int64_t t = 0; t < p.tokens; ++t) p.logits[t * 8 + 5] = -8.0f;
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_EQ(engine.out.tokens_per_expert[5], 0);
  CheckForward(p, engine.out);
  EXPECT_LT(RelErr(engine.d_logits, RefGradient(p)), 1e-5);
}

TEST(RouterTest, ZeroTokens) {
  MoeConfig config = With(Sigmoid(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.1f;
    c.z_loss_coeff = 0.1f;
  });
  // Non-null pointers: views of zero rows, not absent ones.
  std::vector<float> logits(1), bias(8), d_weights(1), d_logits(1);
  const RouterArgs args{TensorView(logits.data(), DType::kF32, {0, 8}),
                        TensorView(bias.data(), DType::kF32, {8}), 0};
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, args, &out).ok()) << RouterForward(config, args, &out);
  EXPECT_EQ(out.scores.dim(0), 0);
  EXPECT_EQ(out.topk_experts.dim(0), 0);
  EXPECT_EQ(out.tokens_per_expert, std::vector<int64_t>(8, 0));
  EXPECT_EQ(out.aux_loss, 0.0f);
  EXPECT_EQ(out.z_loss, 0.0f);
  EXPECT_TRUE(RouterBackward(config, args, out, TensorView(d_weights.data(), DType::kF32, {0, 2}),
                             TensorView(d_logits.data(), DType::kF32, {0, 8}))
                  .ok());
}

TEST(RouterTest, OneExpertTakesEverything) {
  Problem p = MakeProblem(Softmax(1, 1), 10, 0, 3);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  for (int64_t t = 0; t < p.tokens; ++t) {
    EXPECT_EQ(engine.out.topk_experts.data<int32_t>()[t], 0);
    EXPECT_EQ(engine.out.topk_weights.data<float>()[t], 1.0f);
    EXPECT_EQ(engine.d_logits[t], 0.0f);  // softmax over one logit is constant
  }
}

TEST(RouterTest, BiasSelectsButDoesNotWeigh) {
  MoeConfig config = Sigmoid(8, 2);
  Problem p = MakeProblem(config, 50, 0, 11);
  p.bias.assign(8, 0.0f);
  p.bias[6] = 10.0f;  // expert 6 wins every token on selection, whatever its score
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  for (int64_t t = 0; t < p.tokens; ++t) {
    const int32_t* chosen = engine.out.topk_experts.data<int32_t>() + t * 2;
    const float* s = engine.out.scores.data<float>() + t * 8;
    ASSERT_EQ(chosen[0], 6);
    const float expected = s[6] / (s[6] + s[chosen[1]]);
    EXPECT_NEAR(engine.out.topk_weights.data<float>()[t * 2], expected, 1e-6f);
  }
}

TEST(RouterTest, TiesGoToTheLowerExpertIndex) {
  MoeConfig config = Softmax(6, 3);
  Problem p = MakeProblem(config, 2, 0, 5);
  p.logits = {1, 2, 2, 0, 2, 1,   // experts 1, 2, 4 tie at the top
              0, 0, 0, 0, 0, 0};  // all tie
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{1, 2, 4, 0, 1, 2}));

  // Tied groups too: groups {0,1} {2,3} {4,5} all score 0 → the first two groups.
  config = With(Softmax(6, 2), [](MoeConfig& c) {
    c.num_groups = 3;
    c.group_top_k = 2;
  });
  Problem q = MakeProblem(config, 1, 0, 5);
  q.logits = {0, 0, 0, 0, 0, 0};
  ASSERT_TRUE(RunEngine(q, &engine).ok());
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{0, 1}));
}

TEST(RouterTest, GroupLimitExcludesTheBestExpertOfAWeakGroup) {
  // E = 8 in 4 groups of 2, k = 4 from the best 2 groups; a group scores the sum of its
  // k / group_top_k = 2 members, i.e. both.
  MoeConfig config = With(Softmax(8, 4), [](MoeConfig& c) {
    c.num_groups = 4;
    c.group_top_k = 2;
  });
  Problem p = MakeProblem(config, 1, 0, 5);
  p.logits = {3.0f, -5.0f, 1.0f, 1.0f, 0.9f, 0.9f, -5.0f, -5.0f};
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  // Sums: group 0 = e^3 + e^-5, group 1 = 2e, group 2 = 2e^0.9: groups 0 and 1 win.
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{0, 2, 3, 1}));
  p.logits = {1.2f, -5.0f, 1.0f, 1.0f, 0.9f, 0.9f, -5.0f, -5.0f};
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  // Now group 0 (e^1.2 + e^-5) loses to group 2 (2e^0.9) although expert 0 is the best.
  EXPECT_EQ(Contents<int32_t>(engine.out.topk_experts), (std::vector<int32_t>{2, 3, 4, 5}));
}

TEST(RouterTest, LargeLogitsStayFinite) {
  for (MoeConfig config : {Softmax(8, 2), Sigmoid(8, 2), With(Softmax(8, 2), [](MoeConfig& c) {
                             c.softmax_before_topk = false;
                           })}) {
    config.z_loss_coeff = 1e-4f;
    config.aux_loss = AuxLossType::kSwitch;
    config.aux_loss_coeff = 0.01f;
    Problem p = MakeProblem(config, 4, 0, 9);
    for (float& z : p.logits) z *= 300.0f;
    EngineResult engine;
    ASSERT_TRUE(RunEngine(p, &engine).ok());
    for (float v : Contents<float>(engine.out.scores)) ASSERT_TRUE(std::isfinite(v));
    for (float v : Contents<float>(engine.out.topk_weights)) ASSERT_TRUE(std::isfinite(v));
    for (float v : engine.d_logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_TRUE(std::isfinite(engine.out.z_loss));
    EXPECT_TRUE(std::isfinite(engine.out.aux_loss));
  }
}

TEST(RouterTest, StridedViewsGiveTheSameResults) {
  MoeConfig config = With(DeepSeekV3(), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSwitch;
    c.aux_loss_coeff = 0.01f;
    c.z_loss_coeff = 1e-3f;
  });
  Problem p = MakeProblem(config, 70, 0, 21);
  EngineResult dense;
  ASSERT_TRUE(RunEngine(p, &dense).ok());

  const int64_t T = p.tokens, E = 256, k = 8, pad = 3;
  std::vector<float> logits((E + pad) * T), d_weights(2 * k * T), d_logits((E + pad) * T, 7.0f);
  std::vector<float> bias(2 * E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) logits[t * (E + pad) + e] = p.logits[t * E + e];
    for (int64_t j = 0; j < k; ++j) d_weights[(t * k + j) * 2] = p.d_weights[t * k + j];
  }
  for (int64_t e = 0; e < E; ++e) bias[2 * e] = p.bias[e];
  const RouterArgs args{TensorView(logits.data(), DType::kF32, {T, E}, {E + pad, 1}),
                        TensorView(bias.data(), DType::kF32, {E}, {2}), 0};
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, args, &out).ok());
  ASSERT_TRUE(RouterBackward(config, args, out,
                             TensorView(d_weights.data(), DType::kF32, {T, k}, {2 * k, 2}),
                             TensorView(d_logits.data(), DType::kF32, {T, E}, {E + pad, 1}))
                  .ok());
  EXPECT_EQ(Contents<int32_t>(out.topk_experts), Contents<int32_t>(dense.out.topk_experts));
  EXPECT_EQ(Contents<float>(out.topk_weights), Contents<float>(dense.out.topk_weights));
  EXPECT_EQ(out.aux_loss, dense.out.aux_loss);
  EXPECT_EQ(out.z_loss, dense.out.z_loss);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      ASSERT_EQ(d_logits[t * (E + pad) + e], dense.d_logits[t * E + e]);
    }
    for (int64_t e = E; e < E + pad; ++e) ASSERT_EQ(d_logits[t * (E + pad) + e], 7.0f);
  }
}

TEST(RouterTest, OutputTensorsAreReallocatedWhenShapesChange) {
  MoeConfig config = Softmax(8, 2);
  RouterOutput out;
  for (int64_t tokens : {10, 10, 300, 3}) {
    Problem p = MakeProblem(config, tokens, 0, tokens);
    ASSERT_TRUE(RouterForward(config, ArgsOf(p), &out).ok());
    CheckForward(p, out);
  }
}

// ---------------------------------------------------------------------------------------------
// Determinism.
// ---------------------------------------------------------------------------------------------

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data<char>(), b.data<char>(), a.numel() * DTypeSize(a.dtype())) == 0;
}

TEST(RouterTest, SameInputTwiceIsBitIdentical) {
  MoeConfig config = With(DeepSeekV3(), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 1e-2f;
    c.z_loss_coeff = 1e-3f;
  });
  Problem p = MakeProblem(config, 1000, 250, 99);
  EngineResult first, second;
  ASSERT_TRUE(RunEngine(p, &first).ok());
  ASSERT_TRUE(RunEngine(p, &second).ok());
  EXPECT_TRUE(SameBits(first.out.scores, second.out.scores));
  EXPECT_TRUE(SameBits(first.out.topk_experts, second.out.topk_experts));
  EXPECT_TRUE(SameBits(first.out.topk_weights, second.out.topk_weights));
  EXPECT_EQ(first.out.tokens_per_expert, second.out.tokens_per_expert);
  EXPECT_EQ(std::memcmp(&first.out.aux_loss, &second.out.aux_loss, sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&first.out.z_loss, &second.out.z_loss, sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(first.d_logits.data(), second.d_logits.data(),
                        first.d_logits.size() * sizeof(float)),
            0);
}

// Per-token outputs do not depend on which other tokens share the call (and so on how a call's
// tokens are split among threads): one call of T tokens equals T calls of one token, bit for bit.
TEST(RouterTest, OneCallEqualsOneCallPerToken) {
  for (const MoeConfig& config :
       {DeepSeekV3(), With(Softmax(16, 4), [](MoeConfig& c) { c.softmax_before_topk = false; })}) {
    const int64_t T = 333, E = config.num_experts, k = config.top_k;
    Problem p = MakeProblem(config, T, 0, 42);
    EngineResult batched;
    ASSERT_TRUE(RunEngine(p, &batched).ok());
    for (int64_t t = 0; t < T; ++t) {
      Problem one = p;
      one.tokens = 1;
      one.logits.assign(p.logits.begin() + t * E, p.logits.begin() + (t + 1) * E);
      one.d_weights.assign(p.d_weights.begin() + t * k, p.d_weights.begin() + (t + 1) * k);
      EngineResult single;
      ASSERT_TRUE(RunEngine(one, &single).ok());
      ASSERT_EQ(std::memcmp(single.out.scores.data<float>(),
                            batched.out.scores.data<float>() + t * E, E * sizeof(float)),
                0);
      ASSERT_EQ(std::memcmp(single.out.topk_experts.data<int32_t>(),
                            batched.out.topk_experts.data<int32_t>() + t * k, k * sizeof(int32_t)),
                0);
      ASSERT_EQ(std::memcmp(single.out.topk_weights.data<float>(),
                            batched.out.topk_weights.data<float>() + t * k, k * sizeof(float)),
                0);
      ASSERT_EQ(
          std::memcmp(single.d_logits.data(), batched.d_logits.data() + t * E, E * sizeof(float)),
          0);
    }
  }
}

// Prints a checksum of a large call's outputs, so that runs with different MOETRAIN_NUM_THREADS
// can be compared by hand: `MOETRAIN_NUM_THREADS=1 router_test --gtest_filter=*Checksum*`.
TEST(RouterTest, ChecksumForThreadCountComparison) {
  MoeConfig config = With(DeepSeekV3(), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 1e-2f;
    c.z_loss_coeff = 1e-3f;
  });
  Problem p = MakeProblem(config, 2048, 512, 5);
  EngineResult engine;
  ASSERT_TRUE(RunEngine(p, &engine).ok());
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&hash](const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i)
      hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  };
  mix(engine.out.scores.data<float>(), engine.out.scores.numel() * sizeof(float));
  mix(engine.out.topk_experts.data<int32_t>(), engine.out.topk_experts.numel() * sizeof(int32_t));
  mix(engine.out.topk_weights.data<float>(), engine.out.topk_weights.numel() * sizeof(float));
  mix(&engine.out.aux_loss, sizeof(float));
  mix(&engine.out.z_loss, sizeof(float));
  mix(engine.d_logits.data(), engine.d_logits.size() * sizeof(float));
  std::printf("router checksum %016llx\n", static_cast<unsigned long long>(hash));
}

// ---------------------------------------------------------------------------------------------
// Invalid arguments.
// ---------------------------------------------------------------------------------------------

absl::Status ForwardWith(const MoeConfig& config, int64_t tokens = 4, int64_t tps = 0) {
  Problem p = MakeProblem(Softmax(8, 2), tokens, tps, 1);
  RouterOutput out;
  RouterArgs args = ArgsOf(p);
  return RouterForward(config, args, &out);
}

TEST(RouterTest, InvalidConfigsNameTheFieldAndValue) {
  ExpectError(ForwardWith(Softmax(8, 9)), "model.moe.top_k = 9 exceeds model.moe.num_experts = 8");
  ExpectError(ForwardWith(With(Softmax(8, 2), [](MoeConfig& c) { c.num_groups = 3; })),
              "model.moe.num_groups = 3 does not divide model.moe.num_experts = 8");
  ExpectError(ForwardWith(With(Softmax(8, 2),
                               [](MoeConfig& c) {
                                 c.num_groups = 4;
                                 c.group_top_k = 5;
                               })),
              "model.moe.group_top_k = 5");
  ExpectError(ForwardWith(With(Softmax(8, 2), [](MoeConfig& c) { c.aux_loss_coeff = -0.5f; })),
              "model.moe.aux_loss_coeff = -0.5");
  ExpectError(ForwardWith(With(Softmax(8, 2), [](MoeConfig& c) { c.z_loss_coeff = -1.0f; })),
              "model.moe.z_loss_coeff = -1");
  ExpectError(ForwardWith(With(Softmax(8, 2), [](MoeConfig& c) { c.capacity_factor = -2.0f; })),
              "model.moe.capacity_factor = -2");
}

TEST(RouterTest, WrongTensorsAreNamed) {
  MoeConfig config = Softmax(8, 2);
  std::vector<float> logits(4 * 7), bias(8);
  RouterOutput out;
  ExpectError(RouterForward(config, {TensorView(logits.data(), DType::kF32, {4, 7}), {}, 0}, &out),
              "logits: expected (-1, 8) f32, got (4, 7) f32");
  ExpectError(RouterForward(config, {TensorView(logits.data(), DType::kBF16, {2, 8}), {}, 0}, &out),
              "logits: expected (-1, 8) f32, got (2, 8) bf16");
  ExpectError(
      RouterForward(config, {TensorView(logits.data(), DType::kF32, {3, 1, 8}), {}, 0}, &out),
      "logits: expected (-1, 8) f32, got (3, 1, 8) f32");
  config.expert_bias = true;
  ExpectError(RouterForward(config, {TensorView(logits.data(), DType::kF32, {3, 8}), {}, 0}, &out),
              "expert_bias: expected (8) f32, got no tensor");
  ExpectError(RouterForward(config,
                            {TensorView(logits.data(), DType::kF32, {3, 8}),
                             TensorView(bias.data(), DType::kF32, {7}), 0},
                            &out),
              "expert_bias: expected (8) f32, got (7) f32");
  bias[2] = std::nanf("");
  ExpectError(RouterForward(config,
                            {TensorView(logits.data(), DType::kF32, {3, 8}),
                             TensorView(bias.data(), DType::kF32, {8}), 0},
                            &out),
              "expert_bias[2] = nan is not finite");
}

TEST(RouterTest, TokensMustBeAMultipleOfTheSequenceLength) {
  MoeConfig config = With(Softmax(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.1f;
  });
  ExpectError(ForwardWith(config, 10, 4),
              "T = 10 tokens, not a multiple of tokens_per_sequence = 4");
  ExpectError(ForwardWith(config, 10, -2), "tokens_per_sequence = -2");
  EXPECT_TRUE(ForwardWith(config, 12, 4).ok());
  EXPECT_TRUE(ForwardWith(config, 12, 12).ok());
}

TEST(RouterTest, NonFiniteLogitsAreNamed) {
  Problem p = MakeProblem(Softmax(8, 2), 300, 0, 1);
  p.logits[250 * 8 + 3] = std::numeric_limits<float>::infinity();
  p.logits[201 * 8 + 6] = std::nanf("");
  RouterOutput out;
  ExpectError(RouterForward(p.config, ArgsOf(p), &out), "logits[201, 6] = nan is not finite");
}

TEST(RouterTest, BackwardChecksItsTensors) {
  MoeConfig config = Softmax(8, 2);
  Problem p = MakeProblem(config, 4, 0, 1);
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, ArgsOf(p), &out).ok());
  std::vector<float> d_weights(4 * 3), d_logits(4 * 8);
  const TensorView good_dw(d_weights.data(), DType::kF32, {4, 2});
  const TensorView good_dz(d_logits.data(), DType::kF32, {4, 8});
  EXPECT_TRUE(RouterBackward(config, ArgsOf(p), out, good_dw, good_dz).ok());
  ExpectError(RouterBackward(config, ArgsOf(p), out,
                             TensorView(d_weights.data(), DType::kF32, {4, 3}), good_dz),
              "d_topk_weights: expected (4, 2) f32, got (4, 3) f32");
  ExpectError(RouterBackward(config, ArgsOf(p), out, good_dw,
                             TensorView(d_logits.data(), DType::kF32, {4, 4})),
              "d_logits: expected (4, 8) f32, got (4, 4) f32");
  ExpectError(RouterBackward(config, ArgsOf(p), out, good_dw, {}),
              "d_logits: expected (4, 8) f32, got no tensor");

  Problem other = MakeProblem(config, 5, 0, 1);
  RouterOutput stale;
  ASSERT_TRUE(RouterForward(config, ArgsOf(other), &stale).ok());
  ExpectError(RouterBackward(config, ArgsOf(p), stale, good_dw, good_dz),
              "forward.scores: expected (4, 8) f32, got (5, 8) f32");
  out.topk_experts.data<int32_t>()[3] = 99;
  ExpectError(RouterBackward(config, ArgsOf(p), out, good_dw, good_dz),
              "forward.topk_experts[1, 1] = 99 is not an expert in [0, 8)");
}

// ---------------------------------------------------------------------------------------------
// Expert bias updates.
// ---------------------------------------------------------------------------------------------

TEST(UpdateExpertBiasTest, StepsBySignOfTheGapToTheMean) {
  std::vector<float> bias = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ASSERT_TRUE(
      UpdateExpertBias({1, 2, 3, 2, 2}, 0.25f, TensorView(bias.data(), DType::kF32, {5})).ok());
  EXPECT_EQ(bias, (std::vector<float>{0.75f, 0.5f, 0.25f, 0.5f, 0.5f}));
  // A mean that is not an integer: no expert sits on it.
  ASSERT_TRUE(UpdateExpertBias({0, 1}, 1.0f, TensorView(bias.data(), DType::kF32, {2})).ok());
  EXPECT_EQ(bias[0], 1.75f);
  EXPECT_EQ(bias[1], -0.5f);
  // Balanced load: nothing moves.
  ASSERT_TRUE(UpdateExpertBias({3, 3, 3}, 1.0f, TensorView(bias.data(), DType::kF32, {3})).ok());
  EXPECT_EQ(bias[0], 1.75f);
}

TEST(UpdateExpertBiasTest, InvalidArguments) {
  std::vector<float> bias(8);
  ExpectError(UpdateExpertBias({1, 2, 3, 4}, 0.1f, TensorView(bias.data(), DType::kF32, {8})),
              "bias: expected (4) f32, got (8) f32");
  ExpectError(UpdateExpertBias({1, 2}, -0.1f, TensorView(bias.data(), DType::kF32, {2})),
              "rate = -0.1 must be non-negative and finite");
  ExpectError(UpdateExpertBias({1, -2}, 0.1f, TensorView(bias.data(), DType::kF32, {2})),
              "tokens_per_expert[1] = -2 is negative");
  ExpectError(UpdateExpertBias({}, 0.1f, TensorView(bias.data(), DType::kF32, {0})),
              "tokens_per_expert is empty");
}

double MaxOverMean(const std::vector<int64_t>& counts) {
  const double mean =
      std::accumulate(counts.begin(), counts.end(), 0.0) / static_cast<double>(counts.size());
  return *std::max_element(counts.begin(), counts.end()) / mean;
}

TEST(UpdateExpertBiasTest, BalancesASkewedLoad) {
  // A fixed batch whose logits favour high-numbered experts; the bias alone must even it out.
  MoeConfig config = Sigmoid(16, 2);
  Problem p = MakeProblem(config, 2048, 0, 17);
  for (int64_t t = 0; t < p.tokens; ++t) {
    for (int64_t e = 0; e < 16; ++e) p.logits[t * 16 + e] += 2.0f * e / 15.0f;
  }
  std::fill(p.bias.begin(), p.bias.end(), 0.0f);
  const RouterArgs args = ArgsOf(p);
  RouterOutput out;
  double first = 0.0, last = 0.0;
  constexpr int kSteps = 300;
  for (int step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(RouterForward(config, args, &out).ok());
    const double ratio = MaxOverMean(out.tokens_per_expert);
    if (step == 0) first = ratio;
    if (step >= kSteps - 20) last += ratio / 20;  // the bias oscillates about balance
    ASSERT_TRUE(UpdateExpertBias(out.tokens_per_expert, 2e-3f, args.expert_bias).ok());
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last - 1.0, 0.25 * (first - 1.0)) << "max/mean load " << first << " -> " << last;
  std::printf("max/mean load: step 0 %.3f, last 20 steps %.3f\n", first, last);
}

}  // namespace
}  // namespace moetrain
