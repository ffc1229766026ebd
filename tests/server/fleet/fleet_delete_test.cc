// Fleet::Delete (issue 13, item 13) and the metrics: a deleted job's series go at once rather
// than after the retention, and the other jobs' stay.
#include <memory>
#include <string>

#include "server/core/fleet.h"
#include "server/core/service_metrics.h"
#include "server/http/metrics.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

class FleetDeleteTest : public FleetTest {
 protected:
  void SetUp() override {
    FleetTest::SetUp();
    registry_ = std::make_unique<MetricsRegistry>();
    absl::StatusOr<std::unique_ptr<ServiceMetrics>> created =
        ServiceMetrics::Create(registry_.get());
    ASSERT_TRUE(created.ok()) << created.status();
    service_metrics_ = std::move(*created);
    metrics_ = service_metrics_.get();
  }

  void TearDown() override {
    FleetTest::TearDown();  // the fleet goes before the metrics it reports to
    service_metrics_.reset();
  }

  bool HasSeriesOf(const std::string& job_id) {
    return registry_->Serialize().find("job_id=\"" + job_id + "\"") != std::string::npos;
  }

  std::unique_ptr<MetricsRegistry> registry_;
  std::unique_ptr<ServiceMetrics> service_metrics_;
};

TEST_F(FleetDeleteTest, ADeletedJobsSeriesGoAtOnce) {
  FleetOptions options = DefaultOptions();
  options.metrics_retention = absl::Hours(1);
  StartFleet(options);
  const RunningJob done = StartOneWorkerJob();
  ASSERT_OK(fleet_->ReportStep(StepReport(done.worker_id, done.assignment, 20)));
  ASSERT_OK(FinishRank(*fleet_, done.worker_id, done.assignment));
  ASSERT_EQ(GetJob(done.job.id).state, JobState::kSucceeded);
  const JobRecord next = Submit();
  EXPECT_EQ(AwaitAssignment(done.worker_id).job_id(), next.id);
  ASSERT_TRUE(HasSeriesOf(done.job.id));

  absl::StatusOr<DeletedJob> deleted = fleet_->Delete(done.job.id, false);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->checkpoint_dir, done.assignment.checkpoint_dir());
  EXPECT_FALSE(HasSeriesOf(done.job.id));
  EXPECT_TRUE(HasSeriesOf(next.id));
  // The running job cannot be deleted.
  absl::StatusOr<DeletedJob> running = fleet_->Delete(next.id, false);
  EXPECT_TRUE(absl::IsFailedPrecondition(running.status())) << running.status();
}

}  // namespace
}  // namespace moetrain::server
