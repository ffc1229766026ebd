// Training throughput of a small MoE transformer, and its model FLOPs utilisation (MFU): model
// FLOPs per token (6 × active matmul parameters + causal attention) × tokens/s, over the dense
// bf16 GEMM rate of this machine measured in the same run (a 2048³ GEMM).
//
//   train_bench [--json] [--steps N (default 4)] [--dtype bf16|f32]
//
// Model: d=512, 8 layers (the first dense), 8 heads, seq 512, E=16, k=2, expert_ffn_dim=512,
// vocab 8192; 4 sequences per step, synthetic data. The first step (warm-up) is not timed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/model/transformer.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

double DenseGemmGflops(DType dtype) {
  absl::StatusOr<double> flops = ops::MeasureGemmFlops(ExecContext::Cpu(), dtype, 2048, 3);
  if (!flops.ok()) std::exit(1);
  return *flops / 1e9;
}

class Timer : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  std::vector<StepReport> reports;
};

int Main(int argc, char** argv) {
  bool json = false;
  int64_t steps = 4;
  DType dtype = DType::kBF16;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::max(2, std::atoi(argv[++i]));
    } else if (arg == "--dtype" && i + 1 < argc) {
      dtype = std::string(argv[++i]) == "f32" ? DType::kF32 : DType::kBF16;
    } else {
      std::fprintf(stderr, "usage: train_bench [--json] [--steps N] [--dtype bf16|f32]\n");
      return 2;
    }
  }
  TrainerConfig c;
  c.job_id = "train_bench";
  c.model.vocab_size = 8192;
  c.model.hidden_size = 512;
  c.model.num_layers = 8;
  c.model.num_heads = 8;
  c.model.num_kv_heads = 8;
  c.model.ffn_dim = 2048;
  c.model.first_dense_layers = 1;
  c.model.max_seq_len = 512;
  c.model.moe.num_experts = 16;
  c.model.moe.top_k = 2;
  c.model.moe.expert_ffn_dim = 512;
  c.data.format = DataConfig::Format::kSynthetic;
  c.data.vocab_size = c.model.vocab_size;
  c.data.synthetic_vocab_size = c.model.vocab_size;
  c.data.seq_len = 512;
  c.data.batch_size = 4;
  c.compute_dtype = dtype;
  c.steps = steps;
  c.schedule.total_steps = steps;
  c.log_every = 1;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(c);
  if (!trainer.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "train_bench: %lld steps of %lld tokens (%s)...\n",
               static_cast<long long>(steps),
               static_cast<long long>(c.data.batch_size * c.data.seq_len),
               std::string(DTypeName(dtype)).c_str());
  Timer timer;
  const absl::Status status = (*trainer)->Run(&timer);
  if (!status.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  // Median tokens/s of the timed steps (all but the first).
  std::vector<double> rates;
  for (size_t i = 1; i < timer.reports.size(); ++i) rates.push_back(timer.reports[i].tokens_per_s);
  std::sort(rates.begin(), rates.end());
  const double tokens_per_s = rates[rates.size() / 2];
  const double flops_per_token = TrainingFlopsPerToken(c.model, c.data.seq_len);
  const double dense = DenseGemmGflops(DType::kBF16);
  const double mfu = flops_per_token * tokens_per_s / (dense * 1e9);
  nlohmann::json result = {{"dtype", std::string(DTypeName(dtype))},
                           {"tokens_per_s", tokens_per_s},
                           {"model_flops_per_token", flops_per_token},
                           {"dense_gemm_gflops_bf16", dense},
                           {"mfu", mfu},
                           {"final_loss", timer.reports.back().loss}};
  if (json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("%.0f tokens/s, %.2f GFLOP/token, dense bf16 %.1f GFLOP/s, MFU %.3f\n",
                tokens_per_s, flops_per_token / 1e9, dense, mfu);
  }
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
