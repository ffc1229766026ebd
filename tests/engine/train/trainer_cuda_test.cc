// The trainer on a GPU against the trainer on the CPU: the same job (examples/tiny-moe.yaml's
// model and data, a few steps) trains to the same losses, two GPU runs are bit-identical, and a
// checkpoint moves between the devices in both directions. Skips without a GPU.
//
// Tolerances (relative, per step's loss): 1e-4 in f32, where only the order of the kernels'
// float sums differs from the CPU's; 2e-2 in bf16, where that order also changes which values
// round to which bf16 neighbour in every GEMM's inputs.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using testutil::TempDir;

// examples/tiny-moe.yaml's model and data (softmax routing, switch aux loss, GQA, one dense
// block), on the trainer tests' tiny job settings, `steps` steps with every step logged. Only
// what differs from TinyTrainerConfig is set here: its 4 heads, 2 kv heads, one dense block,
// top-2 and switch aux loss are the example's too, its 2 warmup steps and every-step log kept.
TrainerConfig TinyMoeConfig(const std::string& checkpoint_dir, Device device, DType dtype,
                            int64_t steps) {
  TrainerConfig c = testing_config::TinyTrainerConfig(checkpoint_dir);
  c.job_id = "tiny-moe";
  c.model.vocab_size = 256;
  c.model.hidden_size = 128;
  c.model.num_layers = 4;
  c.model.ffn_dim = 512;
  c.model.max_seq_len = 128;
  c.model.moe.num_experts = 8;
  c.model.moe.expert_ffn_dim = 128;
  c.model.moe.num_shared_experts = 0;
  c.model.moe.score_function = ScoreFunction::kSoftmax;
  c.model.moe.expert_bias = false;
  c.model.moe.aux_loss_coeff = 0.01f;
  c.data.vocab_size = 256;
  c.data.synthetic_vocab_size = 64;
  c.data.seq_len = 128;
  c.data.batch_size = 16;
  c.data.seed = 7;
  c.micro_batch_size = 0;
  c.schedule.lr = 1e-3f;
  c.schedule.min_lr = 1e-4f;
  c.schedule.total_steps = 6;
  c.seed = 1;
  c.steps = steps;
  c.eval_every = 3;
  c.eval_batches = 2;
  c.checkpoint_every = 3;
  c.device = device;
  c.compute_dtype = dtype;
  return c;
}

double Tolerance(DType dtype) { return dtype == DType::kF32 ? 1e-4 : 2e-2; }

class Recorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  std::vector<StepReport> reports;
};

// Every logged step's loss (and eval loss, where there is one) of `trainer` run to its end.
struct TrainedRun {
  std::vector<StepReport> reports;
  std::vector<float> masters;  // the final f32 weights, on the host
};

void TrainToEnd(Trainer& trainer, TrainedRun* run) {
  Recorder recorder;
  ASSERT_OK(trainer.Run(&recorder));
  run->reports = recorder.reports;
  const TensorView masters = trainer.model().master_buffer();
  run->masters.resize(masters.numel());
  ASSERT_OK(ops::CopyTensor(trainer.model().context(), masters,
                            TensorView(run->masters.data(), DType::kF32, {masters.numel()})));
}

// `got`'s losses (and eval losses) within the dtype's tolerance of the CPU reference `want`'s.
void ExpectLossesClose(const std::vector<StepReport>& got, const std::vector<StepReport>& want,
                       DType dtype, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tolerance = Tolerance(dtype);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i].step) << what;
    ASSERT_TRUE(std::isfinite(got[i].loss)) << what << " step " << got[i].step;
    EXPECT_LE(std::abs(got[i].loss - want[i].loss), tolerance * std::abs(want[i].loss))
        << what << " step " << want[i].step << ": " << got[i].loss << " vs the cpu's "
        << want[i].loss;
    ASSERT_EQ(got[i].eval_loss.has_value(), want[i].eval_loss.has_value()) << what;
    if (want[i].eval_loss.has_value()) {
      EXPECT_LE(std::abs(*got[i].eval_loss - *want[i].eval_loss),
                tolerance * std::abs(*want[i].eval_loss))
          << what << " eval at step " << want[i].step;
    }
  }
}

