#include "worker/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "engine/core/log.h"
#include "moetrain/v1/proto_time.h"
#include "worker/rank_main.h"

extern char** environ;

namespace moetrain {
namespace {

rank::StopKind KindOf(StopRequest request) {
  switch (request) {
    case StopRequest::kNone:
      return rank::STOP_KIND_NONE;
    case StopRequest::kCheckpointAndStop:
      return rank::STOP_KIND_CHECKPOINT_AND_STOP;
    case StopRequest::kStop:
      return rank::STOP_KIND_STOP;
  }
  return rank::STOP_KIND_STOP;
}

// posix_spawn's attributes and file actions, destroyed on every path.
struct SpawnSetup {
  SpawnSetup() {
    posix_spawnattr_init(&attributes);
    posix_spawn_file_actions_init(&actions);
  }
  ~SpawnSetup() {
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
  }
  posix_spawnattr_t attributes;
  posix_spawn_file_actions_t actions;
};

}  // namespace

std::string DescribeRankExit(int wait_status, int64_t step) {
  if (WIFSIGNALED(wait_status)) {
    const int signal_number = WTERMSIG(wait_status);
    const char* abbreviation = sigabbrev_np(signal_number);
    std::string text =
        absl::StrCat("was killed by signal ", signal_number, " (",
                     abbreviation != nullptr ? absl::StrCat("SIG", abbreviation) : "unknown", ", ",
                     strsignal(signal_number), ") after step ", step);
    if (signal_number == SIGKILL) {
      absl::StrAppend(&text,
                      "; the kernel's OOM killer sends SIGKILL when memory runs out (its log, "
                      "dmesg, says so), as does kill -9");
    } else if (signal_number == SIGBUS) {
      absl::StrAppend(&text,
                      "; SIGBUS comes from a memory-mapped file that shrank under the rank, or "
                      "from a memory error");
    }
    return text;
  }
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status), " after step ", step,
                        " without reporting how its attempt ended");
  }
  return absl::StrCat("ended with wait status ", wait_status, " after step ", step);
}

RankProcess::RankProcess(std::string executable, rank::RankStart start, RankProcessHooks hooks)
    : executable_(std::move(executable)), start_(std::move(start)), hooks_(std::move(hooks)) {
  // The thread that starts the process outlives it: PR_SET_PDEATHSIG, which ends the rank with
  // the worker, fires when the starting thread ends, not only the process.
  thread_ = std::thread([this] { Serve(); });
}

RankProcess::~RankProcess() {
  Kill();
  Join();
}

void RankProcess::Join() {
  if (thread_.joinable()) thread_.join();
}

void RankProcess::Kill() {
  std::lock_guard<std::mutex> lock(mu_);
  kill_requested_ = true;  // a process not started yet is killed as it starts
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    killed_ = true;
  }
}

bool RankProcess::Stop(StopRequest request, bool worker_draining) {
  std::lock_guard<std::mutex> lock(mu_);
  bool changed = false;
  const rank::StopKind kind = KindOf(request);
  if (kind > stop_.kind()) {
    stop_.set_kind(kind);
    changed = true;
  }
  if (worker_draining && !stop_.worker_draining()) {
    stop_.set_worker_draining(true);
    changed = true;
  }
  // Sent by the writer, never here: the callers hold the worker's lock, and a rank that does not
  // read (stopped, or busy with a large answer) must not hold it up.
  if (changed) stop_changed_.notify_all();
  return changed;
}

void RankProcess::WriteStopOrders(MessageChannel* channel) {
  rank::StopOrder sent;
  for (;;) {
    rank::ToRank order;
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_changed_.wait(lock, [&] {
        return exited_ || stop_.kind() != sent.kind() ||
               stop_.worker_draining() != sent.worker_draining();
      });
      if (exited_) return;
      sent = stop_;
      *order.mutable_stop() = stop_;
    }
    // A rank that cannot be told is gone: its end is reported as it is found.
    channel->Send(order).IgnoreError();
  }
}

