// MoeLayer's errors: Create with an invalid config, hidden size or dtype, Backward before any
// Forward, and Forward and Backward with a tensor of the wrong shape or dtype, each of which must
// name the offending argument.
#include <cctype>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_config.h"
#include "engine/moe/moe_layer.h"
#include "gtest/gtest.h"
#include "tests/engine/moe/moe_test_util.h"

namespace moetrain::moe_test {
namespace {

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
    ASSERT_OK(layer->Forward(in.weights(), in.x, 0, out, nullptr));
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
}  // namespace moetrain::moe_test
