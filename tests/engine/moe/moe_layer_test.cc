// The MoE layer against a float64 reference (moe_reference.h): forward output, every gradient and
// the stats, for each router variant, in f32 and bf16; the reference itself against central
// differences; accumulation, determinism, and the errors of invalid inputs.
#include "engine/moe/moe_layer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/moe_reference.h"

namespace moetrain {
namespace {

#define MOETRAIN_ASSERT_OK(expr)          \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Tensors

float RoundToBF16(float v) { return BF16ToFloat(FloatToBF16(v)); }

Tensor MakeTensor(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = Tensor::Empty(dtype, shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = FloatToBF16(values[i]);
    } else {
      t.data<float>()[i] = values[i];
    }
  }
  return t;
}

// NaN everywhere, so that an element the engine forgets to write cannot pass.
Tensor NanTensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kBF16) {
      t.data<BF16>()[i] = BF16{0x7FC0};
    } else {
      t.data<float>()[i] = std::nanf("");
    }
  }
  return t;
}

std::vector<double> ToDoubles(const TensorView& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    v[i] = t.dtype() == DType::kBF16 ? BF16ToFloat(t.data<BF16>()[i]) : t.data<float>()[i];
  }
  return v;
}

std::vector<double> ToDoubles(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

bool BitIdentical(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

// ‖a − b‖ / ‖b‖; ‖a‖ when b is zero.
double RelativeError(const std::vector<double>& actual, const std::vector<double>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// `name` occurs in the status message as a whole identifier (not inside a longer one).
bool NamesWord(const absl::Status& status, std::string_view name) {
  const std::string text(status.message());
  auto is_word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const bool starts = at == 0 || !is_word(text[at - 1]);
    const bool ends = at + name.size() == text.size() || !is_word(text[at + name.size()]);
    if (starts && ends) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Problems: one config, its inputs, and the engine's tensors for them.

enum class Init {
  kRandom,
  // Softmax: expert E−1 is never chosen and expert E−2 by exactly one token.
  kDeadAndSingleExpert,
  // All logits 0: every score ties, so the top-k are experts 0..k−1.
  kZeroRouter,
  // Sigmoid, E = 8 in 4 groups, k = 4 of 2 groups: three groups tie for best, so groups 0 and 1.
  kGroupTies,
};

struct LayerCase {
  std::string name;
  MoeConfig config;
  int64_t tokens = 37;
  int64_t hidden = 24;
  int64_t tokens_per_sequence = 0;
  Init init = Init::kRandom;
  uint32_t seed = 1;
};

// The values the engine sees, as floats: already rounded to bf16 for a bf16 layer (all but the
// router and the bias, which stay f32).
struct Problem {
  MoeConfig config;
  DType dtype = DType::kF32;
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t tokens_per_sequence = 0;
  std::vector<float> x;               // (T, D)
  std::vector<float> router;          // (E, D)
  std::vector<float> expert_bias;     // (E); empty unless config.expert_bias
  std::vector<float> expert_gate_up;  // (E, 2F, D)
  std::vector<float> expert_down;     // (E, D, F)
  std::vector<float> shared_gate_up;  // (2SF, D); empty unless S > 0
  std::vector<float> shared_down;     // (D, SF); empty unless S > 0
  std::vector<float> d_out;           // (T, D)

  int64_t experts() const { return config.num_experts; }
  int64_t ffn() const { return config.expert_ffn_dim; }
  int64_t shared_ffn() const { return config.num_shared_experts * config.expert_ffn_dim; }
};

std::vector<float> Normal(std::mt19937& rng, size_t n, double stddev) {
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Problem MakeProblem(const LayerCase& c, DType dtype) {
  Problem p;
  p.config = c.config;
  p.dtype = dtype;
  p.tokens = c.tokens;
  p.hidden = c.hidden;
  p.tokens_per_sequence = c.tokens_per_sequence;
  const int64_t T = p.tokens, D = p.hidden, E = p.experts(), F = p.ffn(), SF = p.shared_ffn();
  std::mt19937 rng(c.seed);
  p.x = Normal(rng, T * D, 1.0);
  p.router = Normal(rng, E * D, 1.0 / std::sqrt(D));
  if (c.config.expert_bias) p.expert_bias = Normal(rng, E, 0.2);
  p.expert_gate_up = Normal(rng, E * 2 * F * D, 1.0 / std::sqrt(D));
  p.expert_down = Normal(rng, E * D * F, 1.0 / std::sqrt(F));
  if (SF > 0) {
    p.shared_gate_up = Normal(rng, 2 * SF * D, 1.0 / std::sqrt(D));
    p.shared_down = Normal(rng, D * SF, 1.0 / std::sqrt(SF));
  }
  p.d_out = Normal(rng, T * D, 1.0);

  switch (c.init) {
    case Init::kRandom:
      break;
    case Init::kDeadAndSingleExpert: {
      // Feature 0 is 4 everywhere, feature 1 is 4 only for one token: expert E−1 has logit
      // ≈ −16 for every token, expert E−2 ≈ +16 for that token and ≈ −16 for the others.
      const int64_t dead = E - 1, single = E - 2, chosen_token = T / 2;
      for (int64_t t = 0; t < T; ++t) {
        p.x[t * D + 0] = 4.0f;
        p.x[t * D + 1] = t == chosen_token ? 4.0f : 0.0f;
      }
      p.router[dead * D + 0] = -4.0f;
      p.router[dead * D + 1] = 0.0f;
      p.router[single * D + 0] = -4.0f;
      p.router[single * D + 1] = 8.0f;
      break;
    }
    case Init::kZeroRouter:
      std::fill(p.router.begin(), p.router.end(), 0.0f);
      break;
    case Init::kGroupTies:
      // s = 0.5 for all; s + b (exact in binary): groups {0.875, 0.5}, {0.75, 0.625},
      // {0.6875, 0.6875} all sum to 1.375, {0.9375, 0.25} to 1.1875. Ungrouped top-4 would be
      // experts 6, 0, 2, 4.
      std::fill(p.router.begin(), p.router.end(), 0.0f);
      p.expert_bias = {0.375f, 0.0f, 0.25f, 0.125f, 0.1875f, 0.1875f, 0.4375f, -0.25f};
      break;
  }

  if (dtype == DType::kBF16) {
    for (std::vector<float>* v :
         {&p.x, &p.expert_gate_up, &p.expert_down, &p.shared_gate_up, &p.shared_down, &p.d_out}) {
      for (float& value : *v) value = RoundToBF16(value);
    }
  }
  return p;
}

reference::Weights ToReference(const Problem& p) {
  reference::Weights w;
  w.num_experts = p.experts();
  w.hidden = p.hidden;
  w.ffn = p.ffn();
  w.shared_ffn = p.shared_ffn();
  w.router = ToDoubles(p.router);
  w.expert_bias = ToDoubles(p.expert_bias);
  w.expert_gate_up = ToDoubles(p.expert_gate_up);
  w.expert_down = ToDoubles(p.expert_down);
  w.shared_gate_up = ToDoubles(p.shared_gate_up);
  w.shared_down = ToDoubles(p.shared_down);
  return w;
}

struct EngineInputs {
  Tensor x, router, expert_bias, expert_gate_up, expert_down, shared_gate_up, shared_down, d_out;

  MoeWeights weights() const {
    return {.router = router,
            .expert_bias = expert_bias,
            .expert_gate_up = expert_gate_up,
            .expert_down = expert_down,
            .shared_gate_up = shared_gate_up,
            .shared_down = shared_down};
  }
};

EngineInputs ToEngine(const Problem& p) {
  const int64_t T = p.tokens, D = p.hidden, E = p.experts(), F = p.ffn(), SF = p.shared_ffn();
  EngineInputs in;
  in.x = MakeTensor(p.dtype, {T, D}, p.x);
  in.router = MakeTensor(DType::kF32, {E, D}, p.router);
  if (!p.expert_bias.empty()) in.expert_bias = MakeTensor(DType::kF32, {E}, p.expert_bias);
  in.expert_gate_up = MakeTensor(p.dtype, {E, 2 * F, D}, p.expert_gate_up);
  in.expert_down = MakeTensor(p.dtype, {E, D, F}, p.expert_down);
  if (SF > 0) {
    in.shared_gate_up = MakeTensor(p.dtype, {2 * SF, D}, p.shared_gate_up);
    in.shared_down = MakeTensor(p.dtype, {D, SF}, p.shared_down);
  }
  in.d_out = MakeTensor(p.dtype, {T, D}, p.d_out);
  return in;
}

struct EngineGrads {
  Tensor router, expert_gate_up, expert_down, shared_gate_up, shared_down;

  MoeGrads view() const {
    return {.router = router,
            .expert_gate_up = expert_gate_up,
            .expert_down = expert_down,
            .shared_gate_up = shared_gate_up,
            .shared_down = shared_down};
  }
};

// Zeroed grads, or (with `rng`) grads holding random values that Backward must add to.
EngineGrads MakeGrads(const Problem& p, std::mt19937* rng) {
  const int64_t D = p.hidden, E = p.experts(), F = p.ffn(), SF = p.shared_ffn();
  auto make = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return rng == nullptr ? Tensor::Zeros(DType::kF32, shape)
                          : MakeTensor(DType::kF32, shape, Normal(*rng, n, 1.0));
  };
  EngineGrads g;
  g.router = make({E, D});
  g.expert_gate_up = make({E, 2 * F, D});
  g.expert_down = make({E, D, F});
  if (SF > 0) {
    g.shared_gate_up = make({2 * SF, D});
    g.shared_down = make({D, SF});
  }
  return g;
}

// The grads' tensors in a fixed order (the shared ones only when present), and their names.
std::vector<const Tensor*> GradList(const EngineGrads& g) {
  std::vector<const Tensor*> list = {&g.router, &g.expert_gate_up, &g.expert_down};
  if (!g.shared_gate_up.empty()) {
    list.push_back(&g.shared_gate_up);
    list.push_back(&g.shared_down);
  }
  return list;
}

const char* GradName(size_t i) {
  static constexpr const char* kNames[] = {"d_router", "d_expert_gate_up", "d_expert_down",
                                           "d_shared_gate_up", "d_shared_down"};
  return kNames[i];
}

void CopyGrads(const EngineGrads& from, const EngineGrads& to) {
  const std::vector<const Tensor*> a = GradList(from), b = GradList(to);
  for (size_t i = 0; i < a.size(); ++i) {
    std::memcpy(b[i]->data<float>(), a[i]->data<float>(), a[i]->numel() * sizeof(float));
  }
}

struct EngineRun {
  Tensor out;  // (T, D) compute dtype
  Tensor d_x;  // (T, D) compute dtype
  MoeStats stats;
};

absl::Status ForwardBackward(MoeLayer& layer, const Problem& p, const EngineInputs& in,
                             const EngineGrads& grads, EngineRun* run) {
  run->out = NanTensor(p.dtype, {p.tokens, p.hidden});
  run->d_x = NanTensor(p.dtype, {p.tokens, p.hidden});
  absl::Status status =
      layer.Forward(in.weights(), in.x, p.tokens_per_sequence, run->out, &run->stats);
  if (!status.ok()) return status;
  MoeGrads g = grads.view();
  return layer.Backward(in.weights(), in.d_out, run->d_x, &g);
}

// The sorted set of experts each token chose.
std::vector<std::vector<int>> ChosenSets(const reference::Routing& r, int64_t k) {
  std::vector<std::vector<int>> sets(r.experts.size() / k);
  for (size_t t = 0; t < sets.size(); ++t) {
    sets[t].assign(r.experts.begin() + t * k, r.experts.begin() + (t + 1) * k);
    std::sort(sets[t].begin(), sets[t].end());
  }
  return sets;
}

// Experts that compute at least one pair (chosen and not dropped).
std::vector<char> ExpertsWithRows(const reference::Routing& r, int64_t num_experts) {
  std::vector<char> has(num_experts, 0);
  for (size_t i = 0; i < r.experts.size(); ++i) {
    if (r.kept[i]) has[r.experts[i]] = 1;
  }
  return has;
}

struct Reference {
  reference::Weights weights;
  std::vector<double> x, d_out;
  reference::ForwardResult forward;
  reference::Grads grads;
};

Reference ComputeReference(const Problem& p) {
  Reference ref;
  ref.weights = ToReference(p);
  ref.x = ToDoubles(p.x);
  ref.d_out = ToDoubles(p.d_out);
  ref.forward = reference::Forward(p.config, ref.weights, ref.x, p.tokens, p.tokens_per_sequence);
  ref.grads = reference::Backward(p.config, ref.weights, ref.x, p.tokens, p.tokens_per_sequence,
                                  ref.forward, ref.d_out);
  return ref;
}

// What each case claims to exercise, checked on the reference: otherwise a passing test proves
// less than its name says.
void CheckPremises(const LayerCase& c, const Problem& p, const Reference& ref) {
  const reference::Routing& r = ref.forward.routing;
  const int64_t T = p.tokens, E = p.experts(), k = p.config.top_k;
  const bool ties = c.init == Init::kZeroRouter || c.init == Init::kGroupTies;
  if (!ties) {
    // f32 logits differ from the float64 ones by ~1e-7: no decision may be closer than that.
    EXPECT_GT(r.selection_margin, 1e-5) << "seed " << c.seed << " gives a near-tie in top-k";
    EXPECT_GT(r.capacity_margin, 1e-5) << "seed " << c.seed << " gives a near-tie at capacity";
  }
  switch (c.init) {
    case Init::kRandom:
      break;
    case Init::kDeadAndSingleExpert:
      EXPECT_EQ(r.tokens_per_expert[E - 1], 0);
      EXPECT_EQ(r.tokens_per_expert[E - 2], 1);
      break;
    case Init::kZeroRouter:
      for (int64_t e = 0; e < E; ++e) EXPECT_EQ(r.tokens_per_expert[e], e < k ? T : 0);
      break;
    case Init::kGroupTies:
      EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{T, T, T, T, 0, 0, 0, 0}));
      break;
  }
  if (p.config.capacity_factor > 0.0f) {
    EXPECT_GT(r.dropped, 0) << "no pair was dropped";
  }
  if (p.config.aux_loss != AuxLossType::kNone) {
    EXPECT_GT(r.aux_loss, 0.0);
  }
  if (p.config.z_loss_coeff > 0.0f) {
    EXPECT_GT(r.z_loss, 0.0);
  }
  if (c.init == Init::kRandom && p.config.expert_bias) {
    MoeConfig no_bias = p.config;
    no_bias.expert_bias = false;
    const reference::Routing unbiased =
        reference::Route(no_bias, ref.weights, ref.x, T, p.tokens_per_sequence);
    EXPECT_NE(ChosenSets(unbiased, k), ChosenSets(r, k)) << "the bias changes no selection";
  }
  if (c.init == Init::kRandom && p.config.num_groups > 1) {
    MoeConfig ungrouped = p.config;
    ungrouped.num_groups = 1;
    ungrouped.group_top_k = 1;
    const reference::Routing plain =
        reference::Route(ungrouped, ref.weights, ref.x, T, p.tokens_per_sequence);
    EXPECT_NE(ChosenSets(plain, k), ChosenSets(r, k)) << "the group limit changes no selection";
  }
}

// ---------------------------------------------------------------------------------------------
// The configurations. T×D×F = 37×24×20 unless stated: no size is a multiple of a tile.

std::vector<LayerCase> LayerCases() {
  using enum ScoreFunction;
  using enum AuxLossType;
  return {
      {.name = "SoftmaxTopkNormalized",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20}},
      {.name = "SoftmaxTopkUnnormalizedScaled",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .normalize_topk_weights = false,
                  .routed_scaling_factor = 1.5f},
       .seed = 2},
      {.name = "SoftmaxAfterTopk",
       .config = {.num_experts = 8,
                  .top_k = 3,
                  .expert_ffn_dim = 20,
                  .softmax_before_topk = false,
                  .routed_scaling_factor = 1.5f},
       .seed = 3},
      {.name = "SigmoidBiasNormalizedScaled",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .expert_bias = true},
       .seed = 4},
      {.name = "SigmoidUnnormalized",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .normalize_topk_weights = false},
       .seed = 5},
      {.name = "GroupLimitedDeepSeekV3",
       .config = {.num_experts = 256,
                  .top_k = 8,
                  .expert_ffn_dim = 12,
                  .num_shared_experts = 1,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .num_groups = 8,
                  .group_top_k = 4,
                  .expert_bias = true},
       .hidden = 16,
       .seed = 6},
      {.name = "TopKEqualsNumExperts",
       .config = {.num_experts = 4, .top_k = 4, .expert_ffn_dim = 20},
       .seed = 7},
      {.name = "SingleExpert",
       .config = {.num_experts = 1, .top_k = 1, .expert_ffn_dim = 20},
       .seed = 8},
      {.name = "SingleToken",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20},
       .tokens = 1,
       .seed = 9},
      {.name = "ExpertWithNoTokensAndExpertWithOne",
       .config = {.num_experts = 6, .top_k = 2, .expert_ffn_dim = 20},
       .init = Init::kDeadAndSingleExpert,
       .seed = 10},
      {.name = "SharedExperts",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20, .num_shared_experts = 2},
       .seed = 11},
      {.name = "SharedExpertsWithAuxAndZLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .num_shared_experts = 2,
                  .score_function = kSigmoid,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .z_loss_coeff = 0.05f},
       .seed = 12},
      {.name = "SwitchAuxLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f},
       .seed = 13},
      {.name = "SequenceAuxLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.5f},
       .tokens = 35,
       .tokens_per_sequence = 7,
       .seed = 14},
      {.name = "ZLoss",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .softmax_before_topk = false,
                  .z_loss_coeff = 0.1f},
       .seed = 15},
      {.name = "CapacityByProbability",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .capacity_factor = 0.75f,
                  .drop_policy = DropPolicy::kProbability},
       .seed = 16},
      {.name = "CapacityByPosition",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .capacity_factor = 0.75f,
                  .drop_policy = DropPolicy::kPosition},
       .seed = 17},
      {.name = "TiesGoToLowerExperts",
       .config = {.num_experts = 8, .top_k = 2, .expert_ffn_dim = 20},
       .init = Init::kZeroRouter,
       .seed = 18},
      {.name = "GroupTiesGoToLowerGroups",
       .config = {.num_experts = 8,
                  .top_k = 4,
                  .expert_ffn_dim = 20,
                  .score_function = kSigmoid,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .expert_bias = true},
       .init = Init::kGroupTies,
       .seed = 19},
      {.name = "LargeThreaded",
       .config = {.num_experts = 16,
                  .top_k = 4,
                  .expert_ffn_dim = 96,
                  .num_shared_experts = 1,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.5f,
                  .z_loss_coeff = 0.05f},
       .tokens = 512,
       .hidden = 64,
       .seed = 20},
  };
}

