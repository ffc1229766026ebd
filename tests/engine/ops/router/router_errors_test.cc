// RouterForward and RouterBackward reject invalid configs and tensors with InvalidArgument, and
// the message names the offending field, tensor or element and its value.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/ops/router/router.h"
#include "gtest/gtest.h"
#include "tests/engine/ops/router/router_test_util.h"

namespace moetrain::router_test {
namespace {

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
  // A non-finite error, so that the trainer can fail or skip the step rather than the job.
  const absl::Status status = RouterForward(p.config, ArgsOf(p), &out);
  EXPECT_TRUE(IsNonFiniteError(status)) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_NE(std::string(status.message()).find("logits[201, 6] = nan is not finite"),
            std::string::npos)
      << status;
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

// The sequence aux loss counts each sequence's pairs by their experts: a stale or foreign
// forward's expert id is refused before it indexes the counts.
TEST(RouterTest, AuxLossChecksTheChosenExperts) {
  const MoeConfig config = With(Softmax(8, 2), [](MoeConfig& c) {
    c.aux_loss = AuxLossType::kSequence;
    c.aux_loss_coeff = 0.01f;
  });
  Problem p = MakeProblem(config, 4, 2, 1);
  RouterOutput out;
  ASSERT_TRUE(RouterForward(config, ArgsOf(p), &out).ok());
  out.topk_experts.data<int32_t>()[5] = -3;
  ExpectError(ops::RouterAuxLoss(Cpu(), config, ArgsOf(p), &out),
              "forward.topk_experts[2, 1] = -3 is not an expert in [0, 8)");
}

}  // namespace
}  // namespace moetrain::router_test
