// One rank of a parallel training job as a process of its own (parallel_training_test starts
// one per rank):
//
//   parallel_train_rank --rank R --dp D --ep E --store DIR --checkpoint-dir DIR
//                       [--steps N] [--micro M] [--resume] [--hang-after-checkpoint S]
//                       [--poison] [--fp8 delayed|current|blockwise|mxfp8] [--deepseek]
//                       [--bf16] [--bf16-moments] [--sharding none|optimizer|gradients]
//                       [--recompute none|selective|full] [--layers L] [--bf16-grad-reduce]
//
// Joins the world through a FileKeyValueStore in the store directory (Gloo over 127.0.0.1),
// builds the trainer of parallel_test_config.h, resumes when asked, trains, and prints one JSON
// object a line: {"step", "loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens_seen",
// "eval_loss"?, "mtp_loss"?, "expert_load"} per step (doubles as their 17 digits), {"checkpoint",
// "path"},
// {"message"}, and {"done": true, "step"} at the end. Exits 0, or 1 after printing
// {"error": "..."}. With --hang-after-checkpoint S it stops in its tracks once the checkpoint of
// step S is written, for the test to kill it. --poison makes the embedding NaN (on every rank).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"
#include "tests/engine/train/parallel_test_config.h"

namespace moetrain {
namespace {

void Print(const nlohmann::json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// Doubles as strings of 17 significant digits: they read back to the same bits.
std::string Exact(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

class Printer : public TrainObserver {
 public:
  explicit Printer(int64_t hang_after) : hang_after_(hang_after) {}
  void OnStep(const StepReport& r) override {
    nlohmann::json line = {{"step", r.step},
                           {"loss", Exact(r.loss)},
                           {"aux_loss", Exact(r.aux_loss)},
                           {"z_loss", Exact(r.z_loss)},
                           {"grad_norm", Exact(r.grad_norm)},
                           {"lr", Exact(r.lr)},
                           {"tokens_seen", r.tokens_seen},
                           {"expert_load", Exact(r.expert_load_max_over_mean)},
                           {"expert_tokens", r.expert_tokens}};
    if (r.eval_loss.has_value()) line["eval_loss"] = Exact(*r.eval_loss);
    if (r.mtp_loss.has_value()) line["mtp_loss"] = Exact(*r.mtp_loss);
    Print(line);
  }
  void OnCheckpoint(const CheckpointReport& r) override {
    Print({{"checkpoint", r.step}, {"path", r.path}});
    if (r.step == hang_after_) {
      for (;;) pause();  // until the test kills this process
    }
  }
  void OnMessage(const std::string& message) override { Print({{"message", message}}); }

 private:
  const int64_t hang_after_;
};

int Fail(const absl::Status& status) {
  Print({{"error", status.ToString()}});
  return 1;
}

int Main(int argc, char** argv) {
  int64_t rank = 0, dp = 1, ep = 1, steps = 0, micro = 0, hang_after = -1, layers = 0;
  bool resume = false, poison = false, deepseek = false, bf16 = false, bf16_moments = false,
       bf16_grad_reduce = false;
  std::string store_dir, checkpoint_dir;
  const std::map<std::string, int64_t*> numbers = {
      {"--rank", &rank},    {"--dp", &dp},       {"--ep", &ep},
      {"--steps", &steps},  {"--micro", &micro}, {"--hang-after-checkpoint", &hang_after},
      {"--layers", &layers}};
  std::string fp8, sharding = "none", recompute = "none";
  const std::map<std::string, std::string*> texts = {{"--store", &store_dir},
                                                     {"--checkpoint-dir", &checkpoint_dir},
                                                     {"--fp8", &fp8},
                                                     {"--sharding", &sharding},
                                                     {"--recompute", &recompute}};
  const std::map<std::string, bool*> switches = {{"--resume", &resume},
                                                 {"--poison", &poison},
                                                 {"--deepseek", &deepseek},
                                                 {"--bf16", &bf16},
                                                 {"--bf16-moments", &bf16_moments},
                                                 {"--bf16-grad-reduce", &bf16_grad_reduce}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (switches.contains(flag)) {
      *switches.at(flag) = true;
    } else if (numbers.contains(flag)) {
      *numbers.at(flag) = std::atoll(value);
      ++i;
    } else if (texts.contains(flag)) {
      *texts.at(flag) = value;
      ++i;
    } else {
      return Fail(absl::InvalidArgumentError("unknown flag " + flag));
    }
  }
  absl::StatusOr<std::shared_ptr<FileKeyValueStore>> store = FileKeyValueStore::Open(store_dir);
  if (!store.ok()) return Fail(store.status());
  GlooOptions options;
  options.group.store = *store;
  options.group.rank = static_cast<int>(rank);
  options.group.size = static_cast<int>(dp * ep);
  options.group.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> world = GlooCommunicator::Create(options);
  if (!world.ok()) return Fail(world.status());

  TrainerConfig config =
      parallel_test::JobConfig(checkpoint_dir, static_cast<int>(dp), static_cast<int>(ep));
  if (deepseek) config = parallel_test::WithDeepseekV3(config);
  if (steps > 0) config.steps = steps;
  if (layers > 0) config.model.num_layers = layers;
  config.micro_batch_size = micro;
  if (bf16) config.compute_dtype = DType::kBF16;
  if (bf16_moments) config.optimizer.moment_dtype = DType::kBF16;
  if (bf16_grad_reduce) config.parallel.grad_reduce_dtype = DType::kBF16;
  const std::optional<Sharding> stage = ShardingFromName(sharding);
  if (!stage.has_value()) {
    return Fail(
        absl::InvalidArgumentError("--sharding " + sharding + ": none, optimizer or gradients"));
  }
  config.parallel.sharding = *stage;
  const std::optional<Recompute> mode = RecomputeFromName(recompute);
  if (!mode.has_value()) {
    return Fail(
        absl::InvalidArgumentError("--recompute " + recompute + ": none, selective or full"));
  }
  config.recompute = *mode;
  if (!fp8.empty()) {
    absl::StatusOr<TrainerConfig> with_fp8 = parallel_test::WithFp8(config, fp8);
    if (!with_fp8.ok()) return Fail(with_fp8.status());
    config = *std::move(with_fp8);
  }
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(config, std::shared_ptr<Communicator>(std::move(*world)));
  if (!trainer.ok()) return Fail(trainer.status());
  if (poison) {
    TensorView embed = (*trainer)->model().parameters()[0].value;
    for (int64_t i = 0; i < embed.numel(); ++i) embed.data<float>()[i] = std::nanf("");
    if (absl::Status status = (*trainer)->model().SyncComputeWeights(); !status.ok()) {
      return Fail(status);
    }
  }
  Printer printer(hang_after);
  if (resume) {
    if (absl::Status status = (*trainer)->Resume(&printer); !status.ok()) return Fail(status);
  }
  if (absl::Status status = (*trainer)->Run(&printer); !status.ok()) return Fail(status);
  Print({{"done", true}, {"step", (*trainer)->step()}});
  return 0;
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }
