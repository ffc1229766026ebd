// What the fleet tells ServiceMetrics as a job's attempts start, run, checkpoint, lose their
// worker and restart: the series the alert rules (deploy/prometheus/rules.yml) watch, read back
// from the registry's text as /metrics serves it.
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/core/fleet.h"
#include "server/core/service_metrics.h"
#include "server/http/metrics.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

class FleetMetricsTest : public FleetTest {
 protected:
  void SetUp() override {
    FleetTest::SetUp();
    ASSERT_NO_FATAL_FAILURE(NewMetrics());
  }

  void TearDown() override {
    FleetTest::TearDown();  // the fleet goes before the metrics it reports to
    service_metrics_.reset();
  }

  // A fresh registry and ServiceMetrics for the fleet to report to, as a new process has.
  void NewMetrics() {
    service_metrics_.reset();
    registry_ = std::make_unique<MetricsRegistry>();
    absl::StatusOr<std::unique_ptr<ServiceMetrics>> created =
        ServiceMetrics::Create(registry_.get());
    ASSERT_TRUE(created.ok()) << created.status();
    service_metrics_ = std::move(*created);
    metrics_ = service_metrics_.get();
  }

  // The coordinator process restarts: the fleet stops, its metrics start empty, and the fleet
  // reloads from the store.
  void RestartCoordinatorProcess() {
    StopFleet();
    ASSERT_NO_FATAL_FAILURE(NewMetrics());
    StartFleet();
  }

  // The value of the series written exactly as `series`, if /metrics has it.
  std::optional<double> Get(const std::string& series) {
    for (absl::string_view line : absl::StrSplit(registry_->Serialize(), '\n')) {
      if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
    return std::nullopt;
  }
  std::optional<double> State(const std::string& job_id, const std::string& state) {
    return Get("moetrain_job_state{job_id=\"" + job_id + "\",state=\"" + state + "\"}");
  }
  std::optional<double> OfJob(const std::string& name, const std::string& job_id) {
    return Get(name + "{job_id=\"" + job_id + "\"}");
  }

  // Whether /metrics has any series labelled with the job's id.
  bool HasSeriesOf(const std::string& job_id) {
    return registry_->Serialize().find("job_id=\"" + job_id + "\"") != std::string::npos;
  }

  std::unique_ptr<MetricsRegistry> registry_;
  std::unique_ptr<ServiceMetrics> service_metrics_;
};

TEST_F(FleetMetricsTest, AJobsStateCheckpointsAndLostWorkerReachTheMetrics) {
  FleetOptions options = DefaultOptions();
  options.heartbeat_interval = absl::Milliseconds(100);
  options.heartbeat_timeout = absl::Seconds(1);
  StartFleet(options);
  const std::string silent = Register("silent");
  auto keepalive = std::make_unique<Heartbeater>(fleet_.get(), silent);
  const JobRecord job = Submit();
  v1::JobSpec spec;
  ASSERT_TRUE(spec.ParseFromString(job.spec));
  const v1::Assignment assignment = AwaitAssignment(silent);
  EXPECT_EQ(State(job.id, "SCHEDULED"), 1);
  EXPECT_EQ(OfJob("moetrain_job_last_progress_timestamp_seconds", job.id), std::nullopt)
      << "not RUNNING yet";
  EXPECT_EQ(OfJob("moetrain_checkpoint_interval_steps", job.id),
            static_cast<double>(spec.checkpoint().every_steps()));
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_step", job.id), 0);

  keepalive->SetRunning({assignment});
  ASSERT_TRUE(WaitForState(job.id, JobState::kRunning));
  EXPECT_EQ(State(job.id, "SCHEDULED"), 0);
  EXPECT_EQ(State(job.id, "RUNNING"), 1);
  EXPECT_EQ(State(job.id, "PENDING"), std::nullopt) << "the fleet never saw it PENDING";
  EXPECT_TRUE(OfJob("moetrain_job_last_progress_timestamp_seconds", job.id).has_value());

  ASSERT_OK(fleet_->ReportStep(StepReport(silent, assignment, 3)));
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(silent, assignment, 4)));
  EXPECT_EQ(OfJob("moetrain_train_step", job.id), 3);
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_step", job.id), 4);
  EXPECT_TRUE(OfJob("moetrain_checkpoint_last_success_timestamp_seconds", job.id).has_value());
  EXPECT_EQ(OfJob("moetrain_checkpoint_duration_seconds_count", job.id), 1);
  EXPECT_EQ(Get("moetrain_workers_lost_total"), 0);

  keepalive.reset();  // the worker falls silent
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(silent) == v1::WORKER_STATE_LOST; }));
  EXPECT_EQ(Get("moetrain_workers_lost_total"), 1);
  EXPECT_EQ(State(job.id, "RUNNING"), 0);
  EXPECT_EQ(State(job.id, "RESTARTING"), 1);
  EXPECT_EQ(OfJob("moetrain_job_restarts_total", job.id), 1);

  // The next attempt resumes from the checkpoint of step 4.
  const std::string rescuer = Register("rescuer");
  Heartbeater rescuer_alive(fleet_.get(), rescuer);
  const v1::Assignment next = AwaitAssignment(rescuer);
  ASSERT_EQ(next.attempt(), 2);
  EXPECT_EQ(State(job.id, "RESTARTING"), 0);
  EXPECT_EQ(State(job.id, "SCHEDULED"), 1);
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_step", job.id), 4);
  rescuer_alive.SetRunning({next});
  ASSERT_TRUE(WaitForState(job.id, JobState::kRunning));
  EXPECT_EQ(State(job.id, "RUNNING"), 1);

  ASSERT_OK(fleet_->Cancel(job.id, "enough").status());
  EXPECT_EQ(State(job.id, "RUNNING"), 0);
  EXPECT_EQ(State(job.id, "CANCELLED"), 1);
}

