// The op throughputs `moetrain plan` builds a step from (engine/plan/plan.h), measured on this CPU
// at the shapes of a train_bench config, each as a fraction of a peak measured in the same run:
//
//   calibrate_bench [--config default|d2048] [--reps N] [--json]
//
// peaks      dense bf16 GEMM of 2048³ (ops::MeasureGemmFlops, as train_bench's MFU denominator);
//            memory bandwidth of a 256 MiB copy (bytes read + written / time).
// dense_gemm every matmul of one step's tokens but the routed experts' and the router's: the
//            attention projections, the dense FFNs, the shared experts and the LM head (in its
//            chunks), each forward, backward-data and backward-weight through fp8/linear.h's
//            Linear in the compute dtype, as the model runs them.
// grouped_gemm  the MoE layers: MoeLayer forward + backward (routing, permutation, the routed
//            experts' grouped GEMMs, unpermutation; no shared experts), over the routed experts'
//            FLOPs; so the routing and permutation are charged to this class.
// attention  the causal attention core forward + backward (f32, as the model runs it).
// memory_bound  the optimizer phase over 16 M parameters (grad norm, clip, AdamW, the compute
//            copy, zeroing): OptimizerBytes (plan.h; 30 B a parameter) / time, over the copy
//            bandwidth.
// Efficiency = FLOPs as `moetrain plan` counts them (SplitTrainingFlops) / time / peak.
// scripts/calibrate-plan.sh stores this JSON with train_bench's and dispatch_bench's
// (engine/plan/calibration.h); --check FILE compares the plan's predictions with such a file.
//
// Exit status: 0 done; 1 an error; 2 bad usage.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/train_configs.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/fp8/linear.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/attention/attention.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/loss/lm_head_loss.h"
#include "engine/plan/calibration.h"
#include "engine/plan/plan.h"
#include "engine/train/optimizer.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

