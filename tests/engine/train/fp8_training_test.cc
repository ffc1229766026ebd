// FP8 training end to end on the tiny MoE transformer: every recipe trains to within 2 % of the
// bf16 loss, a delayed-scaling job resumes bit-identically (its amax histories and scales are in
// the checkpoint), and evaluation leaves the recipe's state alone.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/fp8/fp8_state.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using testutil::TempDir;

class Recorder : public TrainObserver {
 public:
  void OnStep(const StepReport& report) override { reports.push_back(report); }
  std::vector<StepReport> reports;
};

TrainerConfig Fp8Config(const std::string& dir, Fp8RecipeKind recipe) {
  TrainerConfig c = testing_config::TinyTrainerConfig(dir);
  c.compute_dtype = DType::kBF16;
  Fp8RecipeConfig fp8;
  fp8.recipe = recipe;
  fp8.amax_history_len = 4;  // short, so that the history rolls over within the run
  fp8.pow2_scales = recipe == Fp8RecipeKind::kBlockwise;
  c.fp8 = fp8;
  return c;
}

// The recipe's state as the checkpoint holds it.
std::vector<float> SavedState(Trainer& trainer) {
  Fp8State* state = trainer.model().fp8_state();
  EXPECT_NE(state, nullptr);
  if (state == nullptr) return {};
  absl::StatusOr<Tensor> saved = state->SaveState();
  EXPECT_TRUE(saved.ok()) << saved.status();
  if (!saved.ok() || saved->empty()) return {};
  return std::vector<float>(saved->data<float>(), saved->data<float>() + saved->numel());
}

// The mean loss of the last `n` steps: one step's loss is noisy on 8 sequences.
double TailLoss(const std::vector<StepReport>& reports, size_t n) {
  double sum = 0;
  for (size_t i = reports.size() - n; i < reports.size(); ++i) sum += reports[i].loss;
  return sum / static_cast<double>(n);
}

class Fp8RecipeTest : public ::testing::TestWithParam<Fp8RecipeKind> {};

TEST_P(Fp8RecipeTest, TrainsWithinTwoPercentOfBf16) {
  TempDir bf16_dir, fp8_dir;
  TrainerConfig bf16 = testing_config::TinyTrainerConfig(bf16_dir.path());
  bf16.compute_dtype = DType::kBF16;
  TrainerConfig fp8 = Fp8Config(fp8_dir.path(), GetParam());
  for (TrainerConfig* c : {&bf16, &fp8}) {
    c->steps = c->schedule.total_steps = 40;
    c->checkpoint_dir.clear();
  }
  Recorder bf16_steps, fp8_steps;
  auto a = Trainer::Create(bf16);
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(&bf16_steps));
  auto b = Trainer::Create(fp8);
  ASSERT_OK(b.status());
  ASSERT_OK((*b)->Run(&fp8_steps));
  ASSERT_EQ(fp8_steps.reports.size(), 40u);
  const double bf16_loss = TailLoss(bf16_steps.reports, 5);
  const double fp8_loss = TailLoss(fp8_steps.reports, 5);
  // Training moved: the FP8 run learned, it did not merely stay near the start.
  EXPECT_LT(fp8_loss, fp8_steps.reports.front().loss * 0.9);
  EXPECT_NEAR(fp8_loss, bf16_loss, 0.02 * bf16_loss)
      << Fp8RecipeName(GetParam()) << ": fp8 " << fp8_loss << ", bf16 " << bf16_loss;
  // And it is not bf16 under another name: some GEMM input was really quantised.
  EXPECT_NE(fp8_steps.reports.back().loss, bf16_steps.reports.back().loss);
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8RecipeTest,
                         ::testing::Values(Fp8RecipeKind::kDelayed, Fp8RecipeKind::kCurrent,
                                           Fp8RecipeKind::kBlockwise, Fp8RecipeKind::kMxfp8),
                         [](const auto& info) { return std::string(Fp8RecipeName(info.param)); });

