// The training loop end to end on a tiny MoE transformer: exact resume, corrupt-checkpoint
// fallback, non-finite steps, and convergence to the entropy rate of a synthetic source.
#include "engine/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/train/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using testing_config::TinyTrainerConfig;
using testutil::TempDir;

// Records every logged step.
class Recorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  void OnMessage(const std::string& message) override { messages.push_back(message); }
  std::vector<StepReport> reports;
  std::vector<std::string> messages;
};

std::vector<float> Masters(Trainer& trainer) {
  TensorView buffer = trainer.model().master_buffer();
  return std::vector<float>(buffer.data<float>(), buffer.data<float>() + buffer.numel());
}

TEST(TrainerTest, ResumeIsBitIdenticalToTrainingStraight) {
  TempDir straight_dir, resumed_dir;
  Recorder straight;
  auto a = Trainer::Create(TinyTrainerConfig(straight_dir.path()));
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(&straight));
  ASSERT_EQ(straight.reports.size(), 8u);

  // The same job stopped after 4 steps (its step-4 checkpoint), then resumed in a new trainer.
  TrainerConfig first_half = TinyTrainerConfig(resumed_dir.path());
  first_half.steps = 4;
  Recorder resumed;
  {
    auto b = Trainer::Create(first_half);
    ASSERT_OK(b.status());
    ASSERT_OK((*b)->Run(&resumed));
  }
  auto c = Trainer::Create(TinyTrainerConfig(resumed_dir.path()));
  ASSERT_OK(c.status());
  ASSERT_OK((*c)->Resume(&resumed));
  EXPECT_EQ((*c)->step(), 4);
  ASSERT_OK((*c)->Run(&resumed));
  ASSERT_EQ(resumed.reports.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(straight.reports[i].step, resumed.reports[i].step);
    // Bit-identical, not merely close.
    EXPECT_EQ(std::memcmp(&straight.reports[i].loss, &resumed.reports[i].loss, sizeof(double)), 0)
        << "step " << i + 1 << ": " << straight.reports[i].loss << " vs "
        << resumed.reports[i].loss;
    EXPECT_EQ(straight.reports[i].grad_norm, resumed.reports[i].grad_norm) << i;
  }
  EXPECT_EQ(Masters(**a), Masters(**c));
  EXPECT_EQ((*a)->tokens_seen(), (*c)->tokens_seen());
}

// Fine-tuning: a new job whose checkpoint.init_from names another job's step starts from that
// step's weights (and only them: step, optimizer and data start fresh); another model is refused.
TEST(TrainerTest, InitializeFromTakesTheWeightsOfAStepOfTheSameModel) {
  TempDir pretrain_dir, finetune_dir;
  auto a = Trainer::Create(TinyTrainerConfig(pretrain_dir.path()));
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(nullptr));
  const std::string step =
      (pretrain_dir.path() / TinyTrainerConfig("").job_id / "step-00000008").string();

  TrainerConfig finetune = TinyTrainerConfig(finetune_dir.path());
  finetune.seed = 777;  // another init, which the step's weights replace
  auto b = Trainer::Create(finetune);
  ASSERT_OK(b.status());
  EXPECT_NE(Masters(**a), Masters(**b));
  ASSERT_OK((*b)->InitializeFrom(step));
  EXPECT_EQ(Masters(**a), Masters(**b));
  EXPECT_EQ((*b)->step(), 0);
  EXPECT_EQ((*b)->tokens_seen(), 0);

  TrainerConfig other = TinyTrainerConfig(finetune_dir.path());
  other.model.ffn_dim += 2;
  auto c = Trainer::Create(other);
  ASSERT_OK(c.status());
  const absl::Status refused = (*c)->InitializeFrom(step);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("model.ffn_dim differ"), std::string::npos) << refused;

  // Training-only fields (the init, the aux loss, the sequence length) may differ.
  TrainerConfig retuned = TinyTrainerConfig(finetune_dir.path());
  retuned.model.init_std = 0.05f;
  retuned.model.moe.aux_loss_coeff = 0.0f;
  retuned.model.moe.aux_loss = AuxLossType::kNone;
  retuned.model.max_seq_len = 64;
  auto d = Trainer::Create(retuned);
  ASSERT_OK(d.status());
  ASSERT_OK((*d)->InitializeFrom(step));
  EXPECT_EQ(Masters(**a), Masters(**d));
  EXPECT_EQ((*c)->InitializeFrom((pretrain_dir.path() / "nothing").string()).code(),
            absl::StatusCode::kNotFound);
}