void Die(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "calibrate_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

// Median seconds of `reps` runs after one warm-up.
double MedianSeconds(int reps, const std::function<absl::Status()>& fn) {
  Die(fn(), "warm-up");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Die(fn(), "run");
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Tensor Random(DType dtype, std::initializer_list<int64_t> shape, float stddev, uint32_t stream) {
  Tensor f32 = Tensor::Empty(DType::kF32, shape);
  Rng(/*seed=*/7, /*step=*/0, /*rank=*/0, stream)
      .FillNormal(f32.data<float>(), f32.numel(), 0, stddev);
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::Empty(dtype, shape);
  Die(ops::ConvertTensor(ExecContext::Cpu(), f32.view(), out.view()), "convert");
  return out;
}

// One matmul of the model: `rows` rows of width `in` to width `out`, `count` times a step.
struct LinearShape {
  std::string name;
  int64_t rows, in, out;
  double count;
};

// Seconds of forward + backward-data + backward-weight of one LinearShape, once.
double LinearSeconds(const LinearShape& s, DType act, int reps) {
  const ExecContext ctx = ExecContext::Cpu();
  Tensor x = Random(act, {s.rows, s.in}, 1, 1), w = Random(act, {s.out, s.in}, 0.02f, 2);
  Tensor dy = Random(act, {s.rows, s.out}, 1, 3);
  Tensor y = Tensor::Empty(DType::kF32, {s.rows, s.out});
  Tensor dx = Tensor::Empty(DType::kF32, {s.rows, s.in});
  Tensor dw = Tensor::Zeros(DType::kF32, {s.out, s.in});
  const Linear linear(ctx);
  return MedianSeconds(reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(linear.Forward(x, w, y));
    MOETRAIN_RETURN_IF_ERROR(linear.BackwardData(dy, w, dx));
    return linear.BackwardWeight(dy, x, dw);
  });
}

// The matmuls of one step of `c` that SplitTrainingFlops counts as dense, but the router's (its
// E·D is timed with the MoE layer). GQA models only.
std::vector<LinearShape> DenseShapes(const TrainerConfig& c) {
  const ModelConfig& m = c.model;
  const int64_t t = c.data.batch_size * c.data.seq_len, d = m.hidden_size;
  const int64_t q = m.num_heads * m.resolved_head_dim(),
                kv = m.num_kv_heads * m.resolved_head_dim();
  const double layers = static_cast<double>(m.num_layers);
  const double moe_layers = static_cast<double>(m.num_layers - m.first_dense_layers);
  const int64_t shared = m.moe.num_shared_experts * m.moe.expert_ffn_dim;
  const int64_t lm_rows = ops::DefaultLmHeadChunkTokens(t, m.vocab_size);
  std::vector<LinearShape> shapes = {
      {"q_proj", t, d, q, layers},
      {"k_proj", t, d, kv, layers},
      {"v_proj", t, d, kv, layers},
      {"o_proj", t, q, d, layers},
      {"lm_head", lm_rows, d, m.vocab_size, static_cast<double>(t) / static_cast<double>(lm_rows)},
  };
  if (m.first_dense_layers > 0) {
    const double dense = static_cast<double>(m.first_dense_layers);
    shapes.push_back({"ffn_gate_up", t, d, 2 * m.ffn_dim, dense});
    shapes.push_back({"ffn_down", t, m.ffn_dim, d, dense});
  }
  if (shared > 0) {
    shapes.push_back({"shared_gate_up", t, d, 2 * shared, moe_layers});
    shapes.push_back({"shared_down", t, shared, d, moe_layers});
  }
  return shapes;
}

// Seconds of one MoE layer's forward + backward over the step's tokens, without shared experts.
double MoeLayerSeconds(const TrainerConfig& c, int reps) {
  MoeConfig moe = c.model.moe;
  moe.num_shared_experts = 0;
  const int64_t t = c.data.batch_size * c.data.seq_len, d = c.model.hidden_size;
  const int64_t e = moe.num_experts, f = moe.expert_ffn_dim;
  const DType act = c.compute_dtype;
  absl::StatusOr<MoeLayer> layer = MoeLayer::Create(moe, d, act);
  Die(layer.status(), "MoE layer");
  Tensor router = Random(DType::kF32, {e, d}, 0.02f, 10), bias = Tensor::Zeros(DType::kF32, {e});
  Tensor gate_up = Random(act, {e, 2 * f, d}, 0.02f, 11), down = Random(act, {e, d, f}, 0.02f, 12);
  Tensor x = Random(act, {t, d}, 1, 13), d_out = Random(act, {t, d}, 1, 14);
  Tensor out = Tensor::Empty(act, {t, d}), d_x = Tensor::Empty(act, {t, d});
  Tensor g_router = Tensor::Zeros(DType::kF32, {e, d});
  Tensor g_gate_up = Tensor::Zeros(DType::kF32, {e, 2 * f, d});
  Tensor g_down = Tensor::Zeros(DType::kF32, {e, d, f});
  const MoeWeights weights = {router, bias, gate_up, down, {}, {}};
  MoeStats stats;
  return MedianSeconds(reps, [&]() -> absl::Status {
    MoeGrads grads = {g_router, g_gate_up, g_down, {}, {}};
    MOETRAIN_RETURN_IF_ERROR(layer->Forward(weights, x, 0, out, &stats));
    return layer->Backward(weights, d_out, d_x, &grads);
  });
}

// Seconds of the attention core's forward + backward over the step's sequences, one layer.
double AttentionSeconds(const TrainerConfig& c, int reps) {
  const ModelConfig& m = c.model;
  const ops::AttentionShape shape = {.batch = c.data.batch_size,
                                     .seq_len = c.data.seq_len,
                                     .num_heads = m.num_heads,
                                     .num_kv_heads = m.num_kv_heads,
                                     .head_dim = m.resolved_head_dim()};
  const int64_t t = shape.batch * shape.seq_len, q = m.num_heads * shape.head_dim;
  const int64_t kv = m.num_kv_heads * shape.head_dim;
  Tensor qt = Random(DType::kF32, {t, q}, 1, 20), k = Random(DType::kF32, {t, kv}, 1, 21);
  Tensor v = Random(DType::kF32, {t, kv}, 1, 22), d_out = Random(DType::kF32, {t, q}, 1, 23);
  Tensor out = Tensor::Empty(DType::kF32, {t, q});
  Tensor lse = Tensor::Empty(DType::kF32, {shape.batch, shape.num_heads, shape.seq_len});
  Tensor d_q = Tensor::Empty(DType::kF32, {t, q}), d_k = Tensor::Empty(DType::kF32, {t, kv});
  Tensor d_v = Tensor::Empty(DType::kF32, {t, kv});
  const ExecContext ctx = ExecContext::Cpu();
  return MedianSeconds(reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(ops::CausalAttentionForward(ctx, shape, qt, k, v, out, lse));
    return ops::CausalAttentionBackward(ctx, shape, qt, k, v, out, lse, d_out, d_q, d_k, d_v);
  });
}

