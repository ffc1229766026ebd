// MoE layer benchmark: forward+backward time of the whole layer and of its grouped GEMMs,
// against dense GEMMs of the same total work measured in the same run.
//
//   moe_layer_bench [--json] [--config small|medium|dslike] [--dtype f32|bf16] [--reps N]
//
// dense time: the six expert products (gate/up and down, forward, backward data, backward
//   weight) with all T·k rows given to one expert, i.e. plain GEMMs of the same M, N and K sums.
// grouped_gemm_efficiency = dense time / time of the same six grouped GEMMs over the real
//   ragged routing of the layer. layer_efficiency = dense time / layer forward+backward time.
// Every time is the median of --reps runs after one warm-up run. Progress goes to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/device_query.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/router/router.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

struct BenchConfig {
  std::string name;
  int64_t tokens, hidden;
  MoeConfig moe;
};

std::vector<BenchConfig> Configs() {
  std::vector<BenchConfig> configs;
  MoeConfig small;
  small.num_experts = 8;
  small.top_k = 2;
  small.expert_ffn_dim = 1024;
  configs.push_back({"small", 4096, 512, small});
  MoeConfig medium;
  medium.num_experts = 16;
  medium.top_k = 2;
  medium.expert_ffn_dim = 2048;
  configs.push_back({"medium", 8192, 1024, medium});
  MoeConfig ds;
  ds.num_experts = 64;
  ds.top_k = 6;
  ds.expert_ffn_dim = 256;
  ds.score_function = ScoreFunction::kSigmoid;
  ds.expert_bias = true;
  ds.num_groups = 8;
  ds.group_top_k = 4;
  configs.push_back({"dslike", 4096, 512, ds});
  return configs;
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of `reps` calls after one warm-up call.
double MedianSeconds(int reps, const std::function<absl::Status()>& fn) {
  absl::Status status = fn();
  std::vector<double> times;
  for (int i = 0; i < reps && status.ok(); ++i) {
    const double start = Seconds();
    status = fn();
    times.push_back(Seconds() - start);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "moe_layer_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Tensor RandomTensor(DType dtype, std::initializer_list<int64_t> shape, float stddev,
                    uint32_t stream) {
  Tensor f32 = Tensor::Empty(DType::kF32, shape);
  Rng(/*seed=*/1234, /*step=*/0, /*rank=*/0, stream)
      .FillNormal(f32.data<float>(), f32.numel(), 0.0f, stddev);
  if (dtype == DType::kF32) return f32;
  Tensor t = Tensor::Empty(dtype, shape);
  ConvertF32ToBF16(f32.data<float>(), t.data<BF16>(), t.numel());
  return t;
}

double DenseGemmGflops(DType dtype, int reps) {
  absl::StatusOr<double> flops = ops::MeasureGemmFlops(ExecContext::Cpu(), dtype, 2048, reps);
  if (!flops.ok()) std::exit(1);
  return *flops / 1e9;
}

// The six expert products of one forward+backward over `offsets`; w_gate_up (G, 2F, D) and
// w_down (G, D, F) hold one matrix per group.
struct ExpertGemms {
  Tensor x, activated, d_out, d_gate_up;  // inputs, compute dtype
  Tensor gate_up, out, d_activated, d_x;  // outputs, f32
  Tensor d_w_gate_up, d_w_down;           // f32
  absl::Status Run(TensorView w_gate_up, TensorView w_down, const std::vector<int64_t>& offsets) {
    const ExecContext ctx = ExecContext::Cpu();
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmForward(ctx, x, w_gate_up, offsets, gate_up));
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmForward(ctx, activated, w_down, offsets, out));
    MOETRAIN_RETURN_IF_ERROR(
        ops::GroupedGemmBackwardData(ctx, d_out, w_down, offsets, d_activated));
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmBackwardWeight(
        ctx, d_out, activated, offsets, d_w_down.view().Slice(0, w_down.dim(0)), false));
    MOETRAIN_RETURN_IF_ERROR(ops::GroupedGemmBackwardData(ctx, d_gate_up, w_gate_up, offsets, d_x));
    return ops::GroupedGemmBackwardWeight(ctx, d_gate_up, x, offsets,
                                          d_w_gate_up.view().Slice(0, w_gate_up.dim(0)), false);
  }
};