// gtest prints parameters in failure messages: the name, not the bytes.
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

using LayerParam = std::tuple<LayerCase, DType>;

std::string LayerParamName(const ::testing::TestParamInfo<LayerParam>& info) {
  return std::get<0>(info.param).name + "_" + std::string(DTypeName(std::get<1>(info.param)));
}

class MoeLayerTest : public ::testing::TestWithParam<LayerParam> {
 protected:
  double Tolerance() const { return std::get<1>(GetParam()) == DType::kBF16 ? 3e-2 : 1e-5; }
};

TEST_P(MoeLayerTest, MatchesFloat64Reference) {
  const auto& [c, dtype] = GetParam();
  const Problem p = MakeProblem(c, dtype);
  const Reference ref = ComputeReference(p);
  CheckPremises(c, p, ref);
  const reference::Routing& r = ref.forward.routing;

  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, dtype);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const EngineInputs in = ToEngine(p);
  const EngineGrads grads = MakeGrads(p, nullptr);
  EngineRun run;
  MOETRAIN_ASSERT_OK(ForwardBackward(*layer, p, in, grads, &run));

  struct Compared {
    const char* name;
    std::vector<double> actual;
    const std::vector<double>* expected;
  };
  std::vector<Compared> compared = {
      {"out", ToDoubles(run.out), &ref.forward.out},
      {"d_x", ToDoubles(run.d_x), &ref.grads.x},
      {"d_router", ToDoubles(grads.router), &ref.grads.router},
      {"d_expert_gate_up", ToDoubles(grads.expert_gate_up), &ref.grads.expert_gate_up},
      {"d_expert_down", ToDoubles(grads.expert_down), &ref.grads.expert_down},
  };
  if (p.shared_ffn() > 0) {
    compared.push_back(
        {"d_shared_gate_up", ToDoubles(grads.shared_gate_up), &ref.grads.shared_gate_up});
    compared.push_back({"d_shared_down", ToDoubles(grads.shared_down), &ref.grads.shared_down});
  }
  std::string report;
  for (const Compared& cmp : compared) {
    const double error = RelativeError(cmp.actual, *cmp.expected);
    EXPECT_LT(error, Tolerance()) << cmp.name;
    char line[64];
    std::snprintf(line, sizeof(line), " %s=%.1e", cmp.name, error);
    report += line;
  }
  std::printf("[ rel err  ]%s\n", report.c_str());

  // An expert that computes nothing leaves its gradient untouched (here: exactly zero).
  const int64_t D = p.hidden, F = p.ffn();
  const std::vector<char> has_rows = ExpertsWithRows(r, p.experts());
  for (int64_t e = 0; e < p.experts(); ++e) {
    if (has_rows[e]) continue;
    for (int64_t i = 0; i < 2 * F * D; ++i) {
      ASSERT_EQ(grads.expert_gate_up.data<float>()[e * 2 * F * D + i], 0.0f) << "expert " << e;
    }
    for (int64_t i = 0; i < D * F; ++i) {
      ASSERT_EQ(grads.expert_down.data<float>()[e * D * F + i], 0.0f) << "expert " << e;
    }
  }

  // Stats. The router runs in f32 in both compute dtypes.
  const MoeStats& stats = run.stats;
  EXPECT_EQ(stats.tokens_per_expert, r.tokens_per_expert);
  EXPECT_EQ(stats.dropped_tokens, r.dropped);
  EXPECT_NEAR(stats.aux_loss, r.aux_loss, 1e-5 * std::abs(r.aux_loss) + 1e-7);
  EXPECT_NEAR(stats.z_loss, r.z_loss, 1e-5 * std::abs(r.z_loss) + 1e-7);
  const double mean_load = static_cast<double>(p.tokens * p.config.top_k) / p.experts();
  const double max_load = *std::max_element(r.tokens_per_expert.begin(), r.tokens_per_expert.end());
  EXPECT_NEAR(stats.max_mean_load_ratio, max_load / mean_load, 1e-6 * max_load / mean_load);
}

