// What the optimizer tests share: a model's worth of f32 parameters with random values and
// grads, copies of it, and the checks on tensors and statuses both test files make.
#ifndef MOETRAIN_TESTS_ENGINE_TRAIN_OPTIMIZER_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_TRAIN_OPTIMIZER_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/train/optimizer.h"
#include "gtest/gtest.h"

namespace moetrain::optimizer_test {

inline ExecContext Cpu() { return ExecContext::Cpu(); }

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay;
};

// A model's worth of parameters: owned values and grads, and the Parameter list viewing them.
struct Model {
  std::vector<Tensor> values, grads;  // P × (shape) f32
  std::vector<Parameter> params;
};

inline Model MakeModel(const std::vector<ParamSpec>& specs, uint64_t seed) {
  Model model;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    model.values.push_back(Tensor::Empty(DType::kF32, spec.shape));
    model.grads.push_back(Tensor::Zeros(DType::kF32, spec.shape));
    Rng(seed, 0, 0, static_cast<uint32_t>(i))
        .FillNormal(model.values.back().data<float>(), model.values.back().numel(), 0.0f, 0.5f);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    model.params.push_back({specs[i].name, model.values[i], model.grads[i], specs[i].weight_decay});
  }
  return model;
}

// A copy of `model` with its own memory.
inline Model CloneModel(const Model& model) {
  Model copy;
  for (size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& param = model.params[i];
    copy.values.push_back(Tensor::Empty(DType::kF32, param.value.shape()));
    copy.grads.push_back(Tensor::Empty(DType::kF32, param.value.shape()));
    std::memcpy(copy.values.back().data<float>(), param.value.raw(),
                param.value.numel() * sizeof(float));
    std::memcpy(copy.grads.back().data<float>(), param.grad.raw(),
                param.grad.numel() * sizeof(float));
  }
  for (size_t i = 0; i < model.params.size(); ++i) {
    const Parameter& param = model.params[i];
    copy.params.push_back({param.name, copy.values[i], copy.grads[i], param.weight_decay});
  }
  return copy;
}

// Fresh grads for step `step`: parameter i ~ N(0, scale_i²), scales spread over four decades so
// that some elements sit near eps and others far above it.
inline void FillGrads(Model* model, uint64_t seed, uint64_t step) {
  for (size_t i = 0; i < model->grads.size(); ++i) {
    const float scale = std::pow(10.0f, -static_cast<float>(i % 4));
    Rng(seed, step + 1, 1, static_cast<uint32_t>(i))
        .FillNormal(model->grads[i].data<float>(), model->grads[i].numel(), 0.0f, scale);
  }
}

inline std::vector<float> Contents(const TensorView& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

inline bool BitEqual(const TensorView& a, const TensorView& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.numel() * sizeof(float)) == 0;
}

// The status is InvalidArgument and its message contains `text`.
inline void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(text), std::string::npos)
      << "message: " << status.message() << "\nexpected to contain: " << text;
}

// Ragged sizes, a scalar, an empty tensor, and one large enough to be split across threads and
// across the AdamW tiles and norm blocks.
inline std::vector<ParamSpec> MixedSpecs() {
  return {
      {"model.embed_tokens.weight", {37, 19}, true},
      {"model.layers.0.input_layernorm.weight", {19}, false},
      {"model.layers.0.mlp.experts.0.up_proj.weight", {100003}, true},
      {"model.layers.0.mlp.gate.weight", {3, 1, 7}, true},
      {"model.layers.0.mlp.experts.1.up_proj.weight", {0, 5}, true},
      {"scalar.bias", {1}, false},
      {"model.norm.weight", {513}, false},
  };
}

}  // namespace moetrain::optimizer_test

#endif  // MOETRAIN_TESTS_ENGINE_TRAIN_OPTIMIZER_TEST_UTIL_H_