nlohmann::json RunConfig(const BenchConfig& bc, DType dtype, int reps) {
  const MoeConfig& moe = bc.moe;
  const int64_t t = bc.tokens, d = bc.hidden, e = moe.num_experts, f = moe.expert_ffn_dim;
  const int64_t rows = t * moe.top_k;
  std::fprintf(stderr, "moe_layer_bench: %s %s (T=%ld D=%ld F=%ld E=%ld k=%ld)...\n",
               bc.name.c_str(), std::string(DTypeName(dtype)).c_str(), t, d, f, e, moe.top_k);

  Tensor router = RandomTensor(DType::kF32, {e, d}, 0.02f, 10);
  Tensor bias = RandomTensor(DType::kF32, {e}, 0.01f, 11);
  Tensor w_gate_up = RandomTensor(dtype, {e, 2 * f, d}, 0.02f, 12);
  Tensor w_down = RandomTensor(dtype, {e, d, f}, 0.02f, 13);
  Tensor x = RandomTensor(dtype, {t, d}, 1.0f, 14);
  Tensor d_out = RandomTensor(dtype, {t, d}, 1.0f, 15);
  Tensor out = Tensor::Empty(dtype, {t, d}), d_x = Tensor::Empty(dtype, {t, d});
  Tensor g_router = Tensor::Zeros(DType::kF32, {e, d});
  Tensor g_gate_up = Tensor::Zeros(DType::kF32, {e, 2 * f, d});
  Tensor g_down = Tensor::Zeros(DType::kF32, {e, d, f});
  MoeGrads grads = {g_router, g_gate_up, g_down, {}, {}};
  MoeWeights weights = {router, moe.expert_bias ? bias.view() : TensorView(), w_gate_up, w_down, {},
                        {}};
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(moe, d, dtype);
  if (!layer.ok()) {
    std::fprintf(stderr, "moe_layer_bench: %s\n", layer.status().ToString().c_str());
    std::exit(1);
  }
  MoeStats stats;
  const double layer_seconds = MedianSeconds(reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(layer->Forward(weights, x, 0, out, &stats));
    return layer->Backward(weights, d_out, d_x, &grads);
  });

  // The routing the layer used, for the grouped GEMMs alone.
  Tensor logits = Tensor::Empty(DType::kF32, {t, e});
  Tensor x_f32 = RandomTensor(DType::kF32, {t, d}, 1.0f, 14);
  const ExecContext ctx = ExecContext::Cpu();
  ops::RouterOutput routing;
  absl::Status status = ops::Gemm(ctx, {.a = x_f32, .b = router, .c = logits, .trans_b = true});
  if (status.ok()) status = ops::RouterForward(ctx, moe, {logits, bias, 0}, &routing);
  if (!status.ok()) {
    std::fprintf(stderr, "moe_layer_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  const int64_t* counts = routing.tokens_per_expert.data<int64_t>();
  const std::vector<int64_t> offsets =
      ops::PermutedExpertOffsets(moe, t, absl::MakeConstSpan(counts, e));
  ExpertGemms gemms = {
      RandomTensor(dtype, {rows, d}, 1.0f, 20),  RandomTensor(dtype, {rows, f}, 1.0f, 21),
      RandomTensor(dtype, {rows, d}, 1.0f, 22),  RandomTensor(dtype, {rows, 2 * f}, 1.0f, 23),
      Tensor::Empty(DType::kF32, {rows, 2 * f}), Tensor::Empty(DType::kF32, {rows, d}),
      Tensor::Empty(DType::kF32, {rows, f}),     Tensor::Empty(DType::kF32, {rows, d}),
      Tensor::Empty(DType::kF32, {e, 2 * f, d}), Tensor::Empty(DType::kF32, {e, d, f})};
  const double grouped_seconds =
      MedianSeconds(reps, [&] { return gemms.Run(w_gate_up, w_down, offsets); });
  const std::vector<int64_t> one_group = {0, rows};
  const double dense_seconds = MedianSeconds(reps, [&] {
    return gemms.Run(w_gate_up.view().Slice(0, 1), w_down.view().Slice(0, 1), one_group);
  });

  const double flops = 18.0 * rows * d * f;
  nlohmann::json result = {
      {"config", bc.name},
      {"dtype", std::string(DTypeName(dtype))},
      {"tokens", t},
      {"fwd_bwd_ms", layer_seconds * 1e3},
      {"tokens_per_s", t / layer_seconds},
      {"expert_gemm_gflops", flops / grouped_seconds / 1e9},
      {"grouped_gemm_ms", grouped_seconds * 1e3},
      {"dense_gemm_ms", dense_seconds * 1e3},
      {"grouped_gemm_efficiency", dense_seconds / grouped_seconds},
      {"layer_efficiency", dense_seconds / layer_seconds},
      {"max_mean_load_ratio", stats.max_mean_load_ratio},
  };
  std::fprintf(stderr, "  %s\n", result.dump().c_str());
  return result;
}

int Main(int argc, char** argv) {
  bool json = false;
  std::string only_config, only_dtype;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "moe_layer_bench: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--json") {
      json = true;
    } else if (arg == "--config") {
      only_config = value("--config");
    } else if (arg == "--dtype") {
      only_dtype = value("--dtype");
    } else if (arg == "--reps") {
      reps = std::max(1, std::atoi(value("--reps").c_str()));
    } else {
      std::fprintf(stderr,
                   "usage: moe_layer_bench [--json] [--config small|medium|dslike] "
                   "[--dtype f32|bf16] [--reps N (default 5)]\n");
      return 2;
    }
  }
  nlohmann::json machine = {{"threads", DefaultThreadPool().num_threads()},
                            {"devices", DescribeDevices(QueryDevices())},
                            {"dense_gemm_gflops",
                             {{"f32", DenseGemmGflops(DType::kF32, reps)},
                              {"bf16", DenseGemmGflops(DType::kBF16, reps)}}}};
  nlohmann::json results = nlohmann::json::array();
  for (const BenchConfig& bc : Configs()) {
    if (!only_config.empty() && bc.name != only_config) continue;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      if (!only_dtype.empty() && DTypeName(dtype) != only_dtype) continue;
      results.push_back(RunConfig(bc, dtype, reps));
    }
  }
  nlohmann::json report = {{"machine", machine}, {"results", results}};
  if (json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    std::printf("%-8s %-5s %10s %12s %10s %8s %8s\n", "config", "dtype", "fwd_bwd_ms", "tokens/s",
                "GFLOP/s", "grouped", "layer");
    for (const auto& r : results) {
      std::printf("%-8s %-5s %10.1f %12.0f %10.1f %8.3f %8.3f\n",
                  r["config"].get<std::string>().c_str(), r["dtype"].get<std::string>().c_str(),
                  r["fwd_bwd_ms"].get<double>(), r["tokens_per_s"].get<double>(),
                  r["expert_gemm_gflops"].get<double>(), r["grouped_gemm_efficiency"].get<double>(),
                  r["layer_efficiency"].get<double>());
    }
  }
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