TEST_P(MoeLayerTest, AccumulatesGradientsAndIsDeterministic) {
  const auto& [c, dtype] = GetParam();
  const Problem p = MakeProblem(c, dtype);
  const EngineInputs in = ToEngine(p);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, dtype);
  ASSERT_TRUE(layer.ok()) << layer.status();

  // One pass from zeroed grads: the gradient g, kept in `once`.
  const EngineGrads grads = MakeGrads(p, nullptr);
  EngineRun first;
  MOETRAIN_ASSERT_OK(ForwardBackward(*layer, p, in, grads, &first));
  const EngineGrads once = MakeGrads(p, nullptr);
  CopyGrads(grads, once);

  // The same layer again into the same grads: identical out and d_x, and 2·g.
  EngineRun second;
  MOETRAIN_ASSERT_OK(ForwardBackward(*layer, p, in, grads, &second));
  EXPECT_TRUE(BitIdentical(first.out, second.out));
  EXPECT_TRUE(BitIdentical(first.d_x, second.d_x));
  const std::vector<const Tensor*> twice_list = GradList(grads), once_list = GradList(once);
  for (size_t i = 0; i < once_list.size(); ++i) {
    std::vector<double> doubled = ToDoubles(*once_list[i]);
    for (double& v : doubled) v *= 2.0;
    EXPECT_LT(RelativeError(ToDoubles(*twice_list[i]), doubled), 1e-6) << GradName(i);
  }

  // A fresh layer from zeroed grads: bit-identical out, d_x and grads.
  {
    absl::StatusOr<MoeLayer> fresh = MoeLayer::Create(p.config, p.hidden, dtype);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    const EngineGrads again = MakeGrads(p, nullptr);
    EngineRun run;
    MOETRAIN_ASSERT_OK(ForwardBackward(*fresh, p, in, again, &run));
    EXPECT_TRUE(BitIdentical(first.out, run.out));
    EXPECT_TRUE(BitIdentical(first.d_x, run.d_x));
    const std::vector<const Tensor*> again_list = GradList(again);
    for (size_t i = 0; i < once_list.size(); ++i) {
      EXPECT_TRUE(BitIdentical(*again_list[i], *once_list[i])) << GradName(i);
    }
  }

  // A fresh layer into grads holding G0: G0 + g, and experts with no rows keep G0 exactly.
  {
    absl::StatusOr<MoeLayer> fresh = MoeLayer::Create(p.config, p.hidden, dtype);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    std::mt19937 rng(c.seed + 1000);
    const EngineGrads accumulated = MakeGrads(p, &rng);
    const EngineGrads initial = MakeGrads(p, nullptr);
    CopyGrads(accumulated, initial);
    EngineRun run;
    MOETRAIN_ASSERT_OK(ForwardBackward(*fresh, p, in, accumulated, &run));
    const std::vector<const Tensor*> after = GradList(accumulated), before = GradList(initial);
    for (size_t i = 0; i < after.size(); ++i) {
      std::vector<double> expected = ToDoubles(*before[i]);
      const std::vector<double> g = ToDoubles(*once_list[i]);
      for (size_t j = 0; j < expected.size(); ++j) expected[j] += g[j];
      EXPECT_LT(RelativeError(ToDoubles(*after[i]), expected), 1e-6) << GradName(i);
    }
    const Reference ref = ComputeReference(p);
    const std::vector<char> has_rows = ExpertsWithRows(ref.forward.routing, p.experts());
    const int64_t block_gate_up = 2 * p.ffn() * p.hidden, block_down = p.hidden * p.ffn();
    for (int64_t e = 0; e < p.experts(); ++e) {
      if (has_rows[e]) continue;
      EXPECT_EQ(std::memcmp(accumulated.expert_gate_up.data<float>() + e * block_gate_up,
                            initial.expert_gate_up.data<float>() + e * block_gate_up,
                            block_gate_up * sizeof(float)),
                0)
          << "expert " << e;
      EXPECT_EQ(std::memcmp(accumulated.expert_down.data<float>() + e * block_down,
                            initial.expert_down.data<float>() + e * block_down,
                            block_down * sizeof(float)),
                0)
          << "expert " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MoeLayerTest,
                         ::testing::Combine(::testing::ValuesIn(LayerCases()),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         LayerParamName);

// The layer keeps what Backward needs from the last Forward, whatever the batch size before it.
TEST(MoeLayerReuseTest, ForwardWithAnotherBatchSizeThenBackward) {
  LayerCase big = {.name = "big",
                   .config = {.num_experts = 8,
                              .top_k = 2,
                              .expert_ffn_dim = 20,
                              .num_shared_experts = 1,
                              .aux_loss = AuxLossType::kSwitch,
                              .aux_loss_coeff = 0.5f,
                              .capacity_factor = 0.75f},
                   .tokens = 37,
                   .seed = 31};
  LayerCase small = big;
  small.tokens = 9;
  small.seed = 32;
  const Problem p_big = MakeProblem(big, DType::kF32);
  const Problem p_small = MakeProblem(small, DType::kF32);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(big.config, big.hidden, DType::kF32);
  ASSERT_TRUE(layer.ok()) << layer.status();

  const EngineInputs in_big = ToEngine(p_big);
  const EngineGrads grads_big = MakeGrads(p_big, nullptr);
  EngineRun run_big;
  MOETRAIN_ASSERT_OK(ForwardBackward(*layer, p_big, in_big, grads_big, &run_big));

  const EngineInputs in_small = ToEngine(p_small);
  Tensor out = NanTensor(DType::kF32, {p_small.tokens, p_small.hidden});
  // Stats may be null.
  MOETRAIN_ASSERT_OK(layer->Forward(in_small.weights(), in_small.x, 0, out, nullptr));
  // A second Forward of the big batch, then the small one again: Backward sees the small one.
  Tensor out_big = NanTensor(DType::kF32, {p_big.tokens, p_big.hidden});
  MOETRAIN_ASSERT_OK(layer->Forward(in_big.weights(), in_big.x, 0, out_big, nullptr));
  EXPECT_TRUE(BitIdentical(out_big, run_big.out));
  MOETRAIN_ASSERT_OK(layer->Forward(in_small.weights(), in_small.x, 0, out, nullptr));
  const EngineGrads grads = MakeGrads(p_small, nullptr);
  Tensor d_x = NanTensor(DType::kF32, {p_small.tokens, p_small.hidden});
  MoeGrads g = grads.view();
  MOETRAIN_ASSERT_OK(layer->Backward(in_small.weights(), in_small.d_out, d_x, &g));

  const Reference ref = ComputeReference(p_small);
  EXPECT_LT(RelativeError(ToDoubles(out), ref.forward.out), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(d_x), ref.grads.x), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.router), ref.grads.router), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.expert_gate_up), ref.grads.expert_gate_up), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.expert_down), ref.grads.expert_down), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.shared_gate_up), ref.grads.shared_gate_up), 1e-5);
  EXPECT_LT(RelativeError(ToDoubles(grads.shared_down), ref.grads.shared_down), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// The reference's backward against central differences of its forward, at tiny sizes.

struct FdCase {
  std::string name;
  MoeConfig config;
  int64_t tokens = 4;
  int64_t tokens_per_sequence = 0;
  uint32_t seed = 1;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradientTest : public ::testing::TestWithParam<FdCase> {};

TEST_P(ReferenceGradientTest, BackwardMatchesCentralDifferences) {
  const FdCase& c = GetParam();
  const MoeConfig& config = c.config;
  const int64_t T = c.tokens, D = 5, E = config.num_experts, F = config.expert_ffn_dim;
  const int64_t SF = config.num_shared_experts * F;
  std::mt19937 rng(c.seed);
  auto normal = [&](size_t n, double stddev) { return ToDoubles(Normal(rng, n, stddev)); };
  reference::Weights w;
  w.num_experts = E;
  w.hidden = D;
  w.ffn = F;
  w.shared_ffn = SF;
  std::vector<double> x = normal(T * D, 1.0);
  w.router = normal(E * D, 1.0 / std::sqrt(D));
  if (config.expert_bias) w.expert_bias = normal(E, 0.2);
  w.expert_gate_up = normal(E * 2 * F * D, 1.0 / std::sqrt(D));
  w.expert_down = normal(E * D * F, 1.0 / std::sqrt(F));
  w.shared_gate_up = normal(2 * SF * D, 1.0 / std::sqrt(D));
  w.shared_down = normal(D * SF, SF > 0 ? 1.0 / std::sqrt(SF) : 1.0);
  const std::vector<double> d_out = normal(T * D, 1.0);

  const reference::ForwardResult base = reference::Forward(config, w, x, T, c.tokens_per_sequence);
  const reference::Grads grads =
      reference::Backward(config, w, x, T, c.tokens_per_sequence, base, d_out);
  if (config.aux_loss != AuxLossType::kNone) {
    EXPECT_GT(base.routing.aux_loss, 0.0);
  }
  if (config.z_loss_coeff > 0.0f) {
    EXPECT_GT(base.routing.z_loss, 0.0);
  }
  if (config.capacity_factor > 0.0f) {
    EXPECT_GT(base.routing.dropped, 0);
  }

  constexpr double kStep = 1e-5;
  int64_t checked = 0, skipped = 0;
  auto check = [&](const char* name, std::vector<double>& values,
                   const std::vector<double>& analytic) {
    ASSERT_EQ(values.size(), analytic.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      const double saved = values[i];
      double loss[2];
      bool same_routing = true;
      for (int side = 0; side < 2; ++side) {
        values[i] = saved + (side == 0 ? kStep : -kStep);
        const reference::ForwardResult f =
            reference::Forward(config, w, x, T, c.tokens_per_sequence);
        same_routing = same_routing && f.routing.experts == base.routing.experts &&
                       f.routing.kept == base.routing.kept;
        loss[side] = reference::Loss(f, d_out);
      }
      values[i] = saved;
      if (!same_routing) {
        ++skipped;
        continue;
      }
      ++checked;
      const double numeric = (loss[0] - loss[1]) / (2.0 * kStep);
      EXPECT_NEAR(analytic[i], numeric, 1e-7 + 1e-6 * std::abs(numeric)) << name << "[" << i << "]";
    }
  };
  check("x", x, grads.x);
  check("router", w.router, grads.router);
  check("expert_gate_up", w.expert_gate_up, grads.expert_gate_up);
  check("expert_down", w.expert_down, grads.expert_down);
  check("shared_gate_up", w.shared_gate_up, grads.shared_gate_up);
  check("shared_down", w.shared_down, grads.shared_down);
  EXPECT_LT(skipped, checked / 20) << "too many perturbations change the routing";
}

std::vector<FdCase> FdCases() {
  using enum ScoreFunction;
  using enum AuxLossType;
  return {
      {.name = "SoftmaxNormalizedSwitchZShared",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .num_shared_experts = 1,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f}},
      {.name = "SoftmaxUnnormalizedSequenceZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .normalize_topk_weights = false,
                  .routed_scaling_factor = 1.5f,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .tokens_per_sequence = 2,
       .seed = 2},
      {.name = "SoftmaxAfterTopkSwitchZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .softmax_before_topk = false,
                  .routed_scaling_factor = 1.5f,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .seed = 3},
      {.name = "SigmoidBiasNormalizedSequenceZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .expert_bias = true,
                  .aux_loss = kSequence,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .tokens_per_sequence = 2,
       .seed = 4},
      {.name = "SigmoidUnnormalizedSwitch",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .normalize_topk_weights = false,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f},
       .seed = 5},
      {.name = "GroupLimitedSigmoidBiasSwitchZ",
       .config = {.num_experts = 8,
                  .top_k = 4,
                  .expert_ffn_dim = 3,
                  .num_shared_experts = 1,
                  .score_function = kSigmoid,
                  .routed_scaling_factor = 2.5f,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .expert_bias = true,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f},
       .seed = 6},
      {.name = "GroupLimitedSoftmax",
       .config = {.num_experts = 8,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .num_groups = 4,
                  .group_top_k = 2,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f},
       .seed = 7},
      {.name = "CapacityByProbabilitySwitchZ",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .aux_loss = kSwitch,
                  .aux_loss_coeff = 0.3f,
                  .z_loss_coeff = 0.1f,
                  .capacity_factor = 0.5f,
                  .drop_policy = DropPolicy::kProbability},
       .seed = 8},
      {.name = "CapacityByPositionSigmoid",
       .config = {.num_experts = 4,
                  .top_k = 2,
                  .expert_ffn_dim = 3,
                  .score_function = kSigmoid,
                  .expert_bias = true,
                  .capacity_factor = 0.5f,
                  .drop_policy = DropPolicy::kPosition},
       .seed = 9},
  };
}

