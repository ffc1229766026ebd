#include "client/run_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/status.h"
#include "engine/train/checkpoint.h"
#include "engine/train/model_config_json.h"
#include "engine/train/token_file.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/job_spec.h"
#include "nlohmann/json.hpp"
#include "worker/job_config.h"

namespace moetrain {
namespace {

std::atomic<StopRequest> g_stop{StopRequest::kNone};

void OnSignal(int) { g_stop.store(StopRequest::kCheckpointAndStop); }

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "moetrain: %s\n", std::string(status.message()).c_str());
  return 1;
}

std::string Duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
                   : absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Prints each logged step: a progress bar on a terminal, one plain line otherwise, or one JSON
// object per line.
class ProgressPrinter : public TrainObserver {
 public:
  ProgressPrinter(int64_t total_steps, bool json)
      : total_steps_(total_steps), json_(json), tty_(!json && isatty(STDOUT_FILENO)) {}

  void OnStep(const StepReport& r) override {
    last_ = r;
    if (r.eval_loss) last_eval_ = r.eval_loss;
    if (json_) {
      nlohmann::json line = {
          {"step", r.step},
          {"loss", r.loss},
          {"eval_loss", r.eval_loss ? nlohmann::json(*r.eval_loss) : nullptr},
          {"lr", r.lr},
          {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nullptr},
          {"tokens_per_s", r.tokens_per_s},
          {"expert_load_max_over_mean", r.expert_load_max_over_mean},
          {"aux_loss", r.aux_loss},
          {"tokens_seen", r.tokens_seen}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
      return;
    }
    const double elapsed = Seconds() - start_;
    const int64_t done = r.step - first_step_;
    const double eta = done > 0 ? elapsed / done * (total_steps_ - r.step) : 0.0;
    std::string eval = r.eval_loss ? absl::StrFormat("  eval %.4f", *r.eval_loss) : "";
    std::string stats =
        absl::StrFormat("loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  load %.2f", r.loss, eval, r.lr,
                        r.grad_norm, r.tokens_per_s, r.expert_load_max_over_mean);
    if (tty_) {
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * r.step / std::max<int64_t>(total_steps_, 1));
      std::printf("\r\033[Kstep %lld/%lld [%s%s] %s  ETA %s", static_cast<long long>(r.step),
                  static_cast<long long>(total_steps_), std::string(filled, '#').c_str(),
                  std::string(kWidth - filled, '.').c_str(), stats.c_str(), Duration(eta).c_str());
      if (r.step == total_steps_ || r.eval_loss) std::printf("\n");
    } else {
      std::printf("step %lld/%lld  %s  elapsed %s\n", static_cast<long long>(r.step),
                  static_cast<long long>(total_steps_), stats.c_str(), Duration(elapsed).c_str());
    }
    std::fflush(stdout);
  }

  void OnCheckpoint(const CheckpointReport& report) override {
    const int64_t step = report.step;
    const std::string& path = report.path;
    checkpoint_ = path;
    if (json_) {
      std::printf("%s\n", nlohmann::json({{"checkpoint", path}, {"step", step}}).dump().c_str());
    } else {
      std::printf("%scheckpoint %s\n", tty_ ? "\r\033[K" : "", path.c_str());
    }
    std::fflush(stdout);
  }

  void OnMessage(const std::string& message) override {
    if (json_) {
      std::printf("%s\n", nlohmann::json({{"message", message}}).dump().c_str());
    } else {
      std::printf("%s%s\n", tty_ ? "\r\033[K" : "", message.c_str());
    }
    std::fflush(stdout);
  }

  void Start(int64_t first_step) {
    first_step_ = first_step;
    start_ = Seconds();
  }

  void Summary(const Trainer& trainer) {
    const double elapsed = Seconds() - start_;
    const std::optional<double> best = trainer.best_possible_loss();
    if (json_) {
      nlohmann::json summary = {
          {"summary", true},
          {"job", trainer.config().job_id},
          {"steps", trainer.step()},
          {"tokens_seen", trainer.tokens_seen()},
          {"final_loss", last_ ? nlohmann::json(last_->loss) : nullptr},
          {"eval_loss", last_eval_ ? nlohmann::json(*last_eval_) : nullptr},
          {"best_possible_loss", best ? nlohmann::json(*best) : nullptr},
          {"checkpoint", checkpoint_.empty() ? nullptr : nlohmann::json(checkpoint_)},
          {"elapsed_s", elapsed}};
      std::printf("%s\n", summary.dump().c_str());
    } else {
      std::printf("done: %lld steps in %s", static_cast<long long>(trainer.step()),
                  Duration(elapsed).c_str());
      if (last_) std::printf(", loss %.4f", last_->loss);
      if (last_eval_) std::printf(", eval loss %.4f", *last_eval_);
      if (best) std::printf(" (the data's entropy rate, the best possible: %.4f)", *best);
      std::printf("\n");
      if (!checkpoint_.empty()) std::printf("last checkpoint: %s\n", checkpoint_.c_str());
    }
  }

 private:
  static double Seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  int64_t total_steps_;
  bool json_, tty_;
  int64_t first_step_ = 0;
  double start_ = 0;
  std::optional<StepReport> last_;
  std::optional<double> last_eval_;
  std::string checkpoint_;
};

}  // namespace

