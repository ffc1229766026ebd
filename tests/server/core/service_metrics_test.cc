// ServiceMetrics as /metrics shows it: the series the alert rules and the dashboard
// (deploy/prometheus, deploy/grafana) are built on, read back from the registry's text.
#include "server/core/service_metrics.h"

#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using testutil::Exposition;
using testutil::ExpositionSample;
using testutil::MustParseExposition;
using testutil::PromtoolCheckMetrics;
using testutil::PromtoolResult;
using testutil::SeriesValue;

// The value of the sample `series` (`name{label="value",...}`, labels in any order) in the
// exposition `text`, if it is there.
std::optional<double> Sample(const std::string& text, absl::string_view series) {
  return SeriesValue(MustParseExposition(text), series);
}

double UnixSeconds(absl::Time time) { return absl::ToDoubleSeconds(time - absl::UnixEpoch()); }

class ServiceMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServiceMetrics>> created =
        ServiceMetrics::Create(&registry_, Options());
    ASSERT_TRUE(created.ok()) << created.status();
    metrics_ = std::move(*created);
  }

  virtual ServiceMetricsOptions Options() const { return {}; }

  std::optional<double> Get(absl::string_view series) {
    return Sample(registry_.Serialize(), series);
  }

  MetricsRegistry registry_;
  std::unique_ptr<ServiceMetrics> metrics_;
};

TEST_F(ServiceMetricsTest, ASecondSetOfFamiliesOnTheSameRegistryIsRefused) {
  EXPECT_EQ(ServiceMetrics::Create(&registry_).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ServiceMetricsTest, JobStateIsOneForTheCurrentStateAndZeroForTheEarlierOnes) {
  for (JobState state : {JobState::kScheduled, JobState::kRunning, JobState::kRestarting,
                         JobState::kScheduled, JobState::kRunning, JobState::kSucceeded}) {
    metrics_->OnJobState("job-a", state);
  }
  metrics_->OnJobState("job-b", JobState::kRunning);
  const std::string text = registry_.Serialize();
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-a",state="SUCCEEDED"})"), 1);
  for (const char* earlier : {"SCHEDULED", "RUNNING", "RESTARTING"}) {
    EXPECT_EQ(
        Sample(text, absl::StrCat(R"(moetrain_job_state{job_id="job-a",state=")", earlier, "\"}")),
        0)
        << earlier;
  }
  // States a job never was in have no series (cardinality).
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-a",state="PENDING"})"), std::nullopt);
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-a",state="FAILED"})"), std::nullopt);
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-b",state="RUNNING"})"), 1);
}

TEST_F(ServiceMetricsTest, ProgressIsAStepReportOrAMoveToRunning) {
  const std::string progress = R"(moetrain_job_last_progress_timestamp_seconds{job_id="job-a"})";
  metrics_->OnJobState("job-a", JobState::kScheduled);
  EXPECT_EQ(Get(progress), std::nullopt) << "a job that never ran has made no progress";

  absl::Time before = absl::Now();
  metrics_->OnJobState("job-a", JobState::kRunning);
  absl::Time after = absl::Now();
  ASSERT_TRUE(Get(progress).has_value());
  EXPECT_GE(*Get(progress), UnixSeconds(before));
  EXPECT_LE(*Get(progress), UnixSeconds(after));

  v1::StepMetrics step;
  step.set_step(7);
  before = absl::Now();
  metrics_->OnStep("job-a", step, 128);
  after = absl::Now();
  EXPECT_GE(*Get(progress), UnixSeconds(before));
  EXPECT_LE(*Get(progress), UnixSeconds(after));
  EXPECT_EQ(Get(R"(moetrain_train_step{job_id="job-a"})"), 7);
}