// Bytes per second of a copy of 256 MiB: read and written.
double CopyBandwidth(int reps) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  const double seconds = MedianSeconds(reps, [&] {
    std::memcpy(b.data(), a.data(), bytes);
    return absl::OkStatus();
  });
  return 2.0 * static_cast<double>(bytes) / seconds;
}

// Seconds of the trainer's optimizer phase over `n` parameters, in one tensor.
double OptimizerSeconds(int64_t n, DType act, int reps) {
  const ExecContext ctx = ExecContext::Cpu();
  Tensor value = Random(DType::kF32, {n}, 0.02f, 30), grad = Random(DType::kF32, {n}, 1e-3f, 31);
  Tensor copy = Tensor::Empty(act, {n});
  absl::StatusOr<AdamW> adamw = AdamW::Create(ctx, {}, {{"w", value.view(), grad.view()}});
  Die(adamw.status(), "AdamW");
  const std::vector<Parameter> params = {{"w", value.view(), grad.view()}};
  return MedianSeconds(reps, [&]() -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(const double norm, GlobalGradNorm(ctx, params));
    MOETRAIN_RETURN_IF_ERROR(ClipGradsToNorm(ctx, params, 1.0, norm));
    MOETRAIN_RETURN_IF_ERROR(adamw->Step(1e-4f));
    if (act != DType::kF32) MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx, value, copy));
    return ZeroGrads(ctx, params);
  });
}

// --check: the calibration file's figures against the plan's predictions.
int Check(const std::string& path) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::vector<CalibrationCheck>> checks = CheckCalibration(text);
  Die(checks.status(), path.c_str());
  bool ok = true;
  for (const CalibrationCheck& c : *checks) {
    std::printf("%-40s predicted %10.2f  measured %10.2f  error %+6.1f%% (within %.0f%%: %s)\n",
                c.name.c_str(), c.predicted, c.measured, 100 * c.error(), 100 * c.tolerance,
                c.ok() ? "yes" : "NO");
    ok = ok && c.ok();
  }
  return ok ? 0 : 1;
}