// Asks for a stop once a given step is reported, refuses chosen checkpoints, and records what
// the trainer reports.
class Controller : public Recorder {
 public:
  void OnStep(const StepReport& report) override {
    Recorder::OnStep(report);
    if (report.step == stop_after) stop.store(request);
  }
  void OnCheckpoint(const CheckpointReport& report) override { checkpoints.push_back(report); }
  absl::Status BeforeCheckpoint(int64_t step) override {
    if (step == refuse_step) return absl::FailedPreconditionError("no lease");
    return absl::OkStatus();
  }
  int64_t stop_after = -1;
  StopRequest request = StopRequest::kNone;
  int64_t refuse_step = -1;
  std::atomic<StopRequest> stop{StopRequest::kNone};
  std::vector<CheckpointReport> checkpoints;
};

TEST(TrainerTest, StopRequestsEndAtAStepBoundaryWithOrWithoutACheckpoint) {
  TempDir dir;
  TrainerConfig config = TinyTrainerConfig(dir.path());
  config.checkpoint_every = 0;  // only the final (or stop) checkpoint
  {
    Controller controller;
    controller.stop_after = 3;
    controller.request = StopRequest::kCheckpointAndStop;
    auto trainer = Trainer::Create(config);
    ASSERT_OK(trainer.status());
    ASSERT_OK((*trainer)->Run(&controller, &controller.stop));
    EXPECT_EQ((*trainer)->step(), 3);
    ASSERT_EQ(controller.checkpoints.size(), 1u);
    const CheckpointReport& saved = controller.checkpoints[0];
    EXPECT_EQ(saved.step, 3);
    EXPECT_EQ(std::filesystem::path(saved.path),
              (dir.path() / "tiny/step-00000003").lexically_normal());
    EXPECT_EQ(saved.tokens_seen, (*trainer)->tokens_seen());
    EXPECT_GT(saved.write_seconds, 0.0);
  }
  std::filesystem::remove_all(dir.path() / "tiny");
  {
    Controller controller;
    controller.stop_after = 2;
    controller.request = StopRequest::kStop;
    auto trainer = Trainer::Create(config);
    ASSERT_OK(trainer.status());
    ASSERT_OK((*trainer)->Run(&controller, &controller.stop));
    EXPECT_EQ((*trainer)->step(), 2);
    EXPECT_TRUE(controller.checkpoints.empty());
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "tiny/step-00000002"));
  }
}

TEST(TrainerTest, ARefusedCheckpointIsSkippedAndTrainingGoesOn) {
  TempDir dir;
  Controller controller;
  controller.refuse_step = 4;
  auto trainer = Trainer::Create(TinyTrainerConfig(dir.path()));  // checkpoints at 4 and 8
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&controller));
  EXPECT_EQ((*trainer)->step(), 8);
  ASSERT_EQ(controller.checkpoints.size(), 1u);
  EXPECT_EQ(controller.checkpoints[0].step, 8);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "tiny/step-00000004"));
  bool told = false;
  for (const std::string& message : controller.messages) {
    told |= message.find("checkpoint of step 4 skipped: no lease") != std::string::npos;
  }
  EXPECT_TRUE(told);
}

TEST(TrainerTest, StepsReportTheirTimeAndTheLoadOfEveryMoeLayer) {
  TempDir dir;
  Recorder recorder;
  TrainerConfig config = TinyTrainerConfig(dir.path());
  config.steps = 2;
  auto trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&recorder));
  ASSERT_EQ(recorder.reports.size(), 2u);
  for (const StepReport& report : recorder.reports) {
    EXPECT_GT(report.step_seconds, 0.0);
    // Two blocks, the first dense: one MoE layer.
    ASSERT_EQ(report.expert_load_per_layer.size(), 1u);
    EXPECT_GE(report.expert_load_per_layer[0], 1.0);
    EXPECT_EQ(report.expert_load_per_layer[0], report.expert_load_max_over_mean);
    // Every expert's count: the layer's row holds each token once per top-k slot, and its
    // busiest expert over the mean is the layer's load.
    const int64_t experts = config.model.moe.num_experts;
    ASSERT_EQ(report.expert_tokens.size(), static_cast<size_t>(experts));
    int64_t routed = 0, busiest = 0;
    for (int64_t count : report.expert_tokens) {
      EXPECT_GE(count, 0);
      routed += count;
      busiest = std::max(busiest, count);
    }
    EXPECT_EQ(routed, config.data.batch_size * config.data.seq_len * config.model.moe.top_k);
    EXPECT_DOUBLE_EQ(report.expert_load_per_layer[0],
                     static_cast<double>(busiest) * experts / static_cast<double>(routed));
  }
}