TEST_F(ServiceMetricsTest, ACheckpointIsRecordedOnceItIsGoodAndEveryRankWriteIsTimed) {
  metrics_->OnAttemptStart("job-a", /*checkpoint_every_steps=*/20, /*latest_checkpoint_step=*/0);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_interval_steps{job_id="job-a"})"), 20);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_step{job_id="job-a"})"), 0);

  // Two ranks write step 40; only then is it good.
  metrics_->OnCheckpointWritten("job-a", absl::Milliseconds(30));
  metrics_->OnCheckpointWritten("job-a", absl::Milliseconds(50));
  EXPECT_EQ(Get(R"(moetrain_checkpoint_duration_seconds_count{job_id="job-a"})"), 2);
  EXPECT_DOUBLE_EQ(*Get(R"(moetrain_checkpoint_duration_seconds_sum{job_id="job-a"})"), 0.08);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_success_timestamp_seconds{job_id="job-a"})"),
            std::nullopt);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_step{job_id="job-a"})"), 0);

  const absl::Time when = absl::FromUnixSeconds(1800000000);
  metrics_->OnCheckpointGood("job-a", 40, when);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_success_timestamp_seconds{job_id="job-a"})"),
            1800000000);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_step{job_id="job-a"})"), 40);

  // A later attempt resumes from that checkpoint; a spec without an interval says 0.
  metrics_->OnAttemptStart("job-b", /*checkpoint_every_steps=*/0, /*latest_checkpoint_step=*/60);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_interval_steps{job_id="job-b"})"), 0);
  EXPECT_EQ(Get(R"(moetrain_checkpoint_last_step{job_id="job-b"})"), 60);
}

TEST_F(ServiceMetricsTest, LostWorkersAreCountedFromZero) {
  EXPECT_EQ(Get("moetrain_workers_lost_total"), 0);
  metrics_->OnWorkerLost();
  metrics_->OnWorkerLost();
  EXPECT_EQ(Get("moetrain_workers_lost_total"), 2);
}

// Every per-job series the service writes, for one job.
void ReportEverything(ServiceMetrics& metrics, const std::string& job_id) {
  metrics.OnJob(job_id, "name-of-" + job_id);
  metrics.OnAttemptStart(job_id, /*checkpoint_every_steps=*/10, /*latest_checkpoint_step=*/0);
  metrics.OnJobState(job_id, JobState::kScheduled);
  metrics.OnJobState(job_id, JobState::kRunning);
  v1::StepMetrics step;
  step.set_step(5);
  step.set_loss(2.5);
  step.set_eval_loss(2.75);
  step.set_step_seconds(0.1);
  step.set_dropped_tokens(3);
  step.add_expert_load_per_layer(1.5);
  step.add_expert_load_per_layer(1.25);
  step.set_device_memory_bytes(3 << 20);
  step.set_device_memory_peak_bytes(5 << 20);
  metrics.OnStep(job_id, step, 640);
  metrics.OnCheckpointWritten(job_id, absl::Milliseconds(20));
  metrics.OnCheckpointGood(job_id, 5, absl::FromUnixSeconds(1800000000));
  metrics.OnRestart(job_id);
  metrics.OnJobState(job_id, JobState::kFailed);
}

// The samples of `text` that carry the label job_id="<job_id>".
std::vector<ExpositionSample> SamplesOfJob(const std::string& text, const std::string& job_id) {
  return MustParseExposition(text).WithLabel("job_id", job_id);
}

TEST_F(ServiceMetricsTest, RetireJobRemovesEverySeriesOfThatJobOnly) {
  ReportEverything(*metrics_, "job-a");
  ReportEverything(*metrics_, "job-b");
  metrics_->OnWorkerLost();
  metrics_->SetJobsByState({{JobState::kFailed, 2}});
  const std::string before = registry_.Serialize();
  const std::vector<ExpositionSample> series_of_b = SamplesOfJob(before, "job-b");
  // 14 plain gauges, 3 counters, the info, 2 expert-load layers, 3 states, and two histograms
  // of 16 and 14 bounds (a bucket per bound, +Inf, _sum and _count).
  EXPECT_EQ(series_of_b.size(), 14u + 3 + 1 + 2 + 3 + (16 + 3) + (14 + 3)) << before;
  EXPECT_EQ(SamplesOfJob(before, "job-a").size(), series_of_b.size());

  metrics_->RetireJob("job-a");
  const std::string after = registry_.Serialize();
  EXPECT_EQ(SamplesOfJob(after, "job-a"), std::vector<ExpositionSample>()) << after;
  EXPECT_EQ(SamplesOfJob(after, "job-b"), series_of_b);
  EXPECT_EQ(Sample(after, "moetrain_workers_lost_total"), 1);
  EXPECT_EQ(Sample(after, R"(moetrain_jobs{state="FAILED"})"), 2);

  // Retiring it again, or a job never seen, changes nothing.
  metrics_->RetireJob("job-a");
  metrics_->RetireJob("job-never-seen");
  EXPECT_EQ(MustParseExposition(registry_.Serialize()).samples, MustParseExposition(after).samples);
}

