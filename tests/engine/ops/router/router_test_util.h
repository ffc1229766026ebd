// What the router tests share: their configs, random problems, the engine's view of a problem,
// and the check of an InvalidArgument error.
#ifndef MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_TEST_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/router/router_reference.h"

namespace moetrain::router_test {

using ops::RouterArgs;
using ops::RouterOutput;

inline ExecContext Cpu() { return ExecContext::Cpu(); }

// ---------------------------------------------------------------------------------------------
// The ops as the tests call them.
// ---------------------------------------------------------------------------------------------

// The router's forward as one rank of the MoE layer runs it: RouterForward, then RouterAuxLoss
// with this call's own counts.
inline absl::Status RouterForward(const MoeConfig& config, const RouterArgs& args,
                                  RouterOutput* out) {
  MOETRAIN_RETURN_IF_ERROR(ops::RouterForward(Cpu(), config, args, out));
  return ops::RouterAuxLoss(Cpu(), config, args, out);
}

inline absl::Status RouterBackward(const MoeConfig& config, const RouterArgs& args,
                                   const RouterOutput& forward, TensorView d_topk_weights,
                                   TensorView d_logits, float loss_weight = 1.0f) {
  return ops::RouterBackward(Cpu(), config, args, forward, d_topk_weights, d_logits, loss_weight);
}

// The bias update with the counts as a host vector.
inline absl::Status UpdateExpertBias(const std::vector<int64_t>& counts, float rate,
                                     TensorView bias) {
  Tensor t = Tensor::Empty(DType::kI64, {static_cast<int64_t>(counts.size())});
  std::copy(counts.begin(), counts.end(), t.data<int64_t>());
  return ops::UpdateExpertBias(Cpu(), t, rate, bias);
}

// What a forward computed, read on the host.
inline std::vector<int64_t> Counts(const RouterOutput& out) {
  const TensorView counts = out.tokens_per_expert;
  return std::vector<int64_t>(counts.data<int64_t>(), counts.data<int64_t>() + counts.numel());
}
inline float AuxLoss(const RouterOutput& out) { return out.losses.data<float>()[0]; }
inline float ZLoss(const RouterOutput& out) { return out.losses.data<float>()[1]; }

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

// Edits of a config for With(config, edit): the variants the router tests (CPU and CUDA) cover.
inline void NoNorm(MoeConfig& c) { c.normalize_topk_weights = false; }
inline void Post(MoeConfig& c) { c.softmax_before_topk = false; }
inline void Bias(MoeConfig& c) { c.expert_bias = true; }
inline void SwitchAux(MoeConfig& c) {
  c.aux_loss = AuxLossType::kSwitch;
  c.aux_loss_coeff = 0.01f;
}
inline void SeqAux(MoeConfig& c) {
  c.aux_loss = AuxLossType::kSequence;
  c.aux_loss_coeff = 0.02f;
}
inline void ZLossTerm(MoeConfig& c) { c.z_loss_coeff = 1e-3f; }
inline auto Groups(int64_t groups, int64_t group_top_k) {
  return [groups, group_top_k](MoeConfig& c) {
    c.num_groups = groups;
    c.group_top_k = group_top_k;
  };
}
inline auto Rho(float rho) {
  return [rho](MoeConfig& c) { c.routed_scaling_factor = rho; };
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

#endif  // MOETRAIN_TESTS_ENGINE_OPS_ROUTER_ROUTER_TEST_UTIL_H_
