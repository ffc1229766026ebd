// What the router tests share: their configs, random problems, the engine's view of a problem,
// and the check of an InvalidArgument error.
#ifndef MOETRAIN_TESTS_ENGINE_MOE_ROUTER_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_MOE_ROUTER_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/router.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/router_reference.h"

namespace moetrain::router_test {

// ---------------------------------------------------------------------------------------------
// Configs.
// ---------------------------------------------------------------------------------------------

inline MoeConfig Softmax(int64_t experts, int64_t k) {
  MoeConfig c;
  c.num_experts = experts;
  c.top_k = k;
  return c;
}

inline MoeConfig Sigmoid(int64_t experts, int64_t k) {
  MoeConfig c = Softmax(experts, k);
  c.score_function = ScoreFunction::kSigmoid;
  c.expert_bias = true;
  return c;
}

MoeConfig With(MoeConfig c, auto edit) {
  edit(c);
  return c;
}

inline MoeConfig DeepSeekV3() {
  MoeConfig c = Sigmoid(256, 8);
  c.num_groups = 8;
  c.group_top_k = 4;
  c.routed_scaling_factor = 2.5f;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Problems.
// ---------------------------------------------------------------------------------------------

inline void Fill(std::mt19937& rng, std::vector<float>* v, size_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  v->resize(n);
  for (float& x : *v) x = normal(rng);
}

inline Problem MakeProblem(const MoeConfig& config, int64_t tokens, int64_t tokens_per_sequence,
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

inline RouterArgs ArgsOf(Problem& p) {
  return RouterArgs{TensorView(p.logits.data(), DType::kF32, {p.tokens, p.config.num_experts}),
                    TensorView(p.bias.data(), DType::kF32, {p.config.num_experts}),
                    p.tokens_per_sequence};
}

// ---------------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------------

inline void ExpectError(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

}  // namespace moetrain::router_test

#endif  // MOETRAIN_TESTS_ENGINE_MOE_ROUTER_TEST_UTIL_H_