TEST(TrainerCudaTest, TrainsToTheCpuLossesWithEverythingOnTheDevice) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    TrainedRun cpu_run, cuda_run;
    {
      auto trainer = Trainer::Create(TinyMoeConfig("", Device::Cpu(), dtype, 3));
      ASSERT_OK(trainer.status());
      TrainToEnd(**trainer, &cpu_run);
    }
    {
      auto trainer = Trainer::Create(TinyMoeConfig("", gpu.device(), dtype, 3));
      ASSERT_OK(trainer.status());
      // Parameters and grads on the device (the optimizer's moments are allocated alike).
      EXPECT_EQ((*trainer)->model().master_buffer().device(), gpu.device());
      EXPECT_EQ((*trainer)->model().grad_buffer().device(), gpu.device());
      TrainToEnd(**trainer, &cuda_run);
    }
    ExpectLossesClose(cuda_run.reports, cpu_run.reports, dtype, "cuda vs cpu");
    for (const StepReport& report : cuda_run.reports) {
      // At least the f32 masters, grads and two moments of every parameter.
      EXPECT_GE(report.device_memory_bytes,
                static_cast<int64_t>(4 * sizeof(float) * cuda_run.masters.size() * 9 / 10));
      EXPECT_GE(report.device_memory_peak_bytes, report.device_memory_bytes);
    }
    for (const StepReport& report : cpu_run.reports) {
      EXPECT_EQ(report.device_memory_bytes, 0);
      EXPECT_EQ(report.device_memory_peak_bytes, 0);
    }
  }
}

TEST(TrainerCudaTest, TwoCudaRunsAreBitIdentical) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    TrainedRun runs[2];
    for (TrainedRun& run : runs) {
      auto trainer = Trainer::Create(TinyMoeConfig("", gpu.device(), dtype, 3));
      ASSERT_OK(trainer.status());
      TrainToEnd(**trainer, &run);
    }
    ASSERT_EQ(runs[0].reports.size(), runs[1].reports.size());
    for (size_t i = 0; i < runs[0].reports.size(); ++i) {
      const StepReport &a = runs[0].reports[i], &b = runs[1].reports[i];
      EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << "step " << a.step;
      EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0) << "step " << a.step;
      EXPECT_EQ(a.expert_tokens, b.expert_tokens) << "step " << a.step;
    }
    EXPECT_TRUE(runs[0].masters == runs[1].masters) << "the final weights differ";
  }
}

// A checkpoint written on one device continues on the other: steps 4..6 after the resume match
// the CPU's straight run within the dtype's tolerance (the first three steps ran on the writer's
// device, so the weights differ by its rounding only).
TEST(TrainerCudaTest, CheckpointsMoveBetweenTheCpuAndTheGpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    TrainedRun straight;
    {
      auto trainer = Trainer::Create(TinyMoeConfig("", Device::Cpu(), dtype, 6));
      ASSERT_OK(trainer.status());
      TrainToEnd(**trainer, &straight);
    }
    ASSERT_EQ(straight.reports.size(), 6u);
    const std::vector<StepReport> second_half(straight.reports.begin() + 3, straight.reports.end());
    const struct {
      Device writer, reader;
      const char* name;
    } moves[] = {{gpu.device(), Device::Cpu(), "gpu checkpoint resumed on the cpu"},
                 {Device::Cpu(), gpu.device(), "cpu checkpoint resumed on the gpu"}};
    for (const auto& move : moves) {
      SCOPED_TRACE(move.name);
      TempDir dir;
      int64_t tokens_seen = 0;
      {
        auto writer = Trainer::Create(TinyMoeConfig(dir.path(), move.writer, dtype, 3));
        ASSERT_OK(writer.status());
        TrainedRun first_half;
        TrainToEnd(**writer, &first_half);
        tokens_seen = (*writer)->tokens_seen();
      }
      auto reader = Trainer::Create(TinyMoeConfig(dir.path(), move.reader, dtype, 6));
      ASSERT_OK(reader.status());
      ASSERT_OK((*reader)->Resume(nullptr));
      EXPECT_EQ((*reader)->step(), 3);
      EXPECT_EQ((*reader)->tokens_seen(), tokens_seen);
      TrainedRun resumed;
      TrainToEnd(**reader, &resumed);
      ExpectLossesClose(resumed.reports, second_half, dtype, move.name);
    }
  }
}

}  // namespace
}  // namespace moetrain
