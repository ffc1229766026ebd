// The trainer's step phase times (TrainObserver::OnStepPhases): one call after every step, logged
// or not, before that step's OnStep; forward and backward timed over every micro-batch; the phases
// fit within the step's wall time.
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "gtest/gtest.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/engine/train/tiny_trainer_config.h"

namespace moetrain {
namespace {

class PhaseRecorder : public TrainObserver {
 public:
  void OnStepPhases(const StepPhaseSeconds& phases) override {
    events.push_back("phases");
    this->phases.push_back(phases);
  }
  void OnStep(const StepReport& report) override {
    events.push_back("step " + std::to_string(report.step));
    reports.push_back(report);
  }
  std::vector<std::string> events;
  std::vector<StepPhaseSeconds> phases;
  std::vector<StepReport> reports;
};

TEST(TrainerPhasesTest, EveryStepIsTimedByPhaseWithinItsWallTime) {
  TrainerConfig config = testing_config::TinyTrainerConfig("");
  config.steps = 4;
  config.schedule.total_steps = 4;
  config.log_every = 4;  // steps 1 and 4 are logged, 2 and 3 are not
  ASSERT_EQ(config.micro_batches(), 2);

  PhaseRecorder recorder;
  auto trainer = Trainer::Create(config);
  ASSERT_OK(trainer.status());
  ASSERT_OK((*trainer)->Run(&recorder));
  EXPECT_EQ(recorder.events,
            (std::vector<std::string>{"phases", "step 1", "phases", "phases", "phases", "step 4"}));
  ASSERT_EQ(recorder.phases.size(), 4u);
  for (size_t i = 0; i < recorder.phases.size(); ++i) {
    SCOPED_TRACE(i);
    const StepPhaseSeconds& p = recorder.phases[i];
    // Every phase runs code on the CPU: a forward and backward pass of a real model, an AdamW
    // update. A world of one has no collective to wait for, but grad_sync still finishes.
    EXPECT_GT(p.forward, 0.0);
    EXPECT_GT(p.backward, 0.0);
    EXPECT_GE(p.communication, 0.0);
    EXPECT_GT(p.optimizer, 0.0);
  }
  // The logged steps: the phases are disjoint parts of the step's wall time.
  const StepPhaseSeconds* logged[] = {&recorder.phases[0], &recorder.phases[3]};
  for (int i = 0; i < 2; ++i) {
    const StepPhaseSeconds& p = *logged[i];
    const double sum = p.forward + p.backward + p.communication + p.optimizer;
    EXPECT_LE(sum, recorder.reports[i].step_seconds * (1 + 1e-9));
  }
}

}  // namespace
}  // namespace moetrain
