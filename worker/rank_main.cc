#include "worker/rank_main.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/core/log.h"
#include "moetrain/v1/proto_time.h"
#include "worker/rank_channel.h"
#include "worker/rank_channel.pb.h"
#include "worker/rank_runner.h"

namespace moetrain {
namespace {

constexpr absl::string_view kFlag = "--moetrain-rank-process=";
constexpr int kExitBadInvocation = 2;
constexpr int kExitAgentGone = 3;

// Ends the process at once: the worker that started it is gone (or speaks nonsense), so nobody
// can take its reports, and no lease covers a checkpoint.
[[noreturn]] void AgentGone(const absl::Status& why) {
  Log(absl::StrCat("rank process ", getpid(), ": the worker is gone (", why.message(),
                   "); ending"));
  std::fflush(nullptr);
  _exit(kExitAgentGone);
}

// The worker as the rank sees it: every request a message on the channel, every question waiting
// for its Reply, which a thread of its own reads along with the stop orders.
class ChannelAgent final : public RankAgent {
 public:
  ChannelAgent(MessageChannel* channel, RankControl* control)
      : channel_(channel), control_(control) {
    // Reads until the process ends: it never returns once started (a closed channel ends the
    // process), so it is detached rather than joined.
    std::thread([this] { ReadOrders(); }).detach();
  }

  void Report(Reporter::Report report) override {
    rank::FromRank message;
    std::visit(
        [&message](auto&& request) {
          using Request = std::decay_t<decltype(request)>;
          if constexpr (std::is_same_v<Request, v1::ReportStepRequest>) {
            *message.mutable_step() = std::move(request);
          } else if constexpr (std::is_same_v<Request, v1::ReportLogRequest>) {
            *message.mutable_log() = std::move(request);
          } else if constexpr (std::is_same_v<Request, v1::ReportCheckpointRequest>) {
            *message.mutable_checkpoint() = std::move(request);
          } else {
            *message.mutable_end() = std::move(request);
          }
        },
        std::move(report));
    Send(message).IgnoreError();
  }

  void Progress(int64_t step) override {
    rank::FromRank message;
    message.set_progress(step);
    Send(message).IgnoreError();
  }

  absl::Status MayWriteCheckpoints() override {
    rank::Call call;
    call.mutable_lease();
    return Ask(std::move(call)).status();
  }

  absl::Status KvSet(const std::string& key, const std::string& value) override {
    rank::Call call;
    call.mutable_kv_set()->set_key(key);
    call.mutable_kv_set()->set_value(value);
    return Ask(std::move(call)).status();
  }

  absl::StatusOr<std::string> KvGet(const std::string& key, absl::Duration timeout) override {
    rank::Call call;
    call.mutable_kv_get()->set_key(key);
    ToProtoDuration(timeout, call.mutable_kv_get()->mutable_timeout());
    return Ask(std::move(call));
  }

  void Add(CommOp op, int64_t bytes_sent, int64_t bytes_received, double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    rank::CommTraffic& traffic = traffic_[static_cast<int>(op)];
    traffic.set_op(static_cast<int>(op));
    traffic.set_bytes_sent(traffic.bytes_sent() + bytes_sent);
    traffic.set_bytes_received(traffic.bytes_received() + bytes_received);
    traffic.set_seconds(traffic.seconds() + seconds);
  }

  void ObservePhases(const StepPhaseSeconds& phases, const DeviceRuntime* device) override {
    rank::FromRank message;
    rank::Metrics* metrics = message.mutable_metrics();
    for (double seconds :
         {phases.forward, phases.backward, phases.communication, phases.optimizer}) {
      metrics->add_phase_seconds(seconds);
    }
    AddTraffic(metrics);
    if (device != nullptr) {
      const DeviceMemoryStats stats = device->memory_stats();
      rank::DeviceMemory* memory = metrics->mutable_device();
      memory->set_device(device->device().DebugString());
      memory->set_in_use_bytes(stats.in_use_bytes);
      memory->set_peak_bytes(stats.peak_bytes);
      memory->set_total_bytes(stats.total_bytes);
    }
    Send(message).IgnoreError();
  }

  // The traffic since the last step (the last checkpoint's collectives), before the end report.
  void FlushTraffic() {
    rank::FromRank message;
    AddTraffic(message.mutable_metrics());
    if (message.metrics().comm_size() > 0) Send(message).IgnoreError();
  }

 private:
  // Moves the traffic counted since the last Metrics into `metrics`.
  void AddTraffic(rank::Metrics* metrics) {
    std::lock_guard<std::mutex> lock(mu_);
    for (rank::CommTraffic& traffic : traffic_) {
      if (traffic.bytes_sent() == 0 && traffic.bytes_received() == 0 && traffic.seconds() == 0) {
        continue;  // no operation of this kind since the last step
      }
      *metrics->add_comm() = traffic;
      traffic.Clear();
    }
  }

  absl::Status Send(const rank::FromRank& message) {
    const absl::Status sent = channel_->Send(message);
    if (absl::IsUnavailable(sent)) AgentGone(sent);
    // Too large a message (a report of a model far beyond any real one): that message is lost,
    // the rank goes on.
    if (!sent.ok()) Log(absl::StrCat("rank process ", getpid(), ": ", sent.message()));
    return sent;
  }

