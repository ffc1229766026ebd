// The trainer's step is the step written out by hand: forward and backward of each micro-batch
// with the gradients scaled by 1/M, the global gradient norm, a clip that clips, AdamW at the
// learning rate of the schedule, the expert-bias update from the step's token counts, then the
// compute weights refreshed and the gradients zeroed. Both give the same bits.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/exec_context.h"
#include "engine/model/transformer.h"
#include "engine/train/data.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"

namespace moetrain {
namespace {

class Recorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  std::vector<StepReport> reports;
};

std::vector<float> Contents(const TensorView& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(TrainerStepTest, TheTrainersStepIsTheStepComposedByHand) {
  TrainerConfig config = testing_config::TinyTrainerConfig("");
  config.steps = 3;
  config.schedule.total_steps = 3;
  config.grad_clip = 0.1;  // the tiny model's gradients are near 1: this clips every step
  ASSERT_TRUE(config.model.moe.expert_bias);
  ASSERT_EQ(config.data.batch_size / config.micro_batch_size, 2);

  Recorder recorder;
  auto trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&recorder));
  ASSERT_EQ(recorder.reports.size(), 3u);

  // By hand, on one rank.
  const ExecContext ctx = ExecContext::Cpu();
  auto model = Transformer::Create(config.model, config.compute_dtype, {}, ctx);
  ASSERT_OK(model.status());
  ASSERT_OK(model->Initialize(config.seed));
  std::vector<Parameter> trainable, dense, experts;
  for (const NamedParameter& p : model->parameters()) {
    if (!p.trainable) continue;
    const Parameter param = {p.name, p.value, p.grad, p.weight_decay};
    trainable.push_back(param);
    (p.expert ? experts : dense).push_back(param);
  }
  auto optimizer = AdamW::Create(ctx, config.optimizer, trainable);
  ASSERT_OK(optimizer.status());
  auto data = DataLoader::Create(config.data, /*rank=*/0, /*world_size=*/1);
  ASSERT_OK(data.status());
  const int64_t micro_batches = 2, layers = model->num_moe_layers();
  const int64_t experts_per_layer = config.model.moe.num_experts;

  for (int64_t step = 0; step < config.steps; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step + 1);
    ASSERT_OK_AND_ASSIGN(const Tensor batch, data->Next());
    double loss = 0;
    std::vector<std::vector<int64_t>> counts(layers, std::vector<int64_t>(experts_per_layer, 0));
    for (int64_t m = 0; m < micro_batches; ++m) {
      const int64_t rows = batch.dim(0) / micro_batches;
      auto result = model->ForwardBackward(batch.view().Slice(m * rows, (m + 1) * rows),
                                           1.0f / static_cast<float>(micro_batches));
      ASSERT_OK(result.status());
      loss += result->loss;
      for (int64_t l = 0; l < layers; ++l) {
        for (int64_t e = 0; e < experts_per_layer; ++e) {
          counts[l][e] += result->moe_layers[l].tokens_per_expert[e];
        }
      }
    }
    // The global norm: the dense gradients, then the expert shards (one, on one rank).
    auto dense_squares = GradSquaredSum(ctx, dense);
    auto expert_squares = GradSquaredSum(ctx, experts);
    ASSERT_OK(dense_squares.status());
    ASSERT_OK(expert_squares.status());
    const double norm = std::sqrt(*dense_squares + *expert_squares);
    EXPECT_GT(norm, config.grad_clip) << "the clip must clip for this test to cover it";
    ASSERT_OK(ClipGradsToNorm(ctx, trainable, config.grad_clip, norm));
    auto clipped = GlobalGradNorm(ctx, trainable);
    ASSERT_OK(clipped.status());
    EXPECT_NEAR(*clipped, config.grad_clip, 1e-6);
    const float lr = LearningRate(config.schedule, step);
    ASSERT_OK(optimizer->Step(lr));
    ASSERT_OK(model->UpdateExpertBiases(counts));
    ASSERT_OK(model->SyncComputeWeights());
    ASSERT_OK(model->ZeroGrads());

    const StepReport& report = recorder.reports[step];
    loss /= micro_batches;
    EXPECT_EQ(std::memcmp(&report.loss, &loss, sizeof(double)), 0) << report.loss << " vs " << loss;
    EXPECT_EQ(report.grad_norm, norm);
    EXPECT_EQ(report.lr, static_cast<double>(lr));
  }
  // Every parameter, the expert biases included, holds the same bits.
  EXPECT_EQ(Contents((*trainer)->model().master_buffer()), Contents(model->master_buffer()));
  // The bias moved: the update ran.
  bool bias_moved = false;
  for (const NamedParameter& p : model->parameters()) {
    if (p.name.find("e_score_correction_bias") == std::string::npos) continue;
    for (float b : Contents(p.value)) bias_moved |= b != 0.0f;
  }
  EXPECT_TRUE(bias_moved);
}

}  // namespace
}  // namespace moetrain