absl::StatusOr<pid_t> RankProcess::Spawn(int* agent_fd) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::UnavailableError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  // The rank's end goes to kRankChannelFd in the rank; from a descriptor above it, so that the
  // dup2 is never onto itself (which would leave close-on-exec set).
  const int rank_fd = fcntl(fds[1], F_DUPFD_CLOEXEC, kRankChannelFd + 1);
  close(fds[1]);
  if (rank_fd < 0) {
    close(fds[0]);
    return absl::UnavailableError(absl::StrCat("fcntl: ", std::strerror(errno)));
  }
  SpawnSetup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, rank_fd, kRankChannelFd);
  // Nothing else of the worker's (its gRPC connections, its listening sockets) goes along.
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, kRankChannelFd + 1);
  // The worker's stop signals are the worker's to handle: it orders its ranks over the channel
  // (a checkpoint first on SIGTERM), so a Ctrl-C that reaches the rank too must not cut it short.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  posix_spawnattr_setsigmask(&setup.attributes, &blocked);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGMASK);
  const std::string flag = RankProcessFlag(getpid());
  // /proc/self/exe runs this very file, even if a newer version replaced it on disk since; `ps`
  // shows the path it links to.
  std::error_code ignored;
  std::string program = std::filesystem::read_symlink(executable_, ignored).string();
  if (program.empty()) program = executable_;
  char* argv[] = {program.data(), const_cast<char*>(flag.c_str()), nullptr};
  pid_t pid = 0;
  const int error =
      posix_spawn(&pid, executable_.c_str(), &setup.actions, &setup.attributes, argv, environ);
  close(rank_fd);
  if (error != 0) {
    close(fds[0]);
    return absl::UnavailableError(
        absl::StrCat("cannot start the rank process ", executable_, ": ", std::strerror(error)));
  }
  *agent_fd = fds[0];
  return pid;
}