TEST_F(ServiceMetricsTest, AJobReportedAgainAfterRetirementStartsOver) {
  ReportEverything(*metrics_, "job-a");
  metrics_->RetireJob("job-a");
  // Its state before retirement is forgotten too: no FAILED series set to 0 comes back.
  metrics_->OnJobState("job-a", JobState::kRunning);
  metrics_->OnRestart("job-a");
  const std::string text = registry_.Serialize();
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-a",state="RUNNING"})"), 1);
  EXPECT_EQ(Sample(text, R"(moetrain_job_state{job_id="job-a",state="FAILED"})"), std::nullopt);
  EXPECT_EQ(Sample(text, R"(moetrain_job_restarts_total{job_id="job-a"})"), 1);
  EXPECT_EQ(Sample(text, R"(moetrain_train_loss{job_id="job-a"})"), std::nullopt);
}

// Reports about one job race retirements of another, and of their own, with scrapes alongside:
// RetireJob waits for updates in flight, and the job that is never retired keeps exact totals.
TEST_F(ServiceMetricsTest, RetirementsRaceReportsSafely) {
  constexpr int kIterations = 2000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_FALSE(registry_.Serialize().empty());
  });
  std::thread churn([&] {
    for (int i = 0; i < kIterations; ++i) {
      ReportEverything(*metrics_, "job-churn");
      metrics_->RetireJob("job-churn");
    }
  });
  std::thread retirer([&] {
    for (int i = 0; i < kIterations; ++i) metrics_->RetireJob("job-churn");
  });
  v1::StepMetrics step;
  for (int i = 1; i <= kIterations; ++i) {
    step.set_step(i);
    metrics_->OnStep("job-kept", step, 10);
    metrics_->OnRestart("job-kept");
  }
  churn.join();
  retirer.join();
  done.store(true);
  scraper.join();
  metrics_->RetireJob("job-churn");
  const std::string text = registry_.Serialize();
  EXPECT_EQ(SamplesOfJob(text, "job-churn"), std::vector<ExpositionSample>());
  EXPECT_EQ(Sample(text, R"(moetrain_train_tokens_total{job_id="job-kept"})"), 10 * kIterations);
  EXPECT_EQ(Sample(text, R"(moetrain_job_restarts_total{job_id="job-kept"})"), kIterations);
  EXPECT_EQ(Sample(text, R"(moetrain_train_step{job_id="job-kept"})"), kIterations);
}

TEST_F(ServiceMetricsTest, DeviceMemoryIsTheLastReportedStepsAndZeroOnTheCpu) {
  v1::StepMetrics gpu;
  gpu.set_step(1);
  gpu.set_device_memory_bytes(int64_t{3} << 30);
  gpu.set_device_memory_peak_bytes(int64_t{5} << 30);
  metrics_->OnStep("job-gpu", gpu, 10);
  v1::StepMetrics cpu;
  cpu.set_step(1);
  metrics_->OnStep("job-cpu", cpu, 10);
  const std::string text = registry_.Serialize();
  EXPECT_EQ(Sample(text, R"(moetrain_job_device_memory_bytes{job_id="job-gpu"})"),
            static_cast<double>(int64_t{3} << 30))
      << text;
  EXPECT_EQ(Sample(text, R"(moetrain_job_device_memory_peak_bytes{job_id="job-gpu"})"),
            static_cast<double>(int64_t{5} << 30));
  // A CPU job reports 0, and has the series as it has the others (the dashboard's panel needs
  // it).
  EXPECT_EQ(Sample(text, R"(moetrain_job_device_memory_bytes{job_id="job-cpu"})"), 0);
  EXPECT_EQ(Sample(text, R"(moetrain_job_device_memory_peak_bytes{job_id="job-cpu"})"), 0);
  const Exposition parsed = MustParseExposition(text);
  EXPECT_EQ(parsed.TypeOf("moetrain_job_device_memory_bytes"), "gauge");
  EXPECT_EQ(parsed.TypeOf("moetrain_job_device_memory_peak_bytes"), "gauge");
}

