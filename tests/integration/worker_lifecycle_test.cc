// The worker process's lifecycle, with real processes on 127.0.0.1: SIGTERM and SIGINT drain a
// worker (a busy one checkpoints, reports STOPPED and hands its job over without a restart being
// counted; one that has not registered yet stops at once), and relative path flags are resolved
// before the worker enters its --work-dir.
#include <signal.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;

std::string SignalName(int signal_number) {
  return signal_number == SIGTERM ? "Sigterm" : "Sigint";
}

TEST_F(ServiceTest, SigtermDrainsABusyWorkerAndItsJobResumesElsewhereWithoutARestart) {
  TinySpec job = ServiceSpec("drained");
  job.steps = 6000;
  job.log_every = 10;
  job.checkpoint_every = 2000;
  job.max_restarts = 0;  // a counted restart would fail the job
  StartCoordinator();
  StartWorker("a");
  StartWorker("b");
  const std::string id = Submit(job);
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::optional<v1::Job> running = GetJob(id);
        return running.has_value() && running->last_metrics().step() >= 100;
      },
      std::chrono::seconds(120)))
      << coordinator_->Log();
  std::string victim;
  for (const v1::WorkerInfo& worker : Workers()) {
    if (worker.current_job_id() == id) victim = worker.name();
  }
  ASSERT_FALSE(victim.empty());
  Daemon& stopped = *workers_.at(victim);
  const int exit_code = stopped.Stop(std::chrono::seconds(60));
  const std::string victim_log = ReadWholeFile(dir_ / (victim + ".log"));
  EXPECT_EQ(exit_code, 0) << victim_log;
  EXPECT_THAT(victim_log, HasSubstr("received Terminated"));
  EXPECT_THAT(victim_log, HasSubstr("ended at step"));
  EXPECT_THAT(victim_log, HasSubstr("ATTEMPT_OUTCOME_STOPPED"));

  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, std::chrono::seconds(240)))
      << coordinator_->Log();
  const v1::Job done = *GetJob(id);
  EXPECT_EQ(done.restarts(), 0);
  EXPECT_EQ(done.attempt(), 2);

  // The first attempt ends with a checkpoint at the step it stopped at, the job is handed over
  // with "stopped at step N", and the second attempt resumes from exactly that step.
  int64_t last_checkpoint = -1, stopped_checkpoint = -1, resumed_from = -1;
  std::string handover_reason;
  for (const v1::JobEvent& event : Events(id)) {
    if (event.has_checkpoint_saved()) last_checkpoint = event.checkpoint_saved().step();
    if (event.has_state_change() && event.state_change().to() == v1::JOB_STATE_RESTARTING &&
        handover_reason.empty()) {
      handover_reason = event.state_change().reason();
      stopped_checkpoint = last_checkpoint;
    }
    const std::string& text = event.log_line().text();
    if (!handover_reason.empty() && resumed_from < 0 && text.rfind("resumed from ", 0) == 0) {
      resumed_from = std::stoll(text.substr(text.rfind("(step ") + 6));
    }
  }
  EXPECT_THAT(handover_reason, HasSubstr(absl::StrCat("stopped at step ", stopped_checkpoint)));
  ASSERT_GE(stopped_checkpoint, 100);
  EXPECT_EQ(resumed_from, stopped_checkpoint);
  std::printf("SIGTERM stopped worker %s at step %lld; the job resumed there on the other one\n",
              victim.c_str(), static_cast<long long>(stopped_checkpoint));
}

class StopSignalTest : public ServiceTest, public ::testing::WithParamInterface<int> {};

