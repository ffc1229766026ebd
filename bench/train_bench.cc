// Training throughput of an MoE transformer, and its model FLOPs utilisation (MFU): model FLOPs
// per token (6 × active matmul parameters + causal attention) × tokens/s, over the dense bf16
// GEMM rate of the same device measured in the same run (2048³ on the CPU, 8192³ on a GPU).
//
//   train_bench [--json] [--steps N (default 4)] [--dtype bf16|f32] [--device cpu|cuda|cuda:N]
//               [--config default|d2048] [--layers L] [--hidden D] [--batch B]
//               [--ranks N [--ep E]] [--sharding none|optimizer|gradients]
//               [--moment-dtype f32|bf16]
//               [--recompute none|selective|full] [--grad-reduce-dtype f32|bf16] (--help: all)
//
// Configs (synthetic data; the first step, a warm-up, is not timed):
//   default  d=512, 8 layers (the first dense, ffn 2048), 8 heads, seq 512, E=16, k=2,
//            expert_ffn_dim=512, vocab 8192; 4 sequences per step.
//   d2048    d=2048, 8 layers (the first dense, ffn 5632), 16 heads of 128 (MHA), seq 2048,
//            E=32, k=4, expert_ffn_dim=1408, 2 shared experts, vocab 32768; 8 sequences per step
//            (16384 tokens): 2.36 B parameters, 0.6 B active per token; about 87 GiB by the memory
//            estimate in bf16. For a GPU.
// --layers, --hidden and --batch override the config's (heads stay; head_dim = hidden / heads).
//
// "phase_seconds" holds the median seconds of each phase of a step (StepPhaseSeconds: forward,
// backward, communication, optimizer) over the timed steps.
//
// --ranks N (CPU only) trains the job on N ranks, threads of this process with a Gloo
// communicator each over TCP loopback (dp = N / ep): tokens/s and the phases are rank 0's (every
// rank's step is the same global step), and "ranks" lists each rank's state bytes, exactly, from
// its buffers and its AdamW's moments (parameters, grads, optimizer; the grads measured after the
// run: the resident pages of the gradient buffer, by mincore, and the sharded gradients'
// accumulator, so that GRADIENTS shows what it let go of), and the bytes its activation
// buffers hold after the run (Transformer::activation_bytes: what forward kept, backward's scratch,
// the LM head's chunk), beside what the memory estimate (engine/train/memory_estimate.h) predicts
// for a rank of the layout ("estimated_state_bytes"; one rank runs the same way). The ranks share
// the machine's cores (the thread pool takes their parallel loops in turns), so compare rates
// between runs of the same --ranks only.
//
// On a device the JSON also holds the peak device memory of the training steps and its breakdown:
// the parameters (f32 masters, plus their compute copy below f32), grads and AdamW moments, in
// exact bytes from the model's buffers and parameter list, and the rest (activations, workspaces)
// = peak − those; "expected_memory_bytes" is those states plus the activations the memory
// estimate (engine/train/memory_estimate.h) predicts.
//
// Exit status: 0 done; 1 an error; 2 bad usage; 77 --device cuda without a usable GPU ("no GPU:
// <reason>" on stderr).
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_device.h"
#include "bench/bench_flags.h"
#include "bench/train_configs.h"
#include "engine/backend/device_query.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/core/host_pages.h"
#include "engine/core/status.h"
#include "engine/model/transformer.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/train/memory_estimate.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

class Timer : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  void OnStepPhases(const StepPhaseSeconds& seconds) override { phases.push_back(seconds); }
  std::vector<StepReport> reports;
  std::vector<StepPhaseSeconds> phases;
};

// The exact bytes of one rank's states: the flat buffers the transformer allocates and its AdamW's
// moments; and, after the run, what its activation buffers hold (Transformer::activation_bytes).
struct StateBytes {
  int64_t parameters = 0, grads = 0, optimizer = 0;
  int64_t activations = 0;
  int64_t total() const { return parameters + grads + optimizer; }
};
StateBytes StatesOf(const Trainer& trainer, DType dtype) {
  const Transformer& model = trainer.model();
  StateBytes bytes;
  bytes.parameters = model.master_buffer().numel() *
                     (4 + (dtype == DType::kF32 ? 0 : static_cast<int64_t>(DTypeSize(dtype))));
  bytes.grads = model.grad_buffer().numel() * 4;
  bytes.optimizer = trainer.optimizer().state_bytes();
  return bytes;
}

// What a CPU rank's gradients hold in memory, measured: the resident pages of its gradient buffer
// (mincore) and the sharded gradients' accumulator.
absl::StatusOr<int64_t> ResidentGradBytes(const Trainer& trainer) {
  const TensorView grads = trainer.model().grad_buffer();
  MOETRAIN_ASSIGN_OR_RETURN(const int64_t resident,
                            ResidentHostBytes(grads.raw(), grads.numel() * sizeof(float)));
  return resident + trainer.grad_sync().accumulator().view().numel() * int64_t{4};
}

