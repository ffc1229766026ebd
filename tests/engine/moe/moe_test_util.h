// What the MoE layer tests share: random problems for a config (LayerCase → Problem), the
// engine's tensors for them, and grads to accumulate into.
#ifndef MOETRAIN_TESTS_ENGINE_MOE_MOE_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_MOE_MOE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/moe_layer.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/moe_reference.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::moe_test {

// ---------------------------------------------------------------------------------------------
// Tensors

using test_util::MakeTensor;
using test_util::RoundToBF16;
using test_util::ToDoubles;

inline std::vector<double> ToDoubles(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// NaN everywhere, so that an element the engine forgets to write cannot pass.
inline Tensor NanTensor(DType dtype, std::vector<int64_t> shape) {
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

inline bool BitIdentical(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

// ‖a − b‖ / ‖b‖; ‖a‖ when b is zero.
inline double RelativeError(const std::vector<double>& actual,
                            const std::vector<double>& expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
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

// gtest prints parameters in failure messages: the name, not the bytes.
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

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

inline std::vector<float> Normal(std::mt19937& rng, size_t n, double stddev) {
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Problem MakeProblem(const LayerCase& c, DType dtype) {
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

// The problem's values for the float64 reference (moe_reference.h).
inline reference::Weights ToReference(const Problem& p) {
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

inline EngineInputs ToEngine(const Problem& p) {
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
inline EngineGrads MakeGrads(const Problem& p, std::mt19937* rng) {
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

}  // namespace moetrain::moe_test

#endif  // MOETRAIN_TESTS_ENGINE_MOE_MOE_TEST_UTIL_H_