  // Sends the question and waits for its answer: the Reply's status, and its value when OK.
  absl::StatusOr<std::string> Ask(rank::Call call) {
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      id = next_call_id_++;
      replies_.emplace(id, std::nullopt);
    }
    call.set_call_id(id);
    rank::FromRank message;
    *message.mutable_call() = std::move(call);
    if (const absl::Status sent = Send(message); !sent.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.erase(id);
      return sent;
    }
    std::unique_lock<std::mutex> lock(mu_);
    answered_.wait(lock, [&] { return replies_.at(id).has_value(); });
    rank::Reply reply = *std::move(replies_.at(id));
    replies_.erase(id);
    if (reply.code() != 0) {
      return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
    }
    return std::move(*reply.mutable_value());
  }

  void ReadOrders() {
    for (;;) {
      rank::ToRank message;
      const absl::Status received = channel_->Receive(&message);
      if (!received.ok()) AgentGone(received);
      if (message.has_stop()) {
        // Draining first: the end report that the stop leads to must say so.
        if (message.stop().worker_draining()) control_->worker_draining.store(true);
        const StopRequest request =
            message.stop().kind() == rank::STOP_KIND_STOP   ? StopRequest::kStop
            : message.stop().kind() == rank::STOP_KIND_NONE ? StopRequest::kNone
                                                            : StopRequest::kCheckpointAndStop;
        if (request != StopRequest::kNone) control_->stop.store(request);
      } else if (message.has_reply()) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = replies_.find(message.reply().call_id());
        if (it != replies_.end()) it->second = std::move(*message.mutable_reply());
        answered_.notify_all();
      }
    }
  }

  MessageChannel* const channel_;
  RankControl* const control_;
  std::mutex mu_;
  std::condition_variable answered_;
  uint64_t next_call_id_ = 1;
  std::map<uint64_t, std::optional<rank::Reply>> replies_;  // guarded by mu_
  std::array<rank::CommTraffic, kNumCommOps> traffic_;      // guarded by mu_: since last sent
};

// oom_score_adj + 500, at most 1000: raising it needs no privilege.
void RaiseOomScore() {
  int score = 0;
  if (FILE* in = std::fopen("/proc/self/oom_score_adj", "r")) {
    if (std::fscanf(in, "%d", &score) != 1) score = 0;
    std::fclose(in);
  }
  if (FILE* out = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fprintf(out, "%d", std::min(score + 500, 1000));
    std::fclose(out);
  }
}

RankEnvironment EnvironmentOf(const rank::RankStart& start) {
  RankEnvironment environment;
  environment.worker_id = start.worker_id();
  environment.threads = start.threads();
  environment.comm_host = start.comm_host();
  environment.comm_timeout = FromProtoDuration(start.comm_timeout());
  environment.data_roots.assign(start.data_roots().begin(), start.data_roots().end());
  environment.memory_limit_bytes = start.memory_limit_bytes();
  environment.stop_after_step = start.stop_after_step();
  environment.device = start.cuda() ? Device::Cuda(start.cuda_device()) : Device::Cpu();
  environment.reports_checkpoints = start.reports_checkpoints();
  environment.metrics = start.metrics();
  return environment;
}

}  // namespace

std::string RankProcessFlag(pid_t agent) { return absl::StrCat(kFlag, kRankChannelFd, ",", agent); }

bool IsRankProcess(int argc, char** argv) { return argc == 2 && absl::StartsWith(argv[1], kFlag); }

int RankProcessMain(int argc, char** argv) {
  // Blocked already when the worker started this process; again for a process started otherwise.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(argv[1]).substr(kFlag.size()), ',');
  int fd = -1;
  pid_t agent = 0;
  if (argc != 2 || fields.size() != 2 || !absl::SimpleAtoi(fields[0], &fd) ||
      !absl::SimpleAtoi(fields[1], &agent) || fd < 0 || agent <= 0) {
    std::fprintf(stderr, "%s: a rank process is started by its worker, as %s<fd>,<worker pid>\n",
                 argv[0], std::string(kFlag).c_str());
    return kExitBadInvocation;
  }
  // The rank dies with its worker, which alone may report for it and hold its lease. Checked
  // after setting: a worker that died before has made this process an orphan already.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // What ps and top show for it, beside its worker's name.
  prctl(PR_SET_NAME, "moetrain-rank");
  if (getppid() != agent) {
    std::fprintf(stderr, "%s: the worker (pid %d) that started this rank is gone\n", argv[0],
                 static_cast<int>(agent));
    return kExitAgentGone;
  }
  // Nothing the rank starts inherits the channel: the worker must see it close when the rank ends.
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  // A rank holds most of the memory: when the kernel's OOM killer must choose, it chooses the rank
  // (which fails its attempt) before the worker (which would take every rank with it).
  RaiseOomScore();
  MessageChannel channel(fd);
  rank::ToRank first;
  if (const absl::Status received = channel.Receive(&first); !received.ok() || !first.has_start()) {
    std::fprintf(stderr, "%s: no rank to run from the worker: %s\n", argv[0],
                 received.ok() ? "its first message is not a start" : received.ToString().c_str());
    return kExitBadInvocation;
  }
  const rank::RankStart& start = first.start();
  LogEnabled().store(start.log());
  RankControl control;
  ChannelAgent agent_link(&channel, &control);
  const v1::ReportAttemptEndRequest end =
      RunRank(start.assignment(), EnvironmentOf(start), &agent_link, &control);
  if (start.metrics()) agent_link.FlushTraffic();
  agent_link.Report(end);
  // Out without running destructors: the reading thread still waits on the channel, and the
  // engine's libraries (OpenMP, CUDA) need no orderly goodbye from a process that ends here.
  std::fflush(nullptr);
  _exit(0);
}

}  // namespace moetrain
