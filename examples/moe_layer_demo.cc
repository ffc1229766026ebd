// The MoE layer learning on its own: a student layer is trained with Adam to reproduce a randomly
// initialised teacher layer of the same shape, from fresh random tokens every step. The loss
// falling towards zero shows forward and backward working together through the router,
// permutation, grouped GEMMs, SwiGLU and combine.
//
//   moe_layer_demo [--steps N (default 300)] [--dtype f32|bf16] [--score softmax|sigmoid]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "engine/backend/device_query.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/moe/moe_layer.h"

namespace moetrain {
namespace {

constexpr int64_t kTokens = 512, kHidden = 64;

// f32 master parameters, their compute-dtype copies, gradients and Adam moments.
struct Parameters {
  std::vector<Tensor> master, compute, grad, m, v;

  TensorView Add(std::initializer_list<int64_t> shape, DType compute_dtype, float stddev,
                 uint32_t stream) {
    master.push_back(Tensor::Empty(DType::kF32, shape));
    Rng(7, 0, 0, stream)
        .FillNormal(master.back().data<float>(), master.back().numel(), 0.0f, stddev);
    compute.push_back(Tensor::Empty(compute_dtype, shape));
    grad.push_back(Tensor::Zeros(DType::kF32, shape));
    m.push_back(Tensor::Zeros(DType::kF32, shape));
    v.push_back(Tensor::Zeros(DType::kF32, shape));
    return compute.back();
  }

  void Sync() {
    for (size_t i = 0; i < master.size(); ++i) {
      if (compute[i].dtype() == DType::kF32) {
        std::memcpy(compute[i].data<float>(), master[i].data<float>(), master[i].numel() * 4);
      } else {
        ConvertF32ToBF16(master[i].data<float>(), compute[i].data<BF16>(), master[i].numel());
      }
    }
  }