TEST(Fp8TrainingTest, DelayedScalingResumesBitIdentically) {
  TempDir straight_dir, resumed_dir;
  Recorder straight;
  auto a = Trainer::Create(Fp8Config(straight_dir.path(), Fp8RecipeKind::kDelayed));
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(&straight));
  ASSERT_EQ(straight.reports.size(), 8u);

  TrainerConfig first_half = Fp8Config(resumed_dir.path(), Fp8RecipeKind::kDelayed);
  first_half.steps = 4;
  Recorder resumed;
  std::vector<float> state_at_4;
  {
    auto b = Trainer::Create(first_half);
    ASSERT_OK(b.status());
    ASSERT_OK((*b)->Run(&resumed));
    state_at_4 = SavedState(**b);
  }
  auto c = Trainer::Create(Fp8Config(resumed_dir.path(), Fp8RecipeKind::kDelayed));
  ASSERT_OK(c.status());
  ASSERT_OK((*c)->Resume(nullptr));
  // The scales and histories came back from the checkpoint, not from a fresh start.
  ASSERT_FALSE(state_at_4.empty());
  EXPECT_EQ(SavedState(**c), state_at_4);
  ASSERT_OK((*c)->Run(&resumed));
  ASSERT_EQ(resumed.reports.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(std::memcmp(&straight.reports[i].loss, &resumed.reports[i].loss, sizeof(double)), 0)
        << "step " << i + 1 << ": " << straight.reports[i].loss << " vs "
        << resumed.reports[i].loss;
  }
  EXPECT_EQ(SavedState(**a), SavedState(**c));
}

TEST(Fp8TrainingTest, ADelayedJobDoesNotResumeFromACheckpointWithoutFp8State) {
  TempDir dir;
  TrainerConfig bf16 = testing_config::TinyTrainerConfig(dir.path());
  bf16.compute_dtype = DType::kBF16;
  bf16.steps = 4;
  {
    auto a = Trainer::Create(bf16);
    ASSERT_OK(a.status());
    ASSERT_OK((*a)->Run(nullptr));
  }
  auto b = Trainer::Create(Fp8Config(dir.path(), Fp8RecipeKind::kDelayed));
  ASSERT_OK(b.status());
  const absl::Status resumed = (*b)->Resume(nullptr);
  EXPECT_FALSE(resumed.ok());
  EXPECT_NE(resumed.ToString().find("fp8_state"), std::string::npos) << resumed;
}

TEST(Fp8TrainingTest, EvaluationLeavesTheScalesAlone) {
  TempDir dir;
  TrainerConfig c = Fp8Config(dir.path(), Fp8RecipeKind::kDelayed);
  c.steps = 3;
  c.checkpoint_dir.clear();
  c.data.eval_fraction = 0;  // synthetic eval data comes from its own stream
  auto a = Trainer::Create(c);
  ASSERT_OK(a.status());
  ASSERT_OK((*a)->Run(nullptr));
  const std::vector<float> before = SavedState(**a);
  ASSERT_OK((*a)->Evaluate().status());
  // A step's amaxes enter the history only at EndStep; an evaluation recorded none to enter.
  Fp8State* state = (*a)->model().fp8_state();
  ASSERT_OK(state->EndStep(nullptr));
  const std::vector<float> after = SavedState(**a);
  ASSERT_EQ(before.size(), after.size());
  // EndStep moved this "step's" amax (h[0]) to the end of each history: zero, since the
  // evaluation recorded nothing; the scales are unchanged.
  const size_t len = static_cast<size_t>(c.fp8->amax_history_len), width = 1 + len;
  for (size_t row = 0; row * width < before.size(); ++row) {
    EXPECT_EQ(before[row * width], after[row * width]) << "scale of slot " << row;
    EXPECT_EQ(after[row * width + len], 0.0f) << "newest history entry of slot " << row;
  }
}

}  // namespace
}  // namespace moetrain