TEST_F(ServiceMetricsTest, TheNewFamiliesHaveTheirTypes) {
  metrics_->OnJobState("job-a", JobState::kRunning);
  metrics_->OnAttemptStart("job-a", 10, 0);
  const Exposition parsed = MustParseExposition(registry_.Serialize());
  for (const auto& [name, type] :
       std::map<std::string, std::string>{{"moetrain_job_state", "gauge"},
                                          {"moetrain_job_last_progress_timestamp_seconds", "gauge"},
                                          {"moetrain_checkpoint_last_step", "gauge"},
                                          {"moetrain_checkpoint_interval_steps", "gauge"},
                                          {"moetrain_workers_lost_total", "counter"}}) {
    EXPECT_EQ(parsed.TypeOf(name), type) << name;
  }
}

v1::Fp8OperandStats* SetOperand(v1::Fp8OperandStats* operand, float amax, float scale_min,
                                float scale_max, int64_t saturated) {
  operand->set_amax(amax);
  operand->set_scale_min(scale_min);
  operand->set_scale_max(scale_max);
  operand->set_saturated(saturated);
  return operand;
}

// A step of an FP8 job with two layers (the second an MoE layer of two experts) under per-tensor
// scaling, except the second layer's weights (as if blockwise: scale 0).
v1::StepMetrics Fp8Step(int64_t saturated) {
  v1::StepMetrics step;
  step.set_step(1);
  for (int layer = 0; layer < 2; ++layer) {
    v1::Fp8Stats* stats = step.add_fp8_layers();
    stats->set_layer(layer);
    SetOperand(stats->mutable_input(), 3.5f + layer, 128, 256, saturated);
    SetOperand(stats->mutable_weight(), 0.25f, layer == 0 ? 1024 : 0, layer == 0 ? 2048 : 0, 0);
    SetOperand(stats->mutable_grad(), 1e-3f, 65536, 65536, 2 * saturated);
  }
  for (int expert = 0; expert < 2; ++expert) {
    v1::Fp8Stats* stats = step.add_fp8_experts();
    stats->set_layer(1);
    stats->set_expert(expert);
    SetOperand(stats->mutable_input(), 4.5f - expert, 128, 128, saturated + expert);
    SetOperand(stats->mutable_weight(), 0.25f, 0, 0, 0);
    SetOperand(stats->mutable_grad(), 1e-3f, 65536, 65536, 0);
  }
  return step;
}