  void AdamStep(int step, float lr) {
    constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
    const float c1 = 1.0f - std::pow(kBeta1, step), c2 = 1.0f - std::pow(kBeta2, step);
    for (size_t i = 0; i < master.size(); ++i) {
      float *p = master[i].data<float>(), *g = grad[i].data<float>();
      float *mi = m[i].data<float>(), *vi = v[i].data<float>();
      for (int64_t j = 0; j < master[i].numel(); ++j) {
        mi[j] = kBeta1 * mi[j] + (1 - kBeta1) * g[j];
        vi[j] = kBeta2 * vi[j] + (1 - kBeta2) * g[j] * g[j];
        p[j] -= lr * (mi[j] / c1) / (std::sqrt(vi[j] / c2) + kEps);
        g[j] = 0.0f;
      }
    }
    Sync();
  }
};

MoeWeights MakeLayerWeights(const MoeConfig& config, DType dtype, Parameters& params,
                            uint32_t stream, MoeGrads* grads) {
  const int64_t e = config.num_experts, f = config.expert_ffn_dim, d = kHidden;
  MoeWeights w;
  w.router = params.Add({e, d}, DType::kF32, 1.0f / std::sqrt(float(d)), stream);
  w.expert_gate_up = params.Add({e, 2 * f, d}, dtype, 1.0f / std::sqrt(float(d)), stream + 1);
  w.expert_down = params.Add({e, d, f}, dtype, 1.0f / std::sqrt(float(f)), stream + 2);
  params.Sync();
  if (grads != nullptr) {
    const size_t n = params.grad.size();
    *grads = {params.grad[n - 3], params.grad[n - 2], params.grad[n - 1], {}, {}};
  }
  return w;
}

absl::Status Run(int steps, DType dtype, ScoreFunction score) {
  std::printf("moetrain MoE layer demo — %s\n", DescribeDevices(QueryDevices()).c_str());
  MoeConfig config;
  config.num_experts = 8;
  config.top_k = 2;
  config.expert_ffn_dim = 96;
  config.score_function = score;
  config.aux_loss = AuxLossType::kSwitch;
  config.aux_loss_coeff = 1e-2f;
  std::printf("student learns a random teacher: T=%ld D=%ld E=%ld k=%ld F=%ld, %s, %s routing\n",
              kTokens, kHidden, config.num_experts, config.top_k, config.expert_ffn_dim,
              std::string(DTypeName(dtype)).c_str(),
              score == ScoreFunction::kSoftmax ? "softmax" : "sigmoid");

  Parameters teacher_params, student_params;
  MoeWeights teacher = MakeLayerWeights(config, dtype, teacher_params, 100, nullptr);
  MoeGrads grads;
  MoeWeights student = MakeLayerWeights(config, dtype, student_params, 200, &grads);
  MOETRAIN_ASSIGN_OR_RETURN(MoeLayer teacher_layer, MoeLayer::Create(config, kHidden, dtype));
  MOETRAIN_ASSIGN_OR_RETURN(MoeLayer student_layer, MoeLayer::Create(config, kHidden, dtype));

  Tensor x_f32 = Tensor::Empty(DType::kF32, {kTokens, kHidden});
  Tensor x = Tensor::Empty(dtype, {kTokens, kHidden});
  Tensor target = Tensor::Empty(dtype, {kTokens, kHidden});
  Tensor out = Tensor::Empty(dtype, {kTokens, kHidden});
  Tensor out_f32 = Tensor::Empty(DType::kF32, {kTokens, kHidden});
  Tensor target_f32 = Tensor::Empty(DType::kF32, {kTokens, kHidden});
  Tensor d_out = Tensor::Empty(dtype, {kTokens, kHidden});
  Tensor d_out_f32 = Tensor::Empty(DType::kF32, {kTokens, kHidden});
  Tensor d_x = Tensor::Empty(dtype, {kTokens, kHidden});
  auto to_f32 = [&](const Tensor& src, Tensor& dst) {
    if (dtype == DType::kF32) {
      std::memcpy(dst.data<float>(), src.data<float>(), src.numel() * 4);
    } else {
      ConvertBF16ToF32(src.data<BF16>(), dst.data<float>(), src.numel());
    }
  };

  double first_loss = 0, loss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step) {
    Rng(11, step, 0, 0).FillNormal(x_f32.data<float>(), x_f32.numel(), 0.0f, 1.0f);
    if (dtype == DType::kF32) {
      std::memcpy(x.data<float>(), x_f32.data<float>(), x.numel() * 4);
    } else {
      ConvertF32ToBF16(x_f32.data<float>(), x.data<BF16>(), x.numel());
    }
    MOETRAIN_RETURN_IF_ERROR(teacher_layer.Forward(teacher, x, 0, target, nullptr));
    MoeStats stats;
    MOETRAIN_RETURN_IF_ERROR(student_layer.Forward(student, x, 0, out, &stats));

    // loss = mean((out − target)²); d_out = 2·(out − target)/n.
    to_f32(out, out_f32);
    to_f32(target, target_f32);
    loss = 0;
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      const float diff = out_f32.data<float>()[i] - target_f32.data<float>()[i];
      loss += double(diff) * diff / n;
      d_out_f32.data<float>()[i] = 2.0f * diff / n;
    }
    if (dtype == DType::kF32) {
      std::memcpy(d_out.data<float>(), d_out_f32.data<float>(), n * 4);
    } else {
      ConvertF32ToBF16(d_out_f32.data<float>(), d_out.data<BF16>(), n);
    }
    MOETRAIN_RETURN_IF_ERROR(student_layer.Backward(student, d_out, d_x, &grads));
    student_params.AdamStep(step, 3e-3f);
    if (step == 1) first_loss = loss;

    if (step == 1 || step % 25 == 0 || step == steps) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("step %4d  mse %.5f  aux %.5f  load max/mean %.2f  tokens/expert", step, loss,
                  stats.aux_loss, stats.max_mean_load_ratio);
      for (int64_t c : stats.tokens_per_expert) std::printf(" %ld", c);
      std::printf("  (%.0f tokens/s)\n", step * kTokens / seconds);
    }
  }
  std::printf("mse fell from %.5f to %.5f (%.1f%% of the start)\n", first_loss, loss,
              100.0 * loss / first_loss);
  return absl::OkStatus();
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) {
  int steps = 300;
  std::string dtype_name = "f32", score_name = "softmax";
  CLI::App app{"moe_layer_demo: an MoE layer trained with Adam to imitate a random teacher layer"};
  app.add_option("--steps", steps, "training steps, each on fresh random tokens")
      ->capture_default_str()
      ->check(moetrain::bench::AtLeast(1));
  app.add_option("--dtype", dtype_name, "compute dtype of both layers (the masters stay f32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--score", score_name, "the router's score function")
      ->capture_default_str()
      ->check(CLI::IsMember({"softmax", "sigmoid"}));
  if (const std::optional<int> exit_code = moetrain::bench::ParseFlags(app, argc, argv)) {
    return *exit_code;
  }
  const moetrain::DType dtype =
      dtype_name == "bf16" ? moetrain::DType::kBF16 : moetrain::DType::kF32;
  const moetrain::ScoreFunction score = score_name == "sigmoid" ? moetrain::ScoreFunction::kSigmoid
                                                                : moetrain::ScoreFunction::kSoftmax;
  absl::Status status = moetrain::Run(steps, dtype, score);
  if (!status.ok()) {
    std::fprintf(stderr, "moe_layer_demo: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