INSTANTIATE_TEST_SUITE_P(RouterVariants, ReferenceGradientTest, ::testing::ValuesIn(FdCases()),
                         [](const ::testing::TestParamInfo<FdCase>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// Invalid inputs.

LayerCase SmallCase() {
  return {.name = "small",
          .config = {.num_experts = 4,
                     .top_k = 2,
                     .expert_ffn_dim = 6,
                     .num_shared_experts = 1,
                     .score_function = ScoreFunction::kSigmoid,
                     .expert_bias = true},
          .tokens = 5,
          .hidden = 8,
          .seed = 41};
}

TEST(MoeLayerCreateTest, RejectsTopKAboveNumExperts) {
  MoeConfig config;
  config.num_experts = 8;
  config.top_k = 9;
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(config, 16, DType::kF32);
  ASSERT_FALSE(layer.ok());
  EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << layer.status();
  EXPECT_TRUE(NamesWord(layer.status(), "model.moe.top_k")) << layer.status();
  EXPECT_TRUE(NamesWord(layer.status(), "9")) << layer.status();
}

TEST(MoeLayerCreateTest, RejectsBadHiddenSizeAndDType) {
  const MoeConfig config;
  for (int64_t hidden : {0, -3}) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(config, hidden, DType::kF32);
    ASSERT_FALSE(layer.ok()) << "hidden_size " << hidden;
    EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << layer.status();
  }
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64}) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(config, 16, dtype);
    ASSERT_FALSE(layer.ok()) << DTypeName(dtype);
    EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << layer.status();
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(config, 16, dtype);
    EXPECT_TRUE(layer.ok()) << layer.status();
  }
}

