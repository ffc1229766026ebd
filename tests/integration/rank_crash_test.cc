// A rank runs in a process of its own, so that nothing it does takes its worker down: a rank
// killed by SIGSEGV, SIGBUS or SIGKILL (what the kernel's OOM killer sends) fails its attempt
// with the signal named, and the worker lives, reports and trains the job's next attempt. A
// worker killed with SIGKILL takes its rank process with it. Real processes on 127.0.0.1.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;

// A process's state and parent from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold
// spaces and parentheses, the last ')' ends it); false when there is no such process.
bool ReadStat(pid_t pid, std::string* state, pid_t* parent) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  return static_cast<bool>(rest >> *state >> *parent);
}

// The live processes whose parent is `parent`.
std::vector<pid_t> ChildProcesses(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc", error)) {
    pid_t pid = 0, ppid = 0;
    std::string state;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    if (ReadStat(pid, &state, &ppid) && ppid == parent && state != "Z") children.push_back(pid);
  }
  return children;
}

// Running, as opposed to gone or a zombie nobody has reaped (an orphan's reaper may be slow).
bool ProcessRuns(pid_t pid) {
  std::string state;
  pid_t parent = 0;
  return ReadStat(pid, &state, &parent) && state != "Z";
}

// The rank process of a worker that trains: its only child.
pid_t RankProcessOf(const Daemon& worker) {
  pid_t rank = 0;
  WaitUntil(
      [&] {
        const std::vector<pid_t> children = ChildProcesses(worker.pid());
        if (children.size() == 1) rank = children.front();
        return rank != 0;
      },
      std::chrono::seconds(30));
  return rank;
}

class RankProcessServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    // The processes this test crashes write no core files (the workers inherit the limit).
    const rlimit no_cores = {0, 0};
    setrlimit(RLIMIT_CORE, &no_cores);
  }

  // Submits `job` to a coordinator with one worker, and once it has reported step `step`, the
  // worker's rank process (0, with a failure, when there is none).
  pid_t StartTraining(const TinySpec& job, int64_t step, std::string* id) {
    StartCoordinator();
    Daemon& worker = StartWorker("a");
    *id = Submit(job);
    const bool trains = WaitUntil(
        [&] {
          std::optional<v1::Job> running = GetJob(*id);
          return running.has_value() && running->last_metrics().step() >= step;
        },
        std::chrono::seconds(120));
    if (!trains) {
      ADD_FAILURE() << "the job did not reach step " << step << ":\n" << coordinator_->Log();
      return 0;
    }
    const pid_t rank = RankProcessOf(worker);
    if (rank == 0 || rank == worker.pid()) {
      ADD_FAILURE() << "the worker runs no rank process:\n" << worker.Log();
      return 0;
    }
    return rank;
  }
};

class RankSignalTest : public RankProcessServiceTest, public ::testing::WithParamInterface<int> {};

TEST_P(RankSignalTest, ARankKilledByASignalFailsItsAttemptAndTheWorkerTrainsTheNext) {
  const int signal_number = GetParam();
  // Long enough that no machine trains it out before the signal: the test cancels it.
  TinySpec job = ServiceSpec("crash");
  job.steps = 100000;
  job.log_every = 10;
  job.checkpoint_every = 50;
  job.max_restarts = 2;
  std::string id;
  const pid_t rank = StartTraining(job, 20, &id);
  ASSERT_NE(rank, 0);
  const Daemon& worker = *workers_.at("a");
  ASSERT_EQ(kill(rank, signal_number), 0);

  // The only worker lives on and trains the job's next attempt: a step reported after the
  // restart.
  std::string reason;
  ASSERT_TRUE(WaitUntil(
      [&] {
        bool restarted = false;
        for (const v1::JobEvent& event : Events(id)) {
          if (event.has_state_change() &&
              event.state_change().to() == v1::JOB_STATE_RESTARTING) {
            restarted = true;
            reason = event.state_change().reason();
          }
          if (restarted && event.has_step_metrics()) return true;
        }
        return false;
      },
      std::chrono::seconds(240)))
      << coordinator_->Log() << worker.Log();
  EXPECT_EQ(waitpid(worker.pid(), nullptr, WNOHANG), 0) << "the worker exited:\n" << worker.Log();
  const v1::Job running = *GetJob(id);
  EXPECT_EQ(running.restarts(), 1);
  EXPECT_EQ(running.attempt(), 2);
  const std::string name = absl::StrCat("SIG", sigabbrev_np(signal_number));
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("killed by signal ", signal_number, " (", name)));
  EXPECT_THAT(worker.Log(), HasSubstr(name));
  std::printf("%s in the rank process: the attempt failed with \"%s\"\n", name.c_str(),
              reason.c_str());
  EXPECT_EQ(Moetrain({"cancel", id}).exit_code, 0);
}

INSTANTIATE_TEST_SUITE_P(Signals, RankSignalTest, ::testing::Values(SIGSEGV, SIGBUS, SIGKILL),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(sigabbrev_np(info.param));
                         });

TEST_F(RankProcessServiceTest, AWorkerKilledTakesItsRankProcessWithIt) {
  TinySpec job = ServiceSpec("orphan");
  job.steps = 6000;
  job.log_every = 10;
  std::string id;
  const pid_t rank = StartTraining(job, 10, &id);
  ASSERT_NE(rank, 0);
  workers_.at("a")->Kill();
  // No rank trains on for a worker that can no longer report for it nor hold its lease.
  EXPECT_TRUE(WaitUntil([&] { return !ProcessRuns(rank); }, std::chrono::seconds(10)))
      << "rank process " << rank << " outlived its worker";
}

}  // namespace
}  // namespace moetrain::testutil