TEST(TrainerTest, CorruptLatestCheckpointFallsBackToThePreviousOne) {
  TempDir dir;
  auto a = Trainer::Create(TinyTrainerConfig(dir.path()));
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(nullptr));
  const std::string root = (dir.path() / "tiny").string();
  auto steps = ListCheckpointSteps(root);
  ASSERT_OK(steps.status());
  ASSERT_EQ(*steps, (std::vector<int64_t>{4, 8}));

  // Flip one byte in the middle of the newest model file.
  const std::string model = root + "/" + CheckpointStepDirName(8) + "/" + ModelFileName(0);
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(0, std::ios::end);
    const std::streamoff middle = f.tellg() / 2;
    f.seekg(middle);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x5a;
    f.seekp(middle);
    f.write(&byte, 1);
  }
  Recorder recorder;
  auto b = Trainer::Create(TinyTrainerConfig(dir.path()));
  ASSERT_OK(b.status());
  ASSERT_OK((*b)->Resume(&recorder));
  EXPECT_EQ((*b)->step(), 4);
  bool reported = false;
  for (const std::string& m : recorder.messages) {
    if (m.find("step-00000008") != std::string::npos) reported = true;
  }
  EXPECT_TRUE(reported) << "the damaged step 8 is not reported";
}

TEST(TrainerTest, NonFiniteLossStopsNamingTheStepWithoutACheckpoint) {
  TempDir dir;
  TrainerConfig config = TinyTrainerConfig(dir.path());
  config.checkpoint_every = 0;
  auto a = Trainer::Create(config);
  ASSERT_OK(a.status());
  // Every token's embedding row is NaN, so the first step's loss is.
  TensorView embed = (*a)->model().parameters()[0].value;
  for (int64_t i = 0; i < embed.numel(); ++i) embed.data<float>()[i] = std::nanf("");
  EXPECT_TRUE((*a)->model().SyncComputeWeights().ok());
  const absl::Status status = (*a)->Run(nullptr);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("step 1"), std::string::npos) << status;
  auto steps = ListCheckpointSteps((dir.path() / "tiny").string());
  EXPECT_TRUE(!steps.ok() || steps->empty()) << "a poisoned state was checkpointed";
}

TEST(TrainerTest, NonFiniteStepsAreSkippedWhenTheSpecSaysSo) {
  TrainerConfig config = TinyTrainerConfig("");
  config.skip_nonfinite_steps = true;
  config.steps = 2;
  auto a = Trainer::Create(config);
  ASSERT_OK(a.status());
  // Every token's embedding row is NaN, so every step is non-finite.
  TensorView embed = (*a)->model().parameters()[0].value;
  for (int64_t i = 0; i < embed.numel(); ++i) embed.data<float>()[i] = std::nanf("");
  EXPECT_TRUE((*a)->model().SyncComputeWeights().ok());
  Recorder recorder;
  ASSERT_OK((*a)->Run(&recorder));
  ASSERT_EQ(recorder.reports.size(), 2u);
  EXPECT_TRUE(recorder.reports[0].skipped);
  EXPECT_EQ((*a)->step(), 2);
}

// Whether `json` anywhere holds a key that mentions a device, or a value naming one.
bool MentionsADevice(const nlohmann::json& json, std::string* where) {
  const auto names_device = [](std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text.find("device") != std::string::npos || text.rfind("cuda", 0) == 0 ||
           text == "cpu" || text.rfind("gpu", 0) == 0;
  };
  if (json.is_object()) {
    for (const auto& [key, value] : json.items()) {
      if (names_device(key) || MentionsADevice(value, where)) {
        *where = key + (where->empty() ? "" : "." + *where);
        return true;
      }
    }
  } else if (json.is_array()) {
    for (const nlohmann::json& value : json) {
      if (MentionsADevice(value, where)) return true;
    }
  } else if (json.is_string() && names_device(json.get<std::string>())) {
    *where = json.get<std::string>();
    return true;
  }
  return false;
}

