// Step reports against the job's model on a real store and coordinator: the arrays a genuine
// worker sends (one load per MoE layer, MoE layers × experts token counts, FP8 statistics per
// block and per routed expert under FP8) are accepted; any other length or index is refused,
// naming the field, the index or length and the model's figure, and changes nothing stored.
#include <string>
#include <utility>
#include <vector>

#include "moetrain/v1/job_spec.h"
#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class FleetStepReportTest : public FleetTest {
 protected:
  // A one-worker job of `model_and_train` (YAML of the model and train sections) whose rank
  // runs: 4 blocks, the first dense, 8 experts, unless the YAML says otherwise.
  RunningJob StartJob(const std::string& model_and_train) {
    RunningJob running;
    running.worker_id = Register();
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
        absl::StrCat("name: reports\nresources:\n  workers: 1\n  device: CPU\n", model_and_train));
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<JobRecord> job = coordinator_->Submit("reports-1", *spec, 0);
    EXPECT_TRUE(job.ok()) << job.status();
    running.job = *job;
    running.assignment = AwaitAssignment(running.worker_id);
    EXPECT_OK(Heartbeat(running.worker_id, {running.assignment}).status());
    return running;
  }

  absl::Status Report(const RunningJob& running, const v1::StepMetrics& metrics) {
    v1::ReportStepRequest request = StepReport(running.worker_id, running.assignment, 1);
    *request.mutable_metrics() = metrics;
    return fleet_->ReportStep(request);
  }

  static v1::StepMetrics Step(int64_t step) {
    v1::StepMetrics metrics;
    metrics.set_step(step);
    metrics.set_loss(2.0);
    return metrics;
  }

  static void AddFp8(int64_t layer, int64_t expert,
                     google::protobuf::RepeatedPtrField<v1::Fp8Stats>* to) {
    v1::Fp8Stats* stats = to->Add();
    stats->set_layer(layer);
    stats->set_expert(expert);
    stats->mutable_input()->set_amax(1.5f);
  }
};

constexpr char kDefaultModel[] = "train:\n  steps: 20\n";
// 3 blocks and 1 MTP module (blocks 0..3), block 0 dense, 4 experts, FP8.
constexpr char kFp8Model[] =
    "model:\n  num_layers: 3\n  mtp_depth: 1\n  moe:\n    num_experts: 4\n"
    "train:\n  steps: 20\n  precision: FP8\n";

TEST_F(FleetStepReportTest, ReportsShapedLikeTheModelAreAccepted) {
  StartFleet();
  const RunningJob running = StartJob(kDefaultModel);
  v1::StepMetrics none = Step(1);  // no MoE statistics at all (an evaluation, say)
  EXPECT_OK(Report(running, none));
  v1::StepMetrics full = Step(2);
  for (int layer = 0; layer < 3; ++layer) full.add_expert_load_per_layer(1.25);
  for (int count = 0; count < 3 * 8; ++count) full.add_expert_tokens(16);
  EXPECT_OK(Report(running, full));
  EXPECT_EQ(RecordedSteps(running.job.id), (std::vector<int64_t>{1, 2}));
}

TEST_F(FleetStepReportTest, MoeArraysOfAnotherShapeAreRefused) {
  StartFleet();
  const RunningJob running = StartJob(kDefaultModel);
  v1::StepMetrics loads = Step(1);
  for (int layer = 0; layer < 4; ++layer) loads.add_expert_load_per_layer(1.0);
  absl::Status status = Report(running, loads);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("metrics.expert_load_per_layer has 4 entries"),
                    HasSubstr("3 MoE layers"), HasSubstr("a report has 3 or none")));

  v1::StepMetrics tokens = Step(1);
  for (int count = 0; count < 3 * 8 + 1; ++count) tokens.add_expert_tokens(1);
  status = Report(running, tokens);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("metrics.expert_tokens has 25 entries"), HasSubstr("of 8 experts")));

  // FP8 statistics of a job that does not train in FP8.
  v1::StepMetrics fp8 = Step(1);
  AddFp8(1, 0, fp8.mutable_fp8_layers());
  status = Report(running, fp8);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("metrics.fp8_layers has 1 entries"),
                                      HasSubstr("train.precision is not FP8")));

  // Nothing of them was recorded, and step 1 is still free to report.
  EXPECT_TRUE(RecordedSteps(running.job.id).empty());
  EXPECT_OK(Report(running, Step(1)));
}

TEST_F(FleetStepReportTest, Fp8StatisticsMustNameTheModelsBlocksAndExpertsInOrder) {
  StartFleet();
  const RunningJob running = StartJob(kFp8Model);
  v1::StepMetrics genuine = Step(1);
  for (int layer = 0; layer < 4; ++layer) AddFp8(layer, 0, genuine.mutable_fp8_layers());
  for (int layer = 1; layer < 4; ++layer) {
    for (int expert = 0; expert < 4; ++expert) {
      AddFp8(layer, expert, genuine.mutable_fp8_experts());
    }
  }
  EXPECT_OK(Report(running, genuine));

  // Each: (layer, expert) entries of fp8_layers, then of fp8_experts, and the error they get.
  struct Case {
    const char* what;
    std::vector<std::pair<int64_t, int64_t>> layers, experts;
    const char* message;
  };
  std::vector<Case> cases = {
      {"a block past the model",
       {{0, 0}, {1000000, 0}},
       {},
       "metrics.fp8_layers[1].layer = 1000000 is outside [0, 4)"},
      {"a negative block", {{-1, 0}}, {}, "metrics.fp8_layers[0].layer = -1 is outside [0, 4)"},
      {"a block twice",
       {{2, 0}, {2, 0}},
       {},
       "metrics.fp8_layers[1] (layer 2, expert 0) does not come after entry 0"},
      {"an expert in a layer entry", {{1, 3}}, {}, "metrics.fp8_layers[0].expert = 3"},
      {"an expert of the dense block",
       {},
       {{0, 1}},
       "metrics.fp8_experts[0].layer = 0 is outside [1, 4)"},
      {"an expert past num_experts",
       {},
       {{1, 4}},
       "metrics.fp8_experts[0].expert = 4 is outside [0, 4)"},
      {"experts out of order",
       {},
       {{2, 1}, {1, 3}},
       "metrics.fp8_experts[1] (layer 1, expert 3) does not come after entry 0"}};
  // The attack: many entries with arbitrary indices, each a new /metrics series before.
  Case& flood = cases.emplace_back(
      Case{"a flood of indices", {}, {}, "metrics.fp8_layers[1].layer = 7919 is outside [0, 4)"});
  for (int64_t i = 0; i < 100000; ++i) flood.layers.emplace_back(7919 * i, 0);
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.what);
    v1::StepMetrics metrics = Step(2);
    for (const auto& [layer, expert] : bad.layers)
      AddFp8(layer, expert, metrics.mutable_fp8_layers());
    for (const auto& [layer, expert] : bad.experts) {
      AddFp8(layer, expert, metrics.mutable_fp8_experts());
    }
    const absl::Status status = Report(running, metrics);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_THAT(status.message(), HasSubstr(bad.message));
  }
  EXPECT_EQ(RecordedSteps(running.job.id), std::vector<int64_t>{1});
}

}  // namespace
}  // namespace moetrain::server