TEST_F(FleetMetricsTest, AnEndedJobsSeriesStayWithinTheRetention) {
  FleetOptions options = DefaultOptions();
  options.metrics_retention = absl::Hours(1);
  StartFleet(options);
  const RunningJob done = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportStep(StepReport(done.worker_id, done.assignment, 20)));
  ASSERT_OK(FinishRank(*fleet_, done.worker_id, done.assignment));
  ASSERT_EQ(GetJob(done.job.id).state, JobState::kSucceeded);
  // The freed worker is given a job submitted after the end: that took a scheduling pass, so the
  // control loop has looked at the ended job since. Its final values are still there to scrape.
  const JobRecord next = Submit();
  EXPECT_EQ(AwaitAssignment(done.worker_id).job_id(), next.id);
  EXPECT_EQ(State(done.job.id, "SUCCEEDED"), 1);
  EXPECT_EQ(State(done.job.id, "RUNNING"), 0);
  EXPECT_EQ(OfJob("moetrain_train_step", done.job.id), 20);
  EXPECT_EQ(OfJob("moetrain_train_loss", done.job.id), 1.0 / 20);
  EXPECT_EQ(OfJob("moetrain_job_restarts_total", done.job.id), 0);
  EXPECT_EQ(State(next.id, "SCHEDULED"), 1);
}

