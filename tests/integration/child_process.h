// Runs a program as a child process the way a person or a script does, for the tests that drive
// the real binaries: stdout and stderr on pipes drained while it runs (so it never blocks on a
// full pipe), a deadline after which it is killed, and its JSON-lines output parsed.
//
//   Child child(fs::path(MOETRAIN_BIN_DIR) / "moetrain");
//   ASSERT_EQ(child.Start({"jobs", "--json"}, dir), "");
//   const Finished finished = child.Wait(std::chrono::seconds(60));
//   EXPECT_EQ(finished.exit_code, 0) << finished.err;
//
// Header-only and test-only: it uses gtest for JsonLines' failures.
#ifndef MOETRAIN_TESTS_INTEGRATION_CHILD_PROCESS_H_
#define MOETRAIN_TESTS_INTEGRATION_CHILD_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace moetrain::testutil {

using ChildClock = std::chrono::steady_clock;

// How a child ended, and everything it printed.
struct Finished {
  bool timed_out = false;  // killed by us after its deadline
  int exit_code = -1;      // when it exited
  int term_signal = 0;     // when a signal ended it
  std::string out, err;
};

// Changes to the parent's environment for a child: NAME → value sets (or replaces) NAME,
// NAME → nullopt removes it.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

// The parent's environment with `changes` applied, as NAME=value entries for execve.
inline std::vector<std::string> ChildEnvironment(const EnvChanges& changes) {
  std::vector<std::string> entries;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    if (!changes.contains(entry.substr(0, entry.find('=')))) entries.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value.has_value()) entries.push_back(name + "=" + *value);
  }
  return entries;
}

// One process of `binary`. Killed when destroyed unless already reaped.
class Child {
 public:
  explicit Child(std::filesystem::path binary) : binary_(std::move(binary)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int& fd : fds_) CloseFd(fd);
  }

  // Starts the binary with `args` in `cwd`, stdin from /dev/null, the parent's environment with
  // `env` applied. Empty on success, else what went wrong.
  std::string Start(const std::vector<std::string>& args, const std::filesystem::path& cwd,
                    const EnvChanges& env = {}) {
    const std::string binary = binary_.string(), dir = cwd.string();
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> env_storage = ChildEnvironment(env);
    std::vector<char*> envp;
    for (std::string& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return std::string("pipe2: ") + std::strerror(errno);
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return std::string("pipe2: ") + std::strerror(errno);
    }
    const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t pid = fork();
    if (pid == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      if (chdir(dir.c_str()) != 0) _exit(126);
      execve(binary.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    const int fork_errno = errno;
    if (null_fd >= 0) close(null_fd);
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
    if (pid < 0) return std::string("fork: ") + std::strerror(fork_errno);
    pid_ = pid;
    return "";
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // Reads until `done(stdout so far)` holds, the child closes its pipes, or `timeout` passes.
  bool WaitForStdout(const std::function<bool(const std::string&)>& done,
                     ChildClock::duration timeout) {
    const ChildClock::time_point deadline = ChildClock::now() + timeout;
    while (!done(out_)) {
      if (PipesClosed() || ChildClock::now() >= deadline) return done(out_);
      ReadSome(deadline);
    }
    return true;
  }

  // Waits for the child to end; past `timeout` it is killed with SIGKILL and timed_out is set.
  Finished Wait(ChildClock::duration timeout) {
    Finished result;
    const ChildClock::time_point deadline = ChildClock::now() + timeout;
    int status = 0;
    const bool started = pid_ > 0;
    while (pid_ > 0) {
      if (!PipesClosed()) {
        ReadSome(deadline);
      } else {
        const pid_t reaped = waitpid(pid_, &status, WNOHANG);
        if (reaped == pid_) {
          pid_ = 0;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (ChildClock::now() >= deadline) {
        result.timed_out = true;
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        pid_ = 0;
      }
    }
    // Whatever is still buffered in the pipes (the child is gone, so they end soon).
    while (!PipesClosed()) ReadSome(ChildClock::now() + std::chrono::seconds(1));
    if (started && !result.timed_out) {
      if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
    }
    result.out = out_;
    result.err = err_;
    return result;
  }

 private:
  static void CloseFd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }

  bool PipesClosed() const { return fds_[0] < 0 && fds_[1] < 0; }

  // One poll of the open pipes (at most until `deadline`, and at most 50 ms), then reads what is
  // there; a pipe at end of file is closed.
  void ReadSome(ChildClock::time_point deadline) {
    pollfd polled[2];
    int count = 0;
    for (int fd : fds_) {
      if (fd >= 0) polled[count++] = {.fd = fd, .events = POLLIN, .revents = 0};
    }
    if (count == 0) return;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ChildClock::now()).count();
    const int timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 50));
    if (poll(polled, count, timeout_ms) <= 0) return;
    for (int i = 0; i < count; ++i) {
      if (polled[i].revents == 0) continue;
      const int which = polled[i].fd == fds_[0] ? 0 : 1;
      char buffer[4096];
      const ssize_t n = read(fds_[which], buffer, sizeof(buffer));
      if (n > 0) {
        (which == 0 ? out_ : err_).append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        CloseFd(fds_[which]);
      }
    }
  }

  const std::filesystem::path binary_;
  pid_t pid_ = 0;
  int fds_[2] = {-1, -1};  // the read ends of the child's stdout and stderr
  std::string out_, err_;
};

// Every line of `text` as a JSON object; a line that is not one fails the test.
inline std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(parsed.is_object()) << "stdout line is not a JSON object: " << line;
    if (parsed.is_object()) lines.push_back(std::move(parsed));
  }
  return lines;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_INTEGRATION_CHILD_PROCESS_H_
