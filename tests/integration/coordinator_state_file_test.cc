// The coordinator's state file, over real processes: one coordinator per file however the file is
// named (a symbolic or a hard link reaches the same database), and a file the coordinator cannot
// write refused at start, as a damaged one is, rather than served and failed on every write.
//
// MOETRAIN_TEST_COORDINATOR, when set, names the coordinator binary under test (to run these
// tests against another build); by default the one beside the other binaries.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/service_test_util.h"

namespace moetrain::testutil {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kRefusalTimeout = std::chrono::seconds(20);
// The unprivileged user a root test runs the coordinator as: root writes through any mode bits.
constexpr uid_t kNobody = 65534;

fs::path CoordinatorBinary() {
  const char* override_binary = std::getenv("MOETRAIN_TEST_COORDINATOR");
  return override_binary != nullptr && *override_binary != '\0' ? fs::path(override_binary)
                                                                : Binary("moetrain-coordinator");
}

std::vector<std::string> CoordinatorArgs(const fs::path& dir, const fs::path& state_db) {
  return {"--listen",
          "127.0.0.1:0",
          "--http-listen",
          "127.0.0.1:0",
          "--state-db",
          state_db.string(),
          "--checkpoint-dir",
          (dir / "checkpoints").string(),
          "--token-file",
          (dir / "token").string(),
          "--heartbeat-timeout",
          "2s"};
}

using StateFileTest = ServiceTest;

TEST_F(StateFileTest, ASecondCoordinatorThroughALinkIsRefusedAndTheFirstCarriesOn) {
  StartCoordinator();
  StartWorker("w1");
  TinySpec spec = ServiceSpec("long");
  spec.steps = 1000000;  // runs for the whole test
  spec.log_every = 100;
  spec.checkpoint_every = 1000;
  const std::string job_id = Submit(spec);
  ASSERT_TRUE(WaitForState(job_id, v1::JOB_STATE_RUNNING));

  const fs::path symlink = dir_ / "symlink.db", hard_link = dir_ / "hardlink.db";
  fs::create_symlink(dir_ / "state.db", symlink);
  fs::create_hard_link(dir_ / "state.db", hard_link);
  for (const fs::path& link : {symlink, hard_link}) {
    Child second(CoordinatorBinary());
    ASSERT_EQ(second.Start(CoordinatorArgs(dir_, link), dir_), "");
    const Finished finished = second.Wait(kRefusalTimeout);
    EXPECT_FALSE(finished.timed_out)
        << "a second coordinator on " << link << " kept running; its output:\n"
        << finished.err;
    EXPECT_NE(finished.exit_code, 0) << finished.err;
    EXPECT_THAT(finished.err, HasSubstr(link.string()));
    EXPECT_THAT(finished.err, HasSubstr("in use by another coordinator"));
    EXPECT_THAT(finished.err, Not(HasSubstr("serving")));
  }

  // The first coordinator still answers, and neither its job nor its worker was touched.
  std::optional<v1::Job> job = GetJob(job_id);
  ASSERT_TRUE(job.has_value()) << "the first coordinator stopped answering";
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->restarts(), 0);
  EXPECT_EQ(FirstTransitionTo(Events(job_id), v1::JOB_STATE_RESTARTING), nullptr);
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_BUSY);
  EXPECT_FALSE(fs::exists(dir_ / "hardlink.db-wal"))
      << "the refused coordinator wrote a second WAL for the same database";
}

// Coordinators on dir_/state.db run as an unprivileged user when the test runs as root (root
// writes through any mode bits), and own dir_ as a coordinator owns its state directory.
class ReadOnlyStateTest : public ServiceTest {
 protected:
  void SetUp() override {
    ServiceTest::SetUp();
    if (geteuid() == 0) {
      ASSERT_EQ(chown(dir_.c_str(), kNobody, kNobody), 0);
      ASSERT_EQ(chmod((dir_ / "token").c_str(), 0644), 0);
    }
  }

  void TearDown() override {
    chmod(dir_.c_str(), 0700);
    ServiceTest::TearDown();
  }

  // Starts a coordinator on dir_/state.db, its output appended to `log`; its pid, or -1.
  pid_t Spawn(const fs::path& log) {
    const bool as_root = geteuid() == 0;
    std::vector<std::string> args = CoordinatorArgs(dir_, dir_ / "state.db");
    const std::string binary = CoordinatorBinary().string();
    std::vector<char*> argv = {const_cast<char*>(binary.c_str())};
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0) return -1;
    const pid_t pid = fork();
    if (pid == 0) {
      if (as_root && (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0)) {
        _exit(125);
      }
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out);
    return pid;
  }

  // Waits up to `timeout` for `pid` to exit; its exit code, or -1 (then it is killed).
  static int WaitExit(pid_t pid, std::chrono::milliseconds timeout) {
    int status = 0;
    if (!WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout)) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // A valid state file in dir_, made by a coordinator that is then stopped.
  void MakeStateFile() {
    const fs::path log = dir_ / "first.log";
    const pid_t first = Spawn(log);
    ASSERT_GT(first, 0);
    const bool serving =
        WaitUntil([&] { return ReadWholeFile(log).find("serving") != std::string::npos; },
                  std::chrono::seconds(30));
    kill(first, SIGTERM);
    ASSERT_EQ(WaitExit(first, std::chrono::seconds(30)), 0) << ReadWholeFile(log);
    ASSERT_TRUE(serving) << ReadWholeFile(log);
    ASSERT_TRUE(fs::exists(dir_ / "state.db"));
  }

  // Starts a coordinator on the state file that must be refused, and checks that it was.
  void ExpectRefused() {
    const fs::path log = dir_.parent_path() / (dir_.filename().string() + "-second.log");
    const pid_t second = Spawn(log);
    ASSERT_GT(second, 0);
    const int exit_code = WaitExit(second, kRefusalTimeout);
    const std::string output = ReadWholeFile(log);
    fs::remove(log);
    EXPECT_NE(exit_code, -1) << "the coordinator served a state file it cannot write:\n" << output;
    EXPECT_NE(exit_code, 0) << output;
    EXPECT_NE(exit_code, 125) << "could not switch to an unprivileged user";
    EXPECT_THAT(output, HasSubstr((dir_ / "state.db").string()));
    EXPECT_THAT(output, HasSubstr("must be able to write"));
    EXPECT_THAT(output, Not(HasSubstr("serving")));
  }
};

TEST_F(ReadOnlyStateTest, AReadOnlyStateFileIsRefusedAtStart) {
  MakeStateFile();
  const std::string before = ReadWholeFile(dir_ / "state.db");
  // The directory stays writable: only the file is read-only.
  ASSERT_EQ(chmod((dir_ / "state.db").c_str(), 0444), 0);
  ExpectRefused();
  EXPECT_EQ(ReadWholeFile(dir_ / "state.db"), before) << "the refused file was changed";
}

TEST_F(ReadOnlyStateTest, AStateFileInAReadOnlyDirectoryIsRefusedAtStart) {
  MakeStateFile();
  // The file is writable, its directory (where SQLite creates state.db-wal and -shm) is not.
  ASSERT_EQ(chmod(dir_.c_str(), 0555), 0);
  ExpectRefused();
}

}  // namespace
}  // namespace moetrain::testutil