// A checkpoint is the same files on every device (a GPU job's resumes on the CPU and the
// reverse): nothing in it names the device that wrote it, and a trainer of the same job resumes
// it whatever its device field says. Only the devices this machine has are tried here;
// trainer_cuda_test resumes across devices where there is a GPU.
TEST(TrainerTest, CheckpointsRecordNoDeviceAndResumeOnAnyDevice) {
  TempDir dir;
  TrainerConfig config = TinyTrainerConfig(dir.path());
  config.steps = 4;
  {
    auto writer = Trainer::Create(config);
    ASSERT_OK(writer.status());
    ASSERT_OK((*writer)->Run(nullptr));
  }
  const std::string step_dir = (dir.path() / "tiny" / CheckpointStepDirName(4)).string();
  auto loaded = LoadCheckpoint(step_dir);
  ASSERT_OK(loaded.status());
  std::string where;
  EXPECT_FALSE(MentionsADevice(loaded->manifest, &where)) << "manifest: " << where;
  where.clear();
  EXPECT_FALSE(MentionsADevice(loaded->hf_config, &where)) << "config.json: " << where;

  int resumed_on = 0;
  for (const Device device : {Device::Cpu(), Device::Cuda(0)}) {
    if (!ExecContext::ForDevice(device).ok()) continue;  // no such device here
    TrainerConfig reader_config = TinyTrainerConfig(dir.path());
    reader_config.device = device;
    auto reader = Trainer::Create(reader_config);
    ASSERT_OK(reader.status());
    ASSERT_OK((*reader)->Resume(nullptr));
    EXPECT_EQ((*reader)->step(), 4) << device.DebugString();
    // Not on to step 8: its checkpoint would collide with the next device's resume.
    ++resumed_on;
  }
  EXPECT_GE(resumed_on, 1);
}

// A CUDA job where there is no usable GPU (or no CUDA in the build) is refused when the trainer
// is built, naming why, before anything is allocated.
TEST(TrainerTest, ADeviceThisMachineLacksIsRefused) {
  const absl::StatusOr<ExecContext> gpu = ExecContext::ForDevice(Device::Cuda(0));
  if (gpu.ok()) GTEST_SKIP() << "this machine has cuda:0";
  TrainerConfig config = TinyTrainerConfig("");
  config.device = Device::Cuda(0);
  auto trainer = Trainer::Create(config);
  ASSERT_FALSE(trainer.ok());
  EXPECT_EQ(trainer.status().code(), gpu.status().code()) << trainer.status();
  EXPECT_EQ(trainer.status().message(), gpu.status().message());
}

TEST(TrainerTest, InvalidConfigNamesTheField) {
  TrainerConfig config = TinyTrainerConfig("");
  config.micro_batch_size = 3;
  auto a = Trainer::Create(config);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("train.micro_batch_size = 3"), std::string::npos)
      << a.status();
}

// A first-order Markov source: a model that learns the transition table reaches the entropy
// rate; 0.10 nats of it is the acceptance bar.
TEST(TrainerTest, ReachesTheEntropyRateOfASyntheticSource) {
  TrainerConfig config = TinyTrainerConfig("");
  config.model.vocab_size = 64;
  config.data.vocab_size = 64;
  config.data.synthetic_vocab_size = 64;
  config.data.synthetic_eval_sequences = 64;
  config.model.hidden_size = 64;
  config.model.max_seq_len = 64;
  config.data.seq_len = 64;
  config.data.batch_size = 16;
  config.micro_batch_size = 0;
  config.steps = 200;
  config.schedule.lr = 1e-2f;
  config.schedule.min_lr = 1e-3f;
  config.schedule.warmup_steps = 20;
  config.schedule.total_steps = 200;
  config.optimizer.weight_decay = 0.0f;
  config.eval_every = 200;
  config.log_every = 100;
  auto trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  Recorder recorder;
  ASSERT_OK((*trainer)->Run(&recorder));
  ASSERT_TRUE((*trainer)->best_possible_loss().has_value());
  const double entropy = *(*trainer)->best_possible_loss();
  ASSERT_FALSE(recorder.reports.empty());
  ASSERT_TRUE(recorder.reports.back().eval_loss.has_value());
  const double eval_loss = *recorder.reports.back().eval_loss;
  std::printf("entropy rate %.4f nats, eval loss %.4f, first train loss %.4f\n", entropy, eval_loss,
              recorder.reports.front().loss);
  EXPECT_LT(eval_loss, entropy + 0.10);
  EXPECT_GT(eval_loss, entropy - 0.05) << "below the entropy rate: the eval set leaks";
}

}  // namespace
}  // namespace moetrain