TEST_P(StopSignalTest, AWorkerThatHasNotRegisteredYetStopsAndExitsZero) {
  // Nobody listens there: the worker retries its registration until the signal comes.
  const int dead_port = FreePort();
  Daemon worker;
  ASSERT_EQ(worker.Start(Binary("moetrain-worker"),
                         {"--coordinator", absl::StrCat("127.0.0.1:", dead_port), "--threads", "1",
                          "--work-dir", (dir_ / "w").string(), "--name", "lonely"},
                         dir_ / "lonely.log"),
            "");
  ASSERT_TRUE(WaitUntil([&] { return worker.Log().find("retrying") != std::string::npos; },
                        std::chrono::seconds(60)))
      << worker.Log();
  kill(worker.pid(), GetParam());
  const int exit_code = worker.WaitExit(std::chrono::seconds(30));
  EXPECT_EQ(exit_code, 0) << worker.Log();
  EXPECT_THAT(worker.Log(), HasSubstr("received "));
  EXPECT_THAT(worker.Log(), HasSubstr("stopped"));
}

TEST_P(StopSignalTest, AnIdleRegisteredWorkerStopsAndExitsZero) {
  StartCoordinator();
  Daemon& worker = StartWorker("idle");
  // Registered on both sides: the coordinator lists it before the worker has read the answer, and
  // a worker signalled in between has not registered yet (it stops without a last heartbeat).
  ASSERT_TRUE(WaitUntil(
      [&] {
        return Workers().size() == 1 &&
               ReadWholeFile(dir_ / "idle.log").find("registered as worker") != std::string::npos;
      },
      std::chrono::seconds(60)))
      << worker.Log();
  kill(worker.pid(), GetParam());
  const int exit_code = worker.WaitExit(std::chrono::seconds(60));
  EXPECT_EQ(exit_code, 0) << ReadWholeFile(dir_ / "idle.log");
  EXPECT_THAT(ReadWholeFile(dir_ / "idle.log"), HasSubstr("stopped"));
  // Its last heartbeat said it is shutting down: DRAINING at once, not IDLE until it times out.
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_DRAINING) << coordinator_->Log();
}

INSTANTIATE_TEST_SUITE_P(Signals, StopSignalTest, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return SignalName(info.param);
                         });

// The documented quick start: a token file and a work directory named relative to where the
// worker is started. `token_from_env` names the token through MOETRAIN_TOKEN_FILE instead.
void ExpectRelativePathsWork(const fs::path& dir, const std::string& address, bool token_from_env,
                             const std::function<std::vector<v1::WorkerInfo>()>& workers) {
  const fs::path start = dir / "start";
  fs::create_directories(start);
  fs::copy_file(dir / "token", start / "token", fs::copy_options::overwrite_existing);
  std::vector<std::string> args = {"--coordinator", address,    "--threads",  "1",
                                   "--name",        "relative", "--work-dir", "w"};
  EnvChanges env = {{"MOETRAIN_TOKEN_FILE", std::nullopt}};
  if (token_from_env) {
    env["MOETRAIN_TOKEN_FILE"] = "token";
  } else {
    args.insert(args.end(), {"--token-file", "token"});
  }
  Child worker(Binary("moetrain-worker"));
  ASSERT_EQ(worker.Start(args, start, env), "");
  const bool registered = WaitUntil(
      [&] {
        for (const v1::WorkerInfo& info : workers()) {
          if (info.name() == "relative") return true;
        }
        return false;
      },
      std::chrono::seconds(60));
  worker.Signal(SIGTERM);
  const Finished finished = worker.Wait(std::chrono::seconds(60));
  EXPECT_TRUE(registered) << finished.err;
  EXPECT_EQ(finished.exit_code, 0) << finished.err;
  EXPECT_TRUE(fs::is_directory(start / "w"));
}

TEST_F(ServiceTest, ARelativeTokenFileFlagIsReadFromWhereTheWorkerStarted) {
  StartCoordinator();
  ExpectRelativePathsWork(dir_, address(), /*token_from_env=*/false, [this] { return Workers(); });
}

TEST_F(ServiceTest, ARelativeTokenFileFromTheEnvironmentIsReadFromWhereTheWorkerStarted) {
  StartCoordinator();
  ExpectRelativePathsWork(dir_, address(), /*token_from_env=*/true, [this] { return Workers(); });
}

}  // namespace
}  // namespace moetrain::testutil