void RankProcess::Serve() {
  int agent_fd = -1;
  const absl::StatusOr<pid_t> pid = Spawn(&agent_fd);
  if (!pid.ok()) {
    v1::ReportAttemptEndRequest end = DeathReport(0, "");
    end.set_message(std::string(pid.status().message()));
    hooks_.on_exit(std::move(end), /*reported=*/false);
    return;
  }
  std::shared_ptr<RankMetrics> metrics;
  if (hooks_.metrics != nullptr) {
    absl::StatusOr<std::shared_ptr<RankMetrics>> started =
        hooks_.metrics->StartRank(start_.assignment().job_id(), start_.assignment().rank(), *pid);
    // Metrics are for the operator: a rank trains without them rather than fail.
    if (started.ok()) {
      metrics = *std::move(started);
    } else {
      Log(absl::StrCat("job ", start_.assignment().job_id(), " rank ", start_.assignment().rank(),
                       ": no metrics: ", started.status().message()));
    }
  }
  MessageChannel channel(agent_fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pid_ = *pid;
    if (kill_requested_) {
      kill(pid_, SIGKILL);
      killed_ = true;
    }
  }
  rank::ToRank start;
  *start.mutable_start() = start_;
  start.mutable_start()->set_metrics(metrics != nullptr);
  // A process that cannot be told its start is gone: the loop below finds the channel closed.
  channel.Send(start).IgnoreError();
  // Stop orders follow the start, whenever they come.
  std::thread writer([this, &channel] { WriteStopOrders(&channel); });
  std::string broken;
  for (;;) {
    rank::FromRank message;
    const absl::Status received = channel.Receive(&message);
    if (!received.ok()) {
      // Closed, or reset (a process that ended with the worker's messages unread): gone. A frame
      // that does not parse comes from a rank that is broken beyond trusting its end.
      if (absl::IsDataLoss(received)) broken = std::string(received.message());
      break;
    }
    Handle(message, &channel, metrics.get());
  }
  if (!broken.empty()) Kill();
  // Waited for without reaping first, so that Kill never signals a reused pid.
  siginfo_t info = {};
  while (waitid(P_PID, *pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  bool killed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
    killed = killed_;
  }
  stop_changed_.notify_all();
  writer.join();
  // The rank's series stay; its process is no longer counted, before its pid can be reused.
  metrics.reset();
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  v1::ReportAttemptEndRequest end;
  const bool reported = end_ != nullptr && broken.empty();
  if (reported) {
    end = *end_;
    if (status != 0) {
      Log(absl::StrCat("job ", start_.assignment().job_id(), " rank ", start_.assignment().rank(),
                       ": the rank's process ", DescribeRankExit(status, step_.load()),
                       " (after reporting its end)"));
    }
  } else {
    std::string cause = broken;
    if (killed && cause.empty()) cause = "the worker ended it";
    end = DeathReport(status, cause);
    Log(absl::StrCat("job ", start_.assignment().job_id(), " attempt ",
                     start_.assignment().attempt(), " rank ", start_.assignment().rank(), ": ",
                     end.message()));
  }
  hooks_.on_exit(std::move(end), reported);
}

void RankProcess::Handle(rank::FromRank& message, MessageChannel* channel,
                         RankMetrics* metrics) {
  switch (message.kind_case()) {
    case rank::FromRank::kStep:
      hooks_.report(std::move(*message.mutable_step()));
      break;
    case rank::FromRank::kLog:
      hooks_.report(std::move(*message.mutable_log()));
      break;
    case rank::FromRank::kCheckpoint:
      hooks_.report(std::move(*message.mutable_checkpoint()));
      break;
    case rank::FromRank::kEnd:
      end_ = std::make_unique<v1::ReportAttemptEndRequest>(std::move(*message.mutable_end()));
      break;
    case rank::FromRank::kProgress:
      step_.store(message.progress());
      break;
    case rank::FromRank::kCall:
      Answer(message.call(), channel);
      break;
    case rank::FromRank::kMetrics:
      if (metrics != nullptr) metrics->Observe(message.metrics());
      break;
    case rank::FromRank::KIND_NOT_SET:
      break;
  }
}

void RankProcess::Answer(const rank::Call& call, MessageChannel* channel) {
  absl::Status status = absl::OkStatus();
  rank::ToRank answer;
  rank::Reply* reply = answer.mutable_reply();
  reply->set_call_id(call.call_id());
  switch (call.kind_case()) {
    case rank::Call::kLease:
      if (hooks_.may_write_checkpoints) status = hooks_.may_write_checkpoints();
      break;
    case rank::Call::kKvSet:
      status = hooks_.rendezvous == nullptr
                   ? absl::FailedPreconditionError("an attempt of one rank has no rendezvous")
                   : hooks_.rendezvous->Set(call.kv_set().key(), call.kv_set().value());
      break;
    case rank::Call::kKvGet: {
      if (hooks_.rendezvous == nullptr) {
        status = absl::FailedPreconditionError("an attempt of one rank has no rendezvous");
        break;
      }
      absl::StatusOr<std::string> value =
          hooks_.rendezvous->Get(call.kv_get().key(), FromProtoDuration(call.kv_get().timeout()));
      if (value.ok()) {
        reply->set_value(*std::move(value));
      } else {
        status = value.status();
      }
      break;
    }
    case rank::Call::KIND_NOT_SET:
      status = absl::InvalidArgumentError("a call with no question");
      break;
  }
  reply->set_code(static_cast<int32_t>(status.code()));
  reply->set_message(std::string(status.message()));
  channel->Send(answer).IgnoreError();
}

v1::ReportAttemptEndRequest RankProcess::DeathReport(int wait_status,
                                                     const std::string& cause) const {
  const int64_t step = step_.load();
  v1::ReportAttemptEndRequest end;
  end.set_worker_id(start_.worker_id());
  end.set_job_id(start_.assignment().job_id());
  end.set_attempt(start_.assignment().attempt());
  end.set_rank(start_.assignment().rank());
  end.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
  end.set_step(step);
  // A crash may be this machine's (memory, a file changed under it) as much as the job's: the
  // restart budget bounds the retries of one that is the job's.
  end.set_failure_kind(v1::FAILURE_KIND_TRANSIENT);
  end.set_message(absl::StrCat("the rank's process ", DescribeRankExit(wait_status, step),
                               cause.empty() ? "" : absl::StrCat(" (", cause, ")")));
  {
    std::lock_guard<std::mutex> lock(mu_);
    end.set_worker_draining(stop_.worker_draining());
  }
  return end;
}

}  // namespace moetrain