int Main(int argc, char** argv) {
  bool json = false;
  int reps = 3;
  std::string config_name = "default", dtype_name = "bf16";
  CLI::App app{"calibrate_bench: the op throughputs moetrain plan models a step from, on this CPU"};
  app.add_flag("--json", json, "print one JSON object instead of a summary");
  app.add_option("--config", config_name, "the train_bench config whose shapes are measured")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "d2048"}));
  app.add_option("--dtype", dtype_name, "compute dtype, as train_bench's --dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--reps", reps, "timed runs per measurement, after one warm-up; the median counts")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  std::string check_path;
  app.add_option("--check", check_path,
                 "measure nothing: read a calibration file (scripts/calibrate-plan.sh) and print "
                 "moetrain plan's predictions of its train_bench and dispatch_bench figures")
      ->check(CLI::ExistingFile);
  app.footer(
      "Exit status: 0 done (--check: every prediction within its tolerance); 1 an error, or a "
      "prediction outside its tolerance; 2 bad usage.");
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  if (!check_path.empty()) return Check(check_path);

  TrainerConfig c = config_name == "d2048" ? D2048Config() : DefaultConfig();
  c.compute_dtype = dtype_name == "f32" ? DType::kF32 : DType::kBF16;
  const ModelConfig& m = c.model;
  const double tokens = static_cast<double>(c.data.batch_size * c.data.seq_len);
  const FlopsSplit split = SplitTrainingFlops(m, c.data.seq_len);
  std::fprintf(stderr, "calibrate_bench: config %s, %.0f tokens, %s...\n", config_name.c_str(),
               tokens, dtype_name.c_str());

  absl::StatusOr<double> peak = ops::MeasureGemmFlops(ExecContext::Cpu(), DType::kBF16, 2048, reps);
  Die(peak.status(), "dense GEMM");
  const double bandwidth = CopyBandwidth(reps);

  nlohmann::json shapes = nlohmann::json::array();
  double dense_s = 0, dense_flops = 0;
  for (const LinearShape& s : DenseShapes(c)) {
    const double seconds = LinearSeconds(s, c.compute_dtype, reps) * s.count;
    const double flops = 6.0 * static_cast<double>(s.rows * s.in * s.out) * s.count;
    dense_s += seconds;
    dense_flops += flops;
    shapes.push_back({{"name", s.name},
                      {"rows", s.rows},
                      {"in", s.in},
                      {"out", s.out},
                      {"count", s.count},
                      {"seconds", seconds},
                      {"gflops", flops / seconds / 1e9}});
  }
  // The router's E·D per MoE block is timed inside the layer; as FLOPs it is the dense class's.
  const double moe_blocks = static_cast<double>(m.num_layers - m.first_dense_layers);
  const double experts_s = MoeLayerSeconds(c, reps) * moe_blocks;
  const double attention_s = AttentionSeconds(c, reps) * static_cast<double>(m.num_layers);
  const int64_t optimizer_n = int64_t{16} << 20;
  const double optimizer_s = OptimizerSeconds(optimizer_n, c.compute_dtype, reps);

  const double dense_eff = dense_flops / dense_s / *peak;
  const double experts_eff = tokens * split.routed_experts / experts_s / *peak;
  const double attention_eff = tokens * split.attention_core / attention_s / *peak;
  const double optimizer_rate = OptimizerBytes(optimizer_n, optimizer_n, 4) / optimizer_s;
  const double memory_eff = std::min(1.0, optimizer_rate / bandwidth);
  auto op = [](double seconds, double flops, double efficiency) {
    return nlohmann::json{
        {"seconds", seconds}, {"gflops", flops / seconds / 1e9}, {"efficiency", efficiency}};
  };
  nlohmann::json result = {
      {"config", config_name},
      {"dtype", dtype_name},
      {"tokens", tokens},
      {"peak",
       {{"dense_bf16_gflops", *peak / 1e9}, {"memory_bandwidth_gb_per_s", bandwidth / 1e9}}},
      {"dense_gemm", op(dense_s, dense_flops, dense_eff)},
      {"dense_gemm_shapes", shapes},
      {"grouped_gemm", op(experts_s, tokens * split.routed_experts, experts_eff)},
      {"attention", op(attention_s, tokens * split.attention_core, attention_eff)},
      {"memory_bound",
       {{"parameters", optimizer_n},
        {"seconds", optimizer_s},
        {"gb_per_s", optimizer_rate / 1e9},
        {"efficiency", memory_eff}}},
      {"efficiency",
       {{"dense_gemm", dense_eff},
        {"grouped_gemm", experts_eff},
        {"attention", attention_eff},
        {"memory_bound", memory_eff}}},
  };
  if (json) {
    std::printf("%s\n", result.dump().c_str());
    return 0;
  }
  std::printf("peak: dense bf16 GEMM %.1f GFLOP/s, copy %.1f GB/s\n", *peak / 1e9, bandwidth / 1e9);
  for (const char* name : {"dense_gemm", "grouped_gemm", "attention"}) {
    std::printf("%-13s %8.3f s  %7.1f GFLOP/s  efficiency %.3f\n", name,
                result[name]["seconds"].get<double>(), result[name]["gflops"].get<double>(),
                result[name]["efficiency"].get<double>());
  }
  std::printf("%-13s %8.3f s  %7.1f GB/s      efficiency %.3f\n", "memory_bound", optimizer_s,
              optimizer_rate / 1e9, memory_eff);
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