// Trains `config` on config.parallel.world_size() ranks (threads, Gloo over loopback); rank 0's
// timer into `timer`, each rank's states into `states`. A rank that fails leaves the others
// waiting in a collective until the 300 s timeout: a bench, not a service.
absl::Status RunRanks(const TrainerConfig& config, Timer* timer, std::vector<StateBytes>* states) {
  const int ranks = config.parallel.world_size();
  std::string dir = (std::filesystem::temp_directory_path() / "train_bench-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  absl::StatusOr<std::shared_ptr<FileKeyValueStore>> store = FileKeyValueStore::Open(dir);
  if (!store.ok()) return store.status();
  states->assign(ranks, {});
  std::vector<Timer> timers(ranks);
  std::vector<std::future<absl::Status>> done;
  for (int rank = 0; rank < ranks; ++rank) {
    done.push_back(std::async(std::launch::async, [&, rank]() -> absl::Status {
      GlooOptions options;
      options.group.store = *store;
      options.group.rank = rank;
      options.group.size = ranks;
      options.group.timeout = absl::Seconds(300);
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> world = GlooCommunicator::Create(options);
      if (!world.ok()) return world.status();
      absl::StatusOr<std::unique_ptr<Trainer>> trainer =
          Trainer::Create(config, std::shared_ptr<Communicator>(*std::move(world)));
      if (!trainer.ok()) return trainer.status();
      (*states)[rank] = StatesOf(**trainer, config.compute_dtype);
      const absl::Status run = (*trainer)->Run(&timers[rank]);
      (*states)[rank].activations = (*trainer)->model().activation_bytes();
      if (!run.ok()) return run;
      absl::StatusOr<int64_t> grads = ResidentGradBytes(**trainer);
      if (!grads.ok()) return grads.status();
      (*states)[rank].grads = *grads;
      return absl::OkStatus();
    }));
  }
  absl::Status status;
  for (auto& rank_done : done) {
    const absl::Status ranked = rank_done.get();
    if (status.ok()) status = ranked;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  *timer = std::move(timers[0]);
  return status;
}

// The config as the JSON states it.
nlohmann::json Describe(const std::string& name, const TrainerConfig& c) {
  const ModelConfig& m = c.model;
  return {{"name", name},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.hidden_size},
          {"num_layers", m.num_layers},
          {"first_dense_layers", m.first_dense_layers},
          {"ffn_dim", m.ffn_dim},
          {"num_heads", m.num_heads},
          {"num_kv_heads", m.num_kv_heads},
          {"head_dim", m.resolved_head_dim()},
          {"num_experts", m.moe.num_experts},
          {"top_k", m.moe.top_k},
          {"expert_ffn_dim", m.moe.expert_ffn_dim},
          {"num_shared_experts", m.moe.num_shared_experts},
          {"seq_len", c.data.seq_len},
          {"batch_size", c.data.batch_size},
          {"tokens_per_step", c.data.batch_size * c.data.seq_len}};
}

int Main(int argc, char** argv) {
  bool json = false;
  int64_t steps = 4;
  std::string dtype_name = "bf16", device_name = "cpu", config_name = "default";
  int64_t layers = 0, hidden = 0, batch = 0;  // 0 = the config's
  int64_t ranks = 1, ep = 1;
  std::string sharding_name = "none", moment_name = "f32", recompute_name = "none",
              grad_reduce_name = "f32";
  CLI::App app{"train_bench: training throughput and MFU of an MoE transformer"};
  app.add_flag("--json", json, "print one JSON object instead of a summary");
  app.add_option("--steps", steps, "training steps; the first, a warm-up, is not timed")
      ->capture_default_str()
      ->check(bench::AtLeast(2));
  app.add_option("--dtype", dtype_name, "compute dtype (the masters stay f32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--device", device_name, "where it trains; cuda = cuda:0")
      ->capture_default_str()
      ->check(bench::BenchDeviceCheck());
  app.add_option("--config", config_name,
                 "model and batch: default (d 512, 8 layers, E 16, k 2, 4 x 512 tokens a step) or "
                 "d2048 (d 2048, 8 layers, E 32, k 4, 8 x 2048 tokens; for a GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"default", "d2048"}));
  app.add_option("--layers", layers, "transformer layers (default: the config's)")
      ->check(bench::AtLeast(1));
  app.add_option("--hidden", hidden,
                 "hidden size; the heads stay, head_dim = hidden / heads (default: the config's)")
      ->check(bench::AtLeast(1));
  app.add_option("--batch", batch, "sequences per step (default: the config's)")
      ->check(bench::AtLeast(1));
  app.add_option("--ranks", ranks,
                 "ranks (CPU only): threads of this process, Gloo over loopback; must divide "
                 "the batch")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--ep", ep, "expert-parallel ranks of --ranks (dp = ranks / ep)")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--sharding", sharding_name,
                 "parallel.sharding: none, optimizer (ZeRO-1) or gradients (ZeRO-2)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "optimizer", "gradients"}));
  app.add_option("--moment-dtype", moment_name, "train.optimizer.moment_dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option(
         "--recompute", recompute_name,
         "train.recompute: none, selective (norm and SwiGLU outputs, MLA's up-projections again "
         "in backward) or full (each block's forward again in backward)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--grad-reduce-dtype", grad_reduce_name,
                 "parallel.grad_reduce_dtype: the dtype --ranks sum gradients in")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.footer(
      "Exit status: 0 done; 1 an error; 2 bad usage; 77 --device cuda without a usable GPU.");
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  const DType dtype = dtype_name == "f32" ? DType::kF32 : DType::kBF16;

  ExecContext ctx = ExecContext::Cpu();
  if (const int exit_code = bench::OpenBenchDevice("train_bench", device_name, &ctx);
      exit_code != 0) {
    return exit_code;
  }
  const Device device = ctx.device();
  if (ranks > 1 && !device.is_cpu()) {
    std::fprintf(stderr, "train_bench: --ranks > 1 runs on the CPU only\n");
    return 2;
  }
  if (ranks % ep != 0) {
    std::fprintf(stderr, "train_bench: --ep %lld does not divide --ranks %lld\n",
                 static_cast<long long>(ep), static_cast<long long>(ranks));
    return 2;
  }

  TrainerConfig c = config_name == "d2048" ? D2048Config() : DefaultConfig();
  if (layers > 0) c.model.num_layers = layers;
  if (hidden > 0) c.model.hidden_size = hidden;
  if (batch > 0) c.data.batch_size = batch;
  c.job_id = "train_bench";
  c.device = device;
  c.data.format = DataConfig::Format::kSynthetic;
  c.data.vocab_size = c.model.vocab_size;
  c.data.synthetic_vocab_size = c.model.vocab_size;
  c.compute_dtype = dtype;
  c.steps = steps;
  c.schedule.total_steps = steps;
  c.log_every = 1;
  c.parallel.data_parallel = static_cast<int>(ranks / ep);
  c.parallel.expert_parallel = static_cast<int>(ep);
  c.parallel.sharding = *ShardingFromName(sharding_name);
  c.optimizer.moment_dtype = moment_name == "bf16" ? DType::kBF16 : DType::kF32;
  c.recompute = *RecomputeFromName(recompute_name);
  c.parallel.grad_reduce_dtype = grad_reduce_name == "bf16" ? DType::kBF16 : DType::kF32;
  if (absl::Status valid = c.Validate(); !valid.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", valid.ToString().c_str());
    return 2;
  }

  // The denominator first: the trainer's peak memory (reset when it is created) then does not
  // hold the measurement's matrices.
  const int64_t gemm_n = device.is_cpu() ? 2048 : 8192;
  absl::StatusOr<double> gemm_flops = ops::MeasureGemmFlops(ctx, DType::kBF16, gemm_n, 3);
  if (!gemm_flops.ok()) {
    std::fprintf(stderr, "train_bench: dense GEMM: %s\n", gemm_flops.status().ToString().c_str());
    return 1;
  }
  const double dense = *gemm_flops / 1e9;

  std::fprintf(stderr,
               "train_bench: %lld steps of %lld tokens (%s, %s, config %s, %s, sharding %s, "
               "recompute %s)...\n",
               static_cast<long long>(steps),
               static_cast<long long>(c.data.batch_size * c.data.seq_len),
               std::string(DTypeName(dtype)).c_str(), device.DebugString().c_str(),
               config_name.c_str(), c.parallel.DebugString().c_str(),
               ShardingName(c.parallel.sharding), RecomputeName(c.recompute));
  Timer timer;
  std::vector<StateBytes> rank_states;
  std::unique_ptr<Trainer> trainer;
  absl::Status status;
  if (ranks > 1) {
    status = RunRanks(c, &timer, &rank_states);
  } else {
    absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(c);
    status = created.status();
    if (status.ok()) {
      trainer = *std::move(created);
      rank_states = {StatesOf(*trainer, dtype)};
      status = trainer->Run(&timer);
      rank_states[0].activations = trainer->model().activation_bytes();
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  // Median tokens/s of the timed steps (all but the first).
  std::vector<double> rates;
  for (size_t i = 1; i < timer.reports.size(); ++i) rates.push_back(timer.reports[i].tokens_per_s);
  std::sort(rates.begin(), rates.end());
  const double tokens_per_s = rates[rates.size() / 2];
  // Median seconds of each phase over the timed steps.
  auto phase = [&](double StepPhaseSeconds::*field) {
    std::vector<double> seconds;
    for (size_t i = 1; i < timer.phases.size(); ++i) seconds.push_back(timer.phases[i].*field);
    std::sort(seconds.begin(), seconds.end());
    return seconds.empty() ? 0.0 : seconds[seconds.size() / 2];
  };
  const double flops_per_token = TrainingFlopsPerToken(c.model, c.data.seq_len);
  const double mfu = flops_per_token * tokens_per_s / (dense * 1e9);
  nlohmann::json result = {
      {"dtype", std::string(DTypeName(dtype))},
      {"tokens_per_s", tokens_per_s},
      {"model_flops_per_token", flops_per_token},
      {"dense_gemm_gflops_bf16", dense},
      {"mfu", mfu},
      {"final_loss", timer.reports.back().loss},
      {"phase_seconds",
       {{"forward", phase(&StepPhaseSeconds::forward)},
        {"backward", phase(&StepPhaseSeconds::backward)},
        {"communication", phase(&StepPhaseSeconds::communication)},
        {"optimizer", phase(&StepPhaseSeconds::optimizer)}}},
      {"device", device.DebugString()},
      {"dense_gemm_n", gemm_n},
      {"config", Describe(config_name, c)},
      {"ranks", ranks},
      {"data_parallel", c.parallel.data_parallel},
      {"expert_parallel", c.parallel.expert_parallel},
      {"sharding", ShardingName(c.parallel.sharding)},
      {"moment_dtype", std::string(DTypeName(c.optimizer.moment_dtype))},
      {"recompute", RecomputeName(c.recompute)},
      {"grad_reduce_dtype", std::string(DTypeName(c.parallel.grad_reduce_dtype))}};
  // Each rank's states, and what the estimate says a rank of this layout holds.
  const MemoryEstimate estimate = EstimateTrainingMemory(c);
  result["estimated_state_bytes"] = {{"parameters", estimate.parameters},
                                     {"grads", estimate.gradients},
                                     {"optimizer", estimate.optimizer},
                                     {"activations", estimate.activations}};
  result["rank_state_bytes"] = nlohmann::json::array();
  for (const StateBytes& states : rank_states) {
    result["rank_state_bytes"].push_back({{"parameters", states.parameters},
                                          {"grads", states.grads},
                                          {"optimizer", states.optimizer},
                                          {"activations", states.activations}});
  }

  // Rank 0's states, exactly (StatesOf).
  const int64_t parameter_bytes = rank_states[0].parameters, grad_bytes = rank_states[0].grads,
                optimizer_bytes = rank_states[0].optimizer, states = rank_states[0].total();
  result["parameter_count"] = static_cast<int64_t>(ParameterCount(c.model));
  if (!device.is_cpu()) {
    int64_t peak = 0;
    for (const StepReport& report : timer.reports) {
      peak = std::max(peak, report.device_memory_peak_bytes);
    }
    const double activations = EstimateTrainingMemory(c).activations;
    result["peak_memory_bytes"] = peak;
    result["expected_memory_bytes"] = static_cast<double>(states) + activations;
    result["memory_breakdown_bytes"] = {{"parameters", parameter_bytes},
                                        {"grads", grad_bytes},
                                        {"optimizer_state", optimizer_bytes},
                                        {"activations_and_workspace", peak - states},
                                        {"estimated_activations", activations}};
    if (const DeviceRuntime* runtime = ctx.runtime(); runtime != nullptr) {
      result["device_memory_total_bytes"] = runtime->memory_stats().total_bytes;
    }
  }
  if (json) {
    std::printf("%s\n", result.dump().c_str());
  } else {
    std::printf("%.0f tokens/s, %.2f GFLOP/token, dense bf16 %.1f GFLOP/s, MFU %.3f\n",
                tokens_per_s, flops_per_token / 1e9, dense, mfu);
    if (!device.is_cpu()) {
      const double gib = 1024.0 * 1024.0 * 1024.0;
      const int64_t peak = result["peak_memory_bytes"].get<int64_t>();
      std::printf(
          "peak device memory %.2f GiB: parameters %.2f, grads %.2f, optimizer %.2f, "
          "activations and workspace %.2f GiB (estimated activations %.2f GiB)\n",
          peak / gib, parameter_bytes / gib, grad_bytes / gib, optimizer_bytes / gib,
          (peak - states) / gib,
          result["memory_breakdown_bytes"]["estimated_activations"].get<double>() / gib);
    }
  }
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