TEST_F(ServiceMetricsTest, Fp8StatisticsPerLayerAndRole) {
  metrics_->OnStep("job-a", Fp8Step(5), 10);
  metrics_->OnStep("job-a", Fp8Step(7), 10);
  metrics_->OnStep("job-bf16", v1::StepMetrics(), 10);
  const std::string text = registry_.Serialize();
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_amax{job_id="job-a",layer="0",role="input"})"), 3.5)
      << text;
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_amax{job_id="job-a",layer="1",role="input"})"), 4.5);
  // The text keeps 16 significant digits; 1e-3f as a double needs 17.
  EXPECT_DOUBLE_EQ(
      Sample(text, R"(moetrain_job_fp8_amax{job_id="job-a",layer="1",role="grad"})").value_or(0),
      static_cast<double>(1e-3f));
  // The smallest of the layer's scales.
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_scale{job_id="job-a",layer="0",role="input"})"), 128);
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_scale{job_id="job-a",layer="0",role="weight"})"),
            1024);
  // Block scalings keep no per-tensor scale: no series rather than a 0.
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_scale{job_id="job-a",layer="1",role="weight"})"),
            std::nullopt);
  // Saturations add up over the reported steps.
  EXPECT_EQ(
      Sample(text,
             R"(moetrain_job_fp8_saturated_values_total{job_id="job-a",layer="1",role="grad"})"),
      24);
  EXPECT_EQ(
      Sample(text,
             R"(moetrain_job_fp8_saturated_values_total{job_id="job-a",layer="0",role="weight"})"),
      0);
  const Exposition parsed = MustParseExposition(text);
  EXPECT_EQ(parsed.TypeOf("moetrain_job_fp8_amax"), "gauge");
  EXPECT_EQ(parsed.TypeOf("moetrain_job_fp8_saturated_values_total"), "counter");
  // A job that is not in FP8 has no FP8 series; nothing per expert without the option.
  EXPECT_FALSE(SamplesOfJob(text, "job-bf16").empty());
  for (const ExpositionSample& sample : SamplesOfJob(text, "job-bf16")) {
    EXPECT_EQ(sample.name.find("fp8"), std::string::npos) << sample.name;
  }
  for (const auto& [name, type] : parsed.type) {
    EXPECT_EQ(name.find("moetrain_job_fp8_expert"), std::string::npos) << name;
  }

  metrics_->RetireJob("job-a");
  EXPECT_EQ(SamplesOfJob(registry_.Serialize(), "job-a"), std::vector<ExpositionSample>());
}

// The same with the per-expert FP8 series on.
class ServiceMetricsPerExpertTest : public ServiceMetricsTest {
 protected:
  ServiceMetricsOptions Options() const override {
    ServiceMetricsOptions options;
    options.per_expert = true;
    return options;
  }
};

TEST_F(ServiceMetricsPerExpertTest, ExpertSeriesOnlyWithTheOption) {
  metrics_->OnStep("job-a", Fp8Step(5), 10);
  metrics_->OnStep("job-a", Fp8Step(7), 10);
  const std::string text = registry_.Serialize();
  EXPECT_EQ(
      Sample(text,
             R"(moetrain_job_fp8_expert_amax{job_id="job-a",layer="1",expert="1",role="input"})"),
      3.5)
      << text;
  EXPECT_EQ(
      Sample(text,
             R"(moetrain_job_fp8_expert_scale{job_id="job-a",layer="1",expert="0",role="grad"})"),
      65536);
  EXPECT_EQ(
      Sample(text,
             R"(moetrain_job_fp8_expert_scale{job_id="job-a",layer="1",expert="0",role="weight"})"),
      std::nullopt);
  EXPECT_EQ(
      Sample(
          text,
          R"(moetrain_job_fp8_expert_saturated_values_total{job_id="job-a",layer="1",expert="1",role="input"})"),
      14);
  // The per-layer series are there as without the option.
  EXPECT_EQ(Sample(text, R"(moetrain_job_fp8_amax{job_id="job-a",layer="0",role="input"})"), 3.5);
  metrics_->RetireJob("job-a");
  EXPECT_EQ(SamplesOfJob(registry_.Serialize(), "job-a"), std::vector<ExpositionSample>());
}

// `promtool check metrics` over the FP8 families, per-expert ones included.
TEST_F(ServiceMetricsPerExpertTest, PromtoolAcceptsTheFp8Series) {
  v1::StepMetrics step = Fp8Step(3);
  step.mutable_fp8_layers(0)->mutable_input()->set_amax(std::nanf(""));  // a NaN step
  metrics_->OnStep("job-a", step, 10);
  const std::string text = registry_.Serialize();
  const absl::StatusOr<PromtoolResult> promtool = PromtoolCheckMetrics(text);
  ASSERT_OK(promtool);
  EXPECT_EQ(promtool->exit_code, 0) << promtool->output << "\nfor:\n" << text;
  EXPECT_EQ(promtool->output, "") << "for:\n" << text;
}

}  // namespace
}  // namespace moetrain::server