TEST(MoeLayerBackwardTest, BeforeForwardIsFailedPrecondition) {
  const Problem p = MakeProblem(SmallCase(), DType::kF32);
  const EngineInputs in = ToEngine(p);
  const EngineGrads grads = MakeGrads(p, nullptr);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, DType::kF32);
  ASSERT_TRUE(layer.ok()) << layer.status();
  Tensor d_x = Tensor::Zeros(DType::kF32, {p.tokens, p.hidden});
  MoeGrads g = grads.view();
  const absl::Status status = layer->Backward(in.weights(), in.d_out, d_x, &g);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

// One wrong argument of Forward, and the word its error must name.
struct BadForward {
  std::string expected_name;
  std::function<void(TensorView& x, TensorView& out, MoeWeights& w, std::vector<Tensor>& keep)>
      mutate;
};

void ExpectForwardRejects(DType dtype, const std::vector<BadForward>& cases) {
  const Problem p = MakeProblem(SmallCase(), dtype);
  const EngineInputs in = ToEngine(p);
  for (const BadForward& bad : cases) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, dtype);
    ASSERT_TRUE(layer.ok()) << layer.status();
    Tensor out_tensor = Tensor::Zeros(dtype, {p.tokens, p.hidden});
    TensorView x = in.x, out = out_tensor;
    MoeWeights w = in.weights();
    std::vector<Tensor> keep;
    bad.mutate(x, out, w, keep);
    const absl::Status status = layer->Forward(w, x, 0, out, nullptr);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad.expected_name << ": " << status;
    EXPECT_TRUE(NamesWord(status, bad.expected_name))
        << "expected the error to name " << bad.expected_name << ": " << status;
  }
}

