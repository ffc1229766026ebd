// What the fleet tests share: a real Store on a SQLite file in a fresh directory, a real
// Coordinator and a Fleet with its control loop running, and helpers that play a worker's side of
// the protocol by calling the fleet directly. Asynchronous outcomes (the control loop runs on its
// own thread) are awaited with deadlines; no test asserts on how long anything took.
#ifndef MOETRAIN_TESTS_SERVER_FLEET_FLEET_TEST_UTIL_H_
#define MOETRAIN_TESTS_SERVER_FLEET_FLEET_TEST_UTIL_H_

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/proto_time.h"
#include "moetrain/v1/worker.pb.h"
#include "server/core/coordinator.h"
#include "server/core/fleet.h"
#include "server/core/store.h"
#include "tests/testing/testing.h"

namespace moetrain::server {

// How long a test waits for something the control loop does "soon" before it gives up. Only a
// failing test ever waits this long.
inline constexpr absl::Duration kPatience = absl::Seconds(20);

// Polls `done` until it holds or `patience` runs out; true when it held.
template <typename Condition>
bool WaitUntil(Condition done, absl::Duration patience = kPatience) {
  const absl::Time deadline = absl::Now() + patience;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A small valid spec: every field not written takes its default.
inline v1::JobSpec TestSpec(int workers, int max_restarts, const std::string& name = "fleet-test") {
  const std::string yaml = absl::StrCat("name: ", name,
                                        "\n"
                                        "train:\n"
                                        "  steps: 20\n"
                                        "resources:\n"
                                        "  workers: ",
                                        workers,
                                        "\n"
                                        "  device: CPU\n"
                                        "restart:\n"
                                        "  max_restarts: ",
                                        max_restarts, "\n");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : v1::JobSpec();
}

inline v1::RunningAttempt RunningOf(const v1::Assignment& assignment, int64_t step = 0) {
  v1::RunningAttempt running;
  running.set_job_id(assignment.job_id());
  running.set_attempt(assignment.attempt());
  running.set_rank(assignment.rank());
  running.set_step(step);
  return running;
}

// Where the fleet expects the checkpoint of `step` of this assignment.
inline std::string CheckpointPath(const v1::Assignment& assignment, int64_t step) {
  return absl::StrFormat("%s/step-%08d", assignment.checkpoint_dir(), step);
}

inline v1::ReportStepRequest StepReport(const std::string& worker_id,
                                        const v1::Assignment& assignment, int64_t step) {
  v1::ReportStepRequest request;
  request.set_worker_id(worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  request.mutable_metrics()->set_step(step);
  request.mutable_metrics()->set_loss(1.0 / static_cast<double>(step));
  request.mutable_metrics()->set_tokens_seen(step * 1000);
  return request;
}

inline v1::ReportLogRequest LogReport(const std::string& worker_id,
                                      const v1::Assignment& assignment,
                                      std::vector<std::string> lines) {
  v1::ReportLogRequest request;
  request.set_worker_id(worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  for (std::string& line : lines) request.add_lines(std::move(line));
  return request;
}

inline v1::ReportCheckpointRequest CheckpointReport(const std::string& worker_id,
                                                    const v1::Assignment& assignment,
                                                    int64_t step) {
  v1::ReportCheckpointRequest request;
  request.set_worker_id(worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  request.set_step(step);
  request.set_path(CheckpointPath(assignment, step));
  request.set_tokens_seen(step * 1000);
  return request;
}

inline v1::ReportAttemptEndRequest EndReport(const std::string& worker_id,
                                             const v1::Assignment& assignment,
                                             v1::AttemptOutcome outcome, int64_t step,
                                             const std::string& message = "") {
  v1::ReportAttemptEndRequest request;
  request.set_worker_id(worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  request.set_outcome(outcome);
  request.set_step(step);
  request.set_message(message);
  return request;
}

// A rank's end as a worker that finished sends it: the final checkpoint of a TestSpec job (step
// `steps`), then SUCCEEDED at that step. The fleet takes SUCCEEDED only with that checkpoint.
inline absl::Status FinishRank(Fleet& fleet, const std::string& worker_id,
                               const v1::Assignment& assignment, int64_t steps = 20) {
  absl::Status checkpoint = fleet.ReportCheckpoint(CheckpointReport(worker_id, assignment, steps));
  if (!checkpoint.ok()) return checkpoint;
  return fleet.ReportAttemptEnd(
      EndReport(worker_id, assignment, v1::ATTEMPT_OUTCOME_SUCCEEDED, steps));
}

// Heartbeats for one worker from a thread of its own, listing the ranks it is told it runs, until
// destroyed: keeps a worker alive where the fleet's heartbeat_timeout is short.
class Heartbeater {
 public:
  Heartbeater(Fleet* fleet, std::string worker_id)
      : fleet_(fleet), worker_id_(std::move(worker_id)) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        v1::HeartbeatRequest request;
        request.set_worker_id(worker_id_);
        {
          absl::MutexLock lock(&mu_);
          for (const v1::Assignment& assignment : running_) {
            *request.add_running() = RunningOf(assignment);
          }
        }
        fleet_->Heartbeat(request).IgnoreError();
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  ~Heartbeater() {
    stop_.store(true);
    thread_.join();
  }
  Heartbeater(const Heartbeater&) = delete;
  Heartbeater& operator=(const Heartbeater&) = delete;

  void SetRunning(std::vector<v1::Assignment> running) {
    absl::MutexLock lock(&mu_);
    running_ = std::move(running);
  }

 private:
  Fleet* const fleet_;
  const std::string worker_id_;
  absl::Mutex mu_;
  std::vector<v1::Assignment> running_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Store>> store =
        Store::Open((std::filesystem::path(dir_) / "coordinator.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  void TearDown() override {
    StopFleet();
    store_.reset();
  }

  // Timeouts long enough that nobody is declared lost, no rank counts as stuck and no grace
  // period ends unless a test waits for it on purpose (those tests shorten them). Redelivery of
  // an assignment that did not start takes 2 × heartbeat_interval.
  FleetOptions DefaultOptions() const {
    FleetOptions options;
    options.heartbeat_interval = absl::Milliseconds(500);
    options.heartbeat_timeout = absl::Seconds(30);
    options.reconcile_grace = absl::Seconds(30);
    options.control_interval = absl::Milliseconds(20);
    options.checkpoint_dir = absl::StrCat(dir_, "/checkpoints");
    return options;
  }

  // A coordinator process starting over the store: its Coordinator, then the Fleet (which reloads
  // the workers and attempts in flight), told of every submission as the server wires it.
  void StartFleet(const FleetOptions& options) {
    coordinator_ = std::make_unique<Coordinator>(store_.get());
    absl::StatusOr<std::unique_ptr<Fleet>> fleet =
        Fleet::Create(store_.get(), coordinator_.get(), metrics_, options);
    ASSERT_TRUE(fleet.ok()) << fleet.status();
    fleet_ = *std::move(fleet);
    coordinator_->SetSubmittedListener(
        [fleet = fleet_.get()](const std::string&) { fleet->Wake(); });
    fleet_->Start();
  }
  void StartFleet() { StartFleet(DefaultOptions()); }

  // The coordinator process exits: the fleet and the coordinator go, the store file stays.
  void StopFleet() {
    if (fleet_ != nullptr) fleet_->Stop();
    fleet_.reset();
    coordinator_.reset();
  }

  // A CPU worker's registration, as `moetrain-worker` sends it.
  static v1::RegisterWorkerRequest CpuWorker(const std::string& name) {
    v1::RegisterWorkerRequest request;
    request.set_name(name);
    request.set_version("test");
    request.mutable_resources()->set_device(v1::ResourceConfig::CPU);
    request.mutable_resources()->set_device_count(1);
    request.mutable_resources()->set_threads(1);
    return request;
  }

  std::string Register(const std::string& name = "worker") {
    absl::StatusOr<v1::RegisterWorkerResponse> response = fleet_->Register(CpuWorker(name));
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->worker_id() : "";
  }

  JobRecord Submit(int workers = 1, int max_restarts = 3, const std::string& name = "fleet-test") {
    absl::StatusOr<JobRecord> job = coordinator_->Submit(absl::StrCat("submission-", ++submitted_),
                                                         TestSpec(workers, max_restarts, name), 0);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : JobRecord();
  }

  absl::StatusOr<v1::GetAssignmentResponse> Poll(const std::string& worker_id,
                                                 absl::Duration wait = absl::ZeroDuration()) {
    v1::GetAssignmentRequest request;
    request.set_worker_id(worker_id);
    ToProtoDuration(wait, request.mutable_wait_timeout());
    return fleet_->GetAssignment(request, /*is_cancelled=*/nullptr);
  }

  // Polls as a worker does until it is handed an assignment; fails the test past kPatience.
  v1::Assignment AwaitAssignment(const std::string& worker_id) {
    const absl::Time deadline = absl::Now() + kPatience;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::GetAssignmentResponse> response = Poll(worker_id, absl::Milliseconds(200));
      if (!response.ok()) {
        ADD_FAILURE() << "polling for worker " << worker_id << ": " << response.status();
        return v1::Assignment();
      }
      EXPECT_EQ(response->cancel_size(), 0) << response->DebugString();
      if (response->has_assignment()) return response->assignment();
    }
    ADD_FAILURE() << "worker " << worker_id << " got no assignment within "
                  << absl::FormatDuration(kPatience);
    return v1::Assignment();
  }

  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& worker_id,
                                                  const std::vector<v1::Assignment>& running = {}) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    for (const v1::Assignment& assignment : running) *request.add_running() = RunningOf(assignment);
    return fleet_->Heartbeat(request);
  }

  JobRecord GetJob(const std::string& job_id) {
    absl::StatusOr<JobRecord> job = store_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *std::move(job) : JobRecord();
  }

  bool WaitForState(const std::string& job_id, JobState state) {
    return WaitUntil([&] { return GetJob(job_id).state == state; });
  }

  // Every worker, following ListWorkers' pages.
  std::vector<v1::WorkerInfo> AllWorkers() {
    std::vector<v1::WorkerInfo> all;
    ListWorkersOptions options;
    do {
      absl::StatusOr<WorkerPage> page = fleet_->ListWorkers(options);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      for (v1::WorkerInfo& info : page->workers) all.push_back(std::move(info));
      options.page_token = page->next_page_token;
    } while (!options.page_token.empty());
    return all;
  }

  // The worker as ListWorkers shows it; an empty id when it is not listed.
  v1::WorkerInfo InfoOf(const std::string& worker_id) {
    for (const v1::WorkerInfo& info : AllWorkers()) {
      if (info.id() == worker_id) return info;
    }
    return v1::WorkerInfo();
  }
  v1::WorkerState WorkerStateOf(const std::string& worker_id) { return InfoOf(worker_id).state(); }

  std::vector<EventRecord> Events(const std::string& job_id) {
    absl::StatusOr<std::vector<EventRecord>> events = store_->ReadEvents(job_id, 1, 10000);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *std::move(events) : std::vector<EventRecord>();
  }

  // The steps of the job's step_metrics events, in order, as a watcher sees them.
  std::vector<int64_t> RecordedSteps(const std::string& job_id) {
    std::vector<int64_t> steps;
    WatchOptions options;
    options.no_wait = true;
    const absl::Status watched =
        coordinator_->Watch(job_id, options, [&](const EventRecord& event) {
          v1::StepMetrics metrics;
          if (event.kind == kStepMetricsEventKind && metrics.ParseFromString(event.payload)) {
            steps.push_back(metrics.step());
          }
          return true;
        });
    EXPECT_TRUE(watched.ok()) << watched;
    return steps;
  }

  std::vector<std::string> LogLines(const std::string& job_id) {
    std::vector<std::string> lines;
    for (const EventRecord& event : Events(job_id)) {
      if (event.kind == kLogEventKind) lines.push_back(event.payload);
    }
    return lines;
  }

  std::vector<v1::CheckpointSaved> SavedCheckpoints(const std::string& job_id) {
    std::vector<v1::CheckpointSaved> saved;
    for (const EventRecord& event : Events(job_id)) {
      if (event.kind != kCheckpointSavedEventKind) continue;
      EXPECT_TRUE(saved.emplace_back().ParseFromString(event.payload));
    }
    return saved;
  }

  std::vector<AttemptRecord> Attempts(const std::string& job_id) {
    absl::StatusOr<std::vector<AttemptRecord>> attempts = store_->ListAttempts(job_id);
    EXPECT_TRUE(attempts.ok()) << attempts.status();
    return attempts.ok() ? *std::move(attempts) : std::vector<AttemptRecord>();
  }

  // Registers a worker, submits a one-worker job and runs its rank (the assignment taken, the
  // rank listed in a heartbeat): the job is RUNNING when this returns.
  struct RunningJob {
    std::string worker_id;
    JobRecord job;
    v1::Assignment assignment;
  };
  RunningJob StartOneWorkerJob(int max_restarts = 3) {
    RunningJob running;
    running.worker_id = Register();
    running.job = Submit(1, max_restarts);
    running.assignment = AwaitAssignment(running.worker_id);
    EXPECT_EQ(running.assignment.job_id(), running.job.id);
    EXPECT_OK(Heartbeat(running.worker_id, {running.assignment}).status());
    EXPECT_TRUE(WaitForState(running.job.id, JobState::kRunning));
    return running;
  }

  // Two workers and a two-worker job whose ranks both run: `assignments[i]` is rank i, on
  // `workers[i]`.
  struct RunningGang {
    std::vector<std::string> workers;
    JobRecord job;
    std::vector<v1::Assignment> assignments;
  };
  RunningGang StartTwoWorkerJob(int max_restarts = 3) {
    RunningGang gang;
    const std::string first = Register("first"), second = Register("second");
    gang.job = Submit(2, max_restarts);
    v1::Assignment a = AwaitAssignment(first), b = AwaitAssignment(second);
    if (a.rank() > b.rank()) {
      gang.workers = {second, first};
      gang.assignments = {b, a};
    } else {
      gang.workers = {first, second};
      gang.assignments = {a, b};
    }
    EXPECT_EQ(gang.assignments[0].rank(), 0);
    EXPECT_EQ(gang.assignments[1].rank(), 1);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_OK(Heartbeat(gang.workers[rank], {gang.assignments[rank]}).status());
    }
    EXPECT_TRUE(WaitForState(gang.job.id, JobState::kRunning));
    return gang;
  }

  // The smallest job whose ranks meet at the rendezvous (an attempt of one rank has none): a
  // two-worker job with both ranks running, seen from rank 0, and rank 1 as its peer.
  struct RendezvousJob : RunningJob {
    std::string peer_id;
    v1::Assignment peer_assignment;
  };
  RendezvousJob StartRendezvousJob(int max_restarts = 3) {
    const RunningGang gang = StartTwoWorkerJob(max_restarts);
    RendezvousJob running;
    running.worker_id = gang.workers[0];
    running.job = gang.job;
    running.assignment = gang.assignments[0];
    running.peer_id = gang.workers[1];
    running.peer_assignment = gang.assignments[1];
    return running;
  }

  const testutil::TempDir temp_dir_{"fleet_test"};
  const std::string dir_ = temp_dir_.path().string();
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Fleet> fleet_;
  // What StartFleet hands the fleet to report to; none unless a test sets it.
  ServiceMetrics* metrics_ = nullptr;
  int submitted_ = 0;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_TESTS_SERVER_FLEET_FLEET_TEST_UTIL_H_
