// Causal attention benchmark: forward and backward time of CausalAttentionForward/Backward (f32,
// CPU) for B = 1..4, S = 512, H = 8, Hkv = 8 and 2, Dh = 64.
//
//   attention_bench [--reps N (default 20)]
//
// Prints one JSON object per configuration: {"config": {...}, "fwd_ms", "bwd_ms", "gflops"}.
// FLOPs count the causal half of the two products: 2·B·H·S²·Dh forward (QKᵀ and PV, 4·B·H·S²·Dh
// halved), 2.5× that backward; gflops is both over the time of both. Times are medians of --reps
// runs after one warm-up run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "bench/bench_flags.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

double MedianSeconds(int reps, const std::function<absl::Status()>& fn) {
  absl::Status status = fn();
  std::vector<double> times;
  for (int i = 0; i < reps && status.ok(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    status = fn();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (!status.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

Tensor RandomTensor(std::initializer_list<int64_t> shape, uint32_t stream) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  Rng(/*seed=*/1234, /*step=*/0, /*rank=*/0, stream).FillNormal(t.data<float>(), t.numel(), 0, 1);
  return t;
}

nlohmann::json RunConfig(const ops::AttentionShape& shape, int reps) {
  const ExecContext ctx = ExecContext::Cpu();
  const int64_t rows = shape.batch * shape.seq_len;
  const int64_t q_cols = shape.num_heads * shape.head_dim;
  const int64_t kv_cols = shape.num_kv_heads * shape.head_dim;
  Tensor q = RandomTensor({rows, q_cols}, 1), k = RandomTensor({rows, kv_cols}, 2);
  Tensor v = RandomTensor({rows, kv_cols}, 3), d_out = RandomTensor({rows, q_cols}, 4);
  Tensor out = Tensor::Empty(DType::kF32, {rows, q_cols});
  Tensor lse = Tensor::Empty(DType::kF32, {shape.batch, shape.num_heads, shape.seq_len});
  Tensor d_q = Tensor::Empty(DType::kF32, {rows, q_cols});
  Tensor d_k = Tensor::Empty(DType::kF32, {rows, kv_cols});
  Tensor d_v = Tensor::Empty(DType::kF32, {rows, kv_cols});
  const double fwd = MedianSeconds(
      reps, [&] { return ops::CausalAttentionForward(ctx, shape, q, k, v, out, lse); });
  const double bwd = MedianSeconds(reps, [&] {
    return ops::CausalAttentionBackward(ctx, shape, q, k, v, out, lse, d_out, d_q, d_k, d_v);
  });
  const double fwd_flops =
      2.0 * shape.batch * shape.num_heads * shape.seq_len * shape.seq_len * shape.head_dim;
  const double total_flops = 3.5 * fwd_flops;
  return {{"config",
           {{"B", shape.batch},
            {"S", shape.seq_len},
            {"H", shape.num_heads},
            {"Hkv", shape.num_kv_heads},
            {"Dh", shape.head_dim}}},
          {"fwd_ms", fwd * 1e3},
          {"bwd_ms", bwd * 1e3},
          {"gflops", total_flops / (fwd + bwd) / 1e9}};
}

int Main(int argc, char** argv) {
  int reps = 20;
  CLI::App app{"attention_bench: causal attention forward and backward (f32, CPU)"};
  app.add_option("--reps", reps, "timed runs per measurement, after one warm-up; the median counts")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  for (int64_t kv_heads : {8, 2}) {
    for (int64_t batch = 1; batch <= 4; ++batch) {
      const ops::AttentionShape shape = {
          .batch = batch, .seq_len = 512, .num_heads = 8, .num_kv_heads = kv_heads, .head_dim = 64};
      std::printf("%s\n", RunConfig(shape, reps).dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
