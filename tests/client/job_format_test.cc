// The text and JSON forms of the coordinator's answers: state names as users type them, ages,
// the jobs, checkpoints and workers tables, the description, and the JSON mapping's stable keys.
#include "client/job_format.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

void SetTime(absl::Time time, google::protobuf::Timestamp* timestamp) {
  timestamp->set_seconds(absl::ToUnixSeconds(time));
}

v1::Job TestJob(const std::string& id, const std::string& name, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_name(name);
  job.set_submission_id("sub-" + id);
  job.set_state(state);
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->mutable_train()->set_steps(300);
  job.mutable_spec()->mutable_restart()->set_max_restarts(3);
  SetTime(kNow - absl::Minutes(5), job.mutable_create_time());
  SetTime(kNow - absl::Seconds(3), job.mutable_update_time());
  return job;
}

TEST(JobFormatTest, ParsesStateNamesInAnyCase) {
  for (const char* name : {"RUNNING", "running", "Running", "JOB_STATE_RUNNING", " running "}) {
    absl::StatusOr<v1::JobState> state = ParseJobStateName(name);
    ASSERT_TRUE(state.ok()) << name << ": " << state.status();
    EXPECT_EQ(*state, v1::JOB_STATE_RUNNING) << name;
  }
  EXPECT_EQ(*ParseJobStateName("cancelled"), v1::JOB_STATE_CANCELLED);
  for (const char* bad : {"", "UNSPECIFIED", "runnin", "3"}) {
    absl::StatusOr<v1::JobState> state = ParseJobStateName(bad);
    ASSERT_FALSE(state.ok()) << bad;
    EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(state.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << state.status();
    EXPECT_NE(state.status().message().find("RESTARTING"), std::string::npos) << state.status();
  }
}

TEST(JobFormatTest, AgesInTheLargestWholeUnit) {
  EXPECT_EQ(FormatAge(kNow, kNow), "0s");
  EXPECT_EQ(FormatAge(kNow - absl::Seconds(119), kNow), "119s");
  EXPECT_EQ(FormatAge(kNow - absl::Minutes(5), kNow), "5m");
  EXPECT_EQ(FormatAge(kNow - absl::Hours(3), kNow), "3h");
  EXPECT_EQ(FormatAge(kNow - absl::Hours(24 * 9), kNow), "9d");
  EXPECT_EQ(FormatAge(absl::InfinitePast(), kNow), "-");
  EXPECT_EQ(FormatAge(kNow + absl::Minutes(1), kNow), "-");
  EXPECT_EQ(TimeFromProto(google::protobuf::Timestamp()), absl::InfinitePast());
}

TEST(JobFormatTest, JobsTable) {
  v1::Job running = TestJob("job-a", "tiny", v1::JOB_STATE_RUNNING);
  running.mutable_last_metrics()->set_step(120);
  running.mutable_last_metrics()->set_loss(2.34567);
  running.set_restarts(1);
  const v1::Job pending = TestJob("job-bb", "a-longer-name", v1::JOB_STATE_PENDING);
  EXPECT_EQ(FormatJobsTable({running, pending}, kNow),
            "ID      NAME           STATE    STEP     LOSS    RESTARTS  AGE\n"
            "job-a   tiny           RUNNING  120/300  2.3457  1         5m\n"
            "job-bb  a-longer-name  PENDING  0/300    -       0         5m\n");
  EXPECT_EQ(FormatJobsTable({}, kNow), "(no jobs)\n");
}

TEST(JobFormatTest, DescriptionHasStateAttemptsCheckpointMetricsAndSpec) {
  v1::Job job = TestJob("job-a", "tiny", v1::JOB_STATE_RESTARTING);
  job.set_state_reason("rank 0 failed: out of memory");
  job.set_attempt(2);
  job.set_restarts(1);
  job.set_priority(5);
  job.set_latest_checkpoint_step(100);
  job.mutable_last_metrics()->set_step(120);
  job.mutable_last_metrics()->set_loss(2.5);
  job.mutable_last_metrics()->set_eval_loss(2.75);
  job.mutable_last_metrics()->set_tokens_seen(4096);
  const std::string text = FormatJobDescription(job, kNow);
  for (const std::string& line :
       {std::string("Job:                job-a\n"), std::string("Submission id:      sub-job-a\n"),
        std::string("State:              RESTARTING (rank 0 failed: out of memory)\n"),
        std::string("Priority:           5\n"), std::string("Attempt:            2\n"),
        std::string("Restarts:           1 of at most 3\n"),
        std::string("Latest checkpoint:  step 100\n"),
        std::string("Created:            2023-11-14 22:08:20 UTC (5m ago)\n"),
        std::string("Spec:\n  name: \"tiny\"\n")}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in\n" << text;
  }
  EXPECT_NE(text.find("step 120/300, loss 2.5000, eval loss 2.7500"), std::string::npos) << text;
  EXPECT_NE(text.find("tokens seen 4096"), std::string::npos) << text;
  EXPECT_EQ(text.find("device memory"), std::string::npos) << "a CPU job has none\n" << text;
  job.mutable_last_metrics()->set_device_memory_bytes(int64_t{3} << 30);
  job.mutable_last_metrics()->set_device_memory_peak_bytes(int64_t{5} << 30);
  const std::string gpu = FormatJobDescription(job, kNow);
  EXPECT_NE(gpu.find("device memory 3.00 GiB (peak 5.00 GiB)"), std::string::npos) << gpu;
  EXPECT_NE(text.find("\n  train:\n    steps: 300\n"), std::string::npos) << text;

  const std::string fresh =
      FormatJobDescription(TestJob("job-b", "t", v1::JOB_STATE_PENDING), kNow);
  EXPECT_NE(fresh.find("Attempt:            none yet\n"), std::string::npos) << fresh;
  EXPECT_NE(fresh.find("Latest checkpoint:  none\n"), std::string::npos) << fresh;
  EXPECT_NE(fresh.find("Last metrics:       none yet\n"), std::string::npos) << fresh;
}

TEST(JobFormatTest, DescriptionSaysWhyAJobWaitsAndWhenItsBackoffEnds) {
  v1::Job pending = TestJob("job-w", "gang", v1::JOB_STATE_PENDING);
  pending.set_waiting_reason("needs 4 CPU workers, 1 registered");
  const std::string waiting = FormatJobDescription(pending, kNow);
  EXPECT_NE(waiting.find("Waiting:            needs 4 CPU workers, 1 registered\n"),
            std::string::npos)
      << waiting;
  EXPECT_EQ(waiting.find("Next attempt:"), std::string::npos) << waiting;

  v1::Job restarting = TestJob("job-r", "flaky", v1::JOB_STATE_RESTARTING);
  SetTime(kNow + absl::Seconds(4), restarting.mutable_next_attempt_time());
  const std::string backing_off = FormatJobDescription(restarting, kNow);
  EXPECT_NE(backing_off.find("Next attempt:       2023-11-14 22:13:24 UTC (in 4s)\n"),
            std::string::npos)
      << backing_off;
  // Once it has passed, it reads as a time ago.
  EXPECT_NE(FormatJobDescription(restarting, kNow + absl::Seconds(10))
                .find("Next attempt:       2023-11-14 22:13:24 UTC (6s ago)\n"),
            std::string::npos);
  EXPECT_EQ(
      FormatJobDescription(TestJob("job-n", "t", v1::JOB_STATE_RUNNING), kNow).find("Waiting:"),
      std::string::npos);
}

TEST(JobFormatTest, CheckpointsAndWorkersTables) {
  v1::ListCheckpointsResponse checkpoints;
  v1::Checkpoint* checkpoint = checkpoints.add_checkpoints();
  checkpoint->set_step(100);
  checkpoint->set_tokens_seen(51200);
  checkpoint->set_attempt(1);
  checkpoint->set_path("/ck/job-a/step-00000100");
  SetTime(kNow - absl::Hours(2), checkpoint->mutable_create_time());
  EXPECT_EQ(FormatCheckpointsTable(checkpoints, kNow),
            "STEP  TOKENS  ATTEMPT  AGE  PATH\n"
            "100   51200   1        2h   /ck/job-a/step-00000100\n");
  EXPECT_EQ(FormatCheckpointsTable({}, kNow), "(no checkpoints)\n");

  v1::ListWorkersResponse workers;
  v1::WorkerInfo* worker = workers.add_workers();
  worker->set_id("w-1");
  worker->set_name("host1");
  worker->set_device(v1::ResourceConfig::CUDA);
  worker->set_device_count(8);
  worker->set_threads(16);
  worker->set_version("0.1");
  worker->set_state(v1::WORKER_STATE_BUSY);
  worker->set_current_job_id("job-a");
  worker->set_current_attempt(2);
  SetTime(kNow - absl::Seconds(1), worker->mutable_last_heartbeat());
  EXPECT_EQ(FormatWorkersTable(workers, kNow),
            "ID   NAME   STATE  DEVICES  THREADS  JOB                HEARTBEAT  VERSION\n"
            "w-1  host1  BUSY   cuda x8  16       job-a (attempt 2)  1s ago     0.1\n");
  // With each GPU's memory, as a worker that found its GPUs registers it.
  worker->set_device_memory_bytes(int64_t{141} << 30);
  EXPECT_EQ(
      FormatWorkersTable(workers, kNow),
      "ID   NAME   STATE  DEVICES              THREADS  JOB                HEARTBEAT  VERSION\n"
      "w-1  host1  BUSY   cuda x8 (141.0 GiB)  16       job-a (attempt 2)  1s ago     0.1\n");
  EXPECT_EQ(FormatWorkersTable({}, kNow), "(no workers)\n");
}

TEST(JobFormatTest, JsonKeepsProtoNamesAndEveryScalar) {
  const v1::Job job = TestJob("job-a", "tiny", v1::JOB_STATE_PENDING);
  absl::StatusOr<std::string> text = MessageToJson(job);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->find('\n'), std::string::npos) << "one line";
  const nlohmann::json parsed = nlohmann::json::parse(*text);
  EXPECT_EQ(parsed.at("submission_id"), "sub-job-a");
  EXPECT_EQ(parsed.at("state"), "JOB_STATE_PENDING");
  EXPECT_EQ(parsed.at("create_time"), "2023-11-14T22:08:20Z");
  // Defaults are present, so scripts find every key.
  EXPECT_EQ(parsed.at("state_reason"), "");
  EXPECT_EQ(parsed.at("restarts"), "0");
  EXPECT_EQ(parsed.at("priority"), 0);
  EXPECT_FALSE(parsed.contains("latest_checkpoint_step")) << "unset optional fields are absent";
}

}  // namespace
}  // namespace moetrain