TEST_F(FleetMetricsTest, AnEndedJobsSeriesGoAfterTheRetentionAndLateReportsDoNotBringThemBack) {
  FleetOptions options = DefaultOptions();
  options.metrics_retention = absl::Milliseconds(1);
  StartFleet(options);
  const RunningJob failed = StartOneWorkerJob(/*max_restarts=*/0);
  const RunningJob cancelled = StartOneWorkerJob();
  const RunningJob running = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportStep(StepReport(failed.worker_id, failed.assignment, 4)));
  ASSERT_OK(fleet_->ReportStep(StepReport(cancelled.worker_id, cancelled.assignment, 6)));
  ASSERT_OK(fleet_->ReportStep(StepReport(running.worker_id, running.assignment, 8)));
  ASSERT_TRUE(HasSeriesOf(failed.job.id));
  ASSERT_TRUE(HasSeriesOf(cancelled.job.id));

  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(failed.worker_id, failed.assignment, v1::ATTEMPT_OUTCOME_FAILED, 4, "oom")));
  ASSERT_EQ(GetJob(failed.job.id).state, JobState::kFailed);
  ASSERT_OK(fleet_->Cancel(cancelled.job.id, "enough").status());
  EXPECT_TRUE(WaitUntil([&] { return !HasSeriesOf(failed.job.id); })) << registry_->Serialize();
  EXPECT_TRUE(WaitUntil([&] { return !HasSeriesOf(cancelled.job.id); })) << registry_->Serialize();

  // A job still running keeps its series.
  EXPECT_EQ(State(running.job.id, "RUNNING"), 1);
  EXPECT_EQ(OfJob("moetrain_train_step", running.job.id), 8);

  // The cancelled job's rank reports once more before it hears that it must stop: the report is
  // refused (its attempt is over) and makes no series again. Its end frees the worker.
  EXPECT_EQ(fleet_->ReportStep(StepReport(cancelled.worker_id, cancelled.assignment, 7)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fleet_->ReportCheckpoint(CheckpointReport(cancelled.worker_id, cancelled.assignment, 7))
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(fleet_->ReportAttemptEnd(
      EndReport(cancelled.worker_id, cancelled.assignment, v1::ATTEMPT_OUTCOME_CANCELLED, 7)));
  // Cancelling it again is refused before it touches the metrics.
  EXPECT_EQ(fleet_->Cancel(cancelled.job.id, "again").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(HasSeriesOf(cancelled.job.id)) << registry_->Serialize();
  EXPECT_FALSE(HasSeriesOf(failed.job.id)) << registry_->Serialize();
}

TEST_F(FleetMetricsTest, ARetentionThatIsNotPositiveIsRefusedByName) {
  for (absl::Duration retention : {absl::ZeroDuration(), absl::Seconds(-5)}) {
    FleetOptions options = DefaultOptions();
    options.metrics_retention = retention;
    const absl::Status refused = options.Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_EQ(refused.message(),
              "metrics_retention = " + absl::FormatDuration(retention) + " must be positive");
    EXPECT_EQ(Fleet::Create(store_.get(), nullptr, metrics_, options).status(), refused);
  }
}

TEST_F(FleetMetricsTest, AJobThatEndedBeforeARestartHasNoSeriesAfterIt) {
  StartFleet();  // the default retention: nothing is retired while this process runs
  const RunningJob done = StartOneWorkerJob();
  ASSERT_OK(FinishRank(*fleet_, done.worker_id, done.assignment));
  ASSERT_EQ(GetJob(done.job.id).state, JobState::kSucceeded);
  ASSERT_TRUE(HasSeriesOf(done.job.id));
  // The coordinator restarts: its series are gone with the process and the reload makes none.
  ASSERT_NO_FATAL_FAILURE(RestartCoordinatorProcess());
  EXPECT_FALSE(HasSeriesOf(done.job.id)) << registry_->Serialize();
}

TEST_F(FleetMetricsTest, AGangsCheckpointCountsOnceEveryRankWroteIt) {
  StartFleet();
  const RunningGang gang = StartTwoWorkerJob();
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(gang.workers[0], gang.assignments[0], 6)));
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_step", gang.job.id), 0) << "rank 1 has not written";
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_success_timestamp_seconds", gang.job.id), std::nullopt);
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(gang.workers[1], gang.assignments[1], 6)));
  EXPECT_EQ(OfJob("moetrain_checkpoint_last_step", gang.job.id), 6);
  EXPECT_TRUE(OfJob("moetrain_checkpoint_last_success_timestamp_seconds", gang.job.id).has_value());
  EXPECT_EQ(OfJob("moetrain_checkpoint_duration_seconds_count", gang.job.id), 2)
      << "every rank's write is timed";
}

TEST_F(FleetMetricsTest, AReloadedAttemptKeepsItsStateAndCheckpointAfterARestart) {
  StartFleet();
  const RunningJob running = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportCheckpoint(CheckpointReport(running.worker_id, running.assignment, 8)));
  // The coordinator process restarts: new metrics, the fleet reloads the attempt from the store.
  ASSERT_NO_FATAL_FAILURE(RestartCoordinatorProcess());
  const std::string text = registry_->Serialize();
  const std::string job = "{job_id=\"" + running.job.id + "\"";
  EXPECT_NE(text.find("moetrain_job_state" + job + ",state=\"RUNNING\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("moetrain_checkpoint_last_step" + job + "} 8"), std::string::npos) << text;
  EXPECT_NE(text.find("moetrain_checkpoint_last_success_timestamp_seconds" + job + "}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("moetrain_job_last_progress_timestamp_seconds" + job + "}"),
            std::string::npos)
      << "a reloaded RUNNING job's clock starts again: " << text;
}

}  // namespace
}  // namespace moetrain::server