int RunJob(const RunOptions& options) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(options.spec_path);
  if (!spec.ok()) return Fail(spec.status());
  if (options.steps > 0) spec->mutable_train()->set_steps(options.steps);
  std::string checkpoint_dir = options.checkpoint_dir;
  if (checkpoint_dir.empty() && spec->checkpoint().dir().empty()) checkpoint_dir = "checkpoints";
  absl::StatusOr<TrainerConfig> config = TrainerConfigFromSpec(*spec, checkpoint_dir);
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  if (!trainer.ok()) return Fail(trainer.status());

  ProgressPrinter printer(config->steps, options.json);
  const std::string root = absl::StrCat(config->checkpoint_dir, "/", config->job_id);
  if (!options.resume) {
    // Never train over a job's checkpoints by accident.
    absl::StatusOr<std::vector<int64_t>> steps = ListCheckpointSteps(root);
    if (!steps.ok()) return Fail(steps.status());
    if (!steps->empty()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "job ", config->job_id, " already has checkpoints in ", root, " (newest: step ",
          steps->back(), "): pass --resume to continue it, or choose another --checkpoint-dir")));
    }
  }
  if (options.resume) {
    absl::Status status = (*trainer)->Resume(&printer);
    if (absl::IsNotFound(status)) {
      printer.OnMessage(absl::StrCat("no checkpoint of job ", config->job_id, " in ",
                                     config->checkpoint_dir, ": starting from step 0"));
    } else if (!status.ok()) {
      return Fail(status);
    }
  }
  if (!options.json) {
    std::printf("job %s: %lld steps of %lld × %lld tokens, checkpoints in %s/%s\n",
                config->job_id.c_str(), static_cast<long long>(config->steps),
                static_cast<long long>(config->data.batch_size),
                static_cast<long long>(config->data.seq_len), config->checkpoint_dir.c_str(),
                config->job_id.c_str());
  }
  InstallStopHandlers();
  printer.Start((*trainer)->step());
  absl::Status status = (*trainer)->Run(&printer, &g_stop);
  if (!status.ok()) return Fail(status);
  printer.Summary(**trainer);
  return 0;
}

int EvalCheckpoint(const EvalOptions& options) {
  absl::StatusOr<TokenFileFormat> format =
      options.data_format == "llmc"  ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kLlmc)
      : options.data_format == "u16" ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kU16)
      : options.data_format == "text"
          ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kText)
          : absl::InvalidArgumentError(absl::StrCat("--data-format = '", options.data_format,
                                                    "' is not one of llmc, u16, text"));
  if (!format.ok()) return Fail(format.status());
  absl::StatusOr<LoadedCheckpoint> checkpoint = LoadCheckpoint(options.checkpoint);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  absl::StatusOr<ModelConfig> model_config =
      ModelConfigFromJson(checkpoint->manifest.value("model_config", nlohmann::json()));
  if (!model_config.ok()) return Fail(model_config.status());
  const int64_t seq_len = checkpoint->hf_config.value("max_position_embeddings", int64_t{0});
  if (seq_len < 1 || seq_len > model_config->max_seq_len) {
    return Fail(absl::DataLossError(
        absl::StrCat(options.checkpoint, ": config.json max_position_embeddings = ", seq_len,
                     " is not a usable sequence length")));
  }
  absl::StatusOr<Transformer> model = Transformer::Create(*model_config, DType::kF32);
  if (!model.ok()) return Fail(model.status());
  if (absl::Status status = RestoreModelParameters(*checkpoint, &*model); !status.ok()) {
    return Fail(status);
  }

  absl::StatusOr<TokenFile> file =
      TokenFile::Open(options.data_path, *format, model_config->vocab_size, seq_len + 1);
  if (!file.ok()) return Fail(file.status());
  // Window i is tokens [i·S, i·S + S + 1): consecutive windows share their boundary token.
  const int64_t windows = (file->num_tokens() - 1) / seq_len;
  const int64_t batch_size = std::max<int64_t>(1, options.batch_size);
  int64_t batches = (windows + batch_size - 1) / batch_size;
  if (options.batches > 0) batches = std::min(batches, options.batches);
  double loss_sum = 0;
  int64_t windows_done = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * batch_size, count = std::min(batch_size, windows - first);
    Tensor tokens = Tensor::Empty(DType::kI32, {count, seq_len + 1});
    for (int64_t w = 0; w < count; ++w) {
      file->Read((first + w) * seq_len, seq_len + 1, tokens.data<int32_t>() + w * (seq_len + 1));
    }
    absl::StatusOr<float> loss = model->Evaluate(tokens);
    if (!loss.ok()) return Fail(loss.status());
    loss_sum += static_cast<double>(*loss) * count;
    windows_done += count;
  }
  const double loss = loss_sum / windows_done;
  if (options.json) {
    std::printf(
        "%s\n",
        nlohmann::json({{"loss", loss}, {"tokens", windows_done * seq_len}}).dump().c_str());
  } else {
    std::printf("loss %.6f over %lld tokens (%lld windows of %lld)\n", loss,
                static_cast<long long>(windows_done * seq_len),
                static_cast<long long>(windows_done), static_cast<long long>(seq_len));
  }
  return 0;
}

}  // namespace moetrain