TEST(MoeLayerForwardTest, RejectsWrongShapesAndDTypes) {
  const Problem p = MakeProblem(SmallCase(), DType::kF32);
  const int64_t T = p.tokens, D = p.hidden, E = p.experts(), F = p.ffn(), SF = p.shared_ffn();
  auto tensor = [](std::vector<Tensor>& keep, DType dtype, std::vector<int64_t> shape) {
    keep.push_back(Tensor::Zeros(dtype, shape));
    return keep.back().view();
  };
  using enum DType;
  ExpectForwardRejects(
      kF32,
      {
          {"x",
           [&](auto& x, auto&, auto&, auto& k) {
             x = tensor(k, kF32, {T, D + 1});
           }},
          {"x",
           [&](auto& x, auto&, auto&, auto& k) {
             x = tensor(k, kBF16, {T, D});
           }},
          {"x", [&](auto& x, auto&, auto&, auto& k) { x = tensor(k, kF32, {T * D}); }},
          {"out",
           [&](auto&, auto& o, auto&, auto& k) {
             o = tensor(k, kF32, {T + 1, D});
           }},
          {"out",
           [&](auto&, auto& o, auto&, auto& k) {
             o = tensor(k, kBF16, {T, D});
           }},
          {"router",
           [&](auto&, auto&, auto& w, auto& k) {
             w.router = tensor(k, kF32, {E + 1, D});
           }},
          {"router",
           [&](auto&, auto&, auto& w, auto& k) {
             w.router = tensor(k, kBF16, {E, D});
           }},
          {"expert_bias", [&](auto&, auto&, auto& w, auto&) { w.expert_bias = TensorView(); }},
          {"expert_bias",
           [&](auto&, auto&, auto& w, auto& k) { w.expert_bias = tensor(k, kF32, {E + 2}); }},
          {"expert_gate_up",
           [&](auto&, auto&, auto& w, auto& k) {
             w.expert_gate_up = tensor(k, kF32, {E, F, D});
           }},
          {"expert_gate_up",
           [&](auto&, auto&, auto& w, auto& k) {
             w.expert_gate_up = tensor(k, kBF16, {E, 2 * F, D});
           }},
          {"expert_down",
           [&](auto&, auto&, auto& w, auto& k) {
             w.expert_down = tensor(k, kF32, {E, F, D});
           }},
          {"shared_gate_up",
           [&](auto&, auto&, auto& w, auto&) { w.shared_gate_up = TensorView(); }},
          {"shared_down",
           [&](auto&, auto&, auto& w, auto& k) {
             w.shared_down = tensor(k, kF32, {D, SF + 1});
           }},
      });
  // A bf16 layer wants bf16 activations and expert weights.
  ExpectForwardRejects(kBF16, {
                                  {"x",
                                   [&](auto& x, auto&, auto&, auto& k) {
                                     x = tensor(k, kF32, {T, D});
                                   }},
                                  {"out",
                                   [&](auto&, auto& o, auto&, auto& k) {
                                     o = tensor(k, kF32, {T, D});
                                   }},
                                  {"expert_down",
                                   [&](auto&, auto&, auto& w, auto& k) {
                                     w.expert_down = tensor(k, kF32, {E, D, F});
                                   }},
                                  {"shared_gate_up",
                                   [&](auto&, auto&, auto& w, auto& k) {
                                     w.shared_gate_up = tensor(k, kF32, {2 * SF, D});
                                   }},
                              });
}

TEST(MoeLayerForwardTest, RejectsSequenceLengthThatDoesNotDivideTokens) {
  LayerCase c = SmallCase();
  c.config.aux_loss = AuxLossType::kSequence;
  c.config.aux_loss_coeff = 0.1f;
  const Problem p = MakeProblem(c, DType::kF32);  // T = 5
  const EngineInputs in = ToEngine(p);
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, DType::kF32);
  ASSERT_TRUE(layer.ok()) << layer.status();
  Tensor out = Tensor::Zeros(DType::kF32, {p.tokens, p.hidden});
  const absl::Status status = layer->Forward(in.weights(), in.x, 2, out, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

TEST(MoeLayerBackwardTest, RejectsWrongShapesAndDTypes) {
  const Problem p = MakeProblem(SmallCase(), DType::kF32);
  const EngineInputs in = ToEngine(p);
  const int64_t T = p.tokens, D = p.hidden, E = p.experts(), F = p.ffn(), SF = p.shared_ffn();
  struct BadBackward {
    std::string expected_name;
    std::function<void(TensorView& d_out, TensorView& d_x, MoeGrads& g)> mutate;
  };
  Tensor d_out_wide = Tensor::Zeros(DType::kF32, {T, D + 1});
  Tensor d_x_bf16 = Tensor::Zeros(DType::kBF16, {T, D});
  Tensor router_wrong = Tensor::Zeros(DType::kF32, {E, D + 1});
  Tensor down_wrong = Tensor::Zeros(DType::kF32, {E, F, D});
  Tensor shared_down_bf16 = Tensor::Zeros(DType::kBF16, {D, SF});
  const std::vector<BadBackward> cases = {
      {"d_out", [&](auto& d_out, auto&, auto&) { d_out = d_out_wide; }},
      {"d_x", [&](auto&, auto& d_x, auto&) { d_x = d_x_bf16; }},
      {"router", [&](auto&, auto&, auto& g) { g.router = router_wrong; }},
      {"expert_down", [&](auto&, auto&, auto& g) { g.expert_down = down_wrong; }},
      {"shared_down", [&](auto&, auto&, auto& g) { g.shared_down = shared_down_bf16; }},
      {"shared_gate_up", [&](auto&, auto&, auto& g) { g.shared_gate_up = TensorView(); }},
  };
  for (const BadBackward& bad : cases) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(p.config, p.hidden, DType::kF32);
    ASSERT_TRUE(layer.ok()) << layer.status();
    Tensor out = Tensor::Zeros(DType::kF32, {T, D});
    MOETRAIN_ASSERT_OK(layer->Forward(in.weights(), in.x, 0, out, nullptr));
    const EngineGrads grads = MakeGrads(p, nullptr);
    Tensor d_x_tensor = Tensor::Zeros(DType::kF32, {T, D});
    TensorView d_out = in.d_out, d_x = d_x_tensor;
    MoeGrads g = grads.view();
    bad.mutate(d_out, d_x, g);
    const absl::Status status = layer->Backward(in.weights(), d_out, d_x, &g);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << bad.expected_name << ": " << status;
    EXPECT_TRUE(NamesWord(status, bad.expected_name))
        << "expected the error to name " << bad.expected_name << ": " << status;
  }
}

}  // namespace
}  // namespace moetrain
