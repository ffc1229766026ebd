// A rank of an assignment in a process of its own, started and served by the worker, which is to
// its ranks what torchrun's elastic agent is to its workers: whatever happens inside a rank (a
// crash, SIGBUS from a file changed under it, the kernel's OOM killer) ends that rank's attempt,
// never the worker, which reports how it ended and takes its next assignment.
//
// The rank process is the worker's own executable, started as `EXE --moetrain-rank-process=FD,PID`
// (worker/rank_main.h) with its end of a socket pair at FD. It is sent its RankStart, then sends
// its reports, questions (the checkpoint lease, the rendezvous) and metrics, and takes stop orders
// (worker/rank_channel.proto); its last message is its end report. It dies with the worker
// (PR_SET_PDEATHSIG), so a worker that is killed leaves no rank training on without a lease.
//
//   RankProcess rank(executable, start, {.report = ..., .on_exit = ...});
//   rank.Stop(StopRequest::kCheckpointAndStop, /*worker_draining=*/true);
//   ...                                  // on_exit is told the end report once the process is gone
//   rank.Join();
#ifndef MOETRAIN_WORKER_RANK_PROCESS_H_
#define MOETRAIN_WORKER_RANK_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "engine/comm/communicator.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/worker.pb.h"
#include "worker/rank_channel.h"
#include "worker/rank_channel.pb.h"
#include "worker/reporter.h"
#include "worker/worker_metrics.h"

namespace moetrain {

// Called on the rank's serving thread.
struct RankProcessHooks {
  // The rank's step, log and checkpoint reports, in the order it made them.
  std::function<void(Reporter::Report)> report;
  // Answers the rank's question before each checkpoint (the worker's lease).
  std::function<absl::Status()> may_write_checkpoints;
  // The attempt's rendezvous, which the rank's KvSet and KvGet reach; null for a world of one.
  std::shared_ptr<KeyValueStore> rendezvous;
  // Where the rank's phase times, traffic and device memory go; null = nowhere.
  WorkerMetrics* metrics = nullptr;
  // Once the process is gone: its own end report (`reported`), or one saying how it died.
  std::function<void(v1::ReportAttemptEndRequest end, bool reported)> on_exit;
};

class RankProcess {
 public:
  // Starts the thread that starts `executable` as the rank process and serves it.
  RankProcess(std::string executable, rank::RankStart start, RankProcessHooks hooks);
  ~RankProcess();  // Kill, then Join
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  // Orders the rank to stop at its next step boundary: a stronger order replaces a weaker one
  // (kStop over kCheckpointAndStop), never the reverse; `worker_draining` once set stays set.
  // Before the process has started, the order goes with its start. Whether the order changed.
  bool Stop(StopRequest request, bool worker_draining);
  // The last optimizer step the rank reported done.
  int64_t step() const { return step_.load(); }
  // SIGKILL to the process, if it still runs, or as soon as it starts; on_exit then reports it
  // killed.
  void Kill();
  // Waits for the serving thread (after on_exit). Not from on_exit itself.
  void Join();

 private:
  void Serve();
  // Starts the process; its pid, or why not.
  absl::StatusOr<pid_t> Spawn(int* agent_fd);
  // Acts on one message of the rank; `metrics` null = none.
  void Handle(rank::FromRank& message, MessageChannel* channel, RankMetrics* metrics);
  // Answers the rank's question (it waits for the answer).
  void Answer(const rank::Call& call, MessageChannel* channel);
  // Sends each new stop order (a thread of its own, from the start until the process is gone).
  void WriteStopOrders(MessageChannel* channel);
  // The end report of a process that ended without sending its own.
  v1::ReportAttemptEndRequest DeathReport(int wait_status, const std::string& cause) const;

  const std::string executable_;
  const rank::RankStart start_;
  const RankProcessHooks hooks_;
  std::atomic<int64_t> step_{0};

  mutable std::mutex mu_;
  std::condition_variable stop_changed_;  // stop_ changed, or the process exited
  pid_t pid_ ABSL_GUARDED_BY(mu_) = 0;        // set once started
  bool exited_ ABSL_GUARDED_BY(mu_) = false;  // the pid may be reused: never signal it then
  bool kill_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool killed_ ABSL_GUARDED_BY(mu_) = false;
  rank::StopOrder stop_ ABSL_GUARDED_BY(mu_);  // the order in force
  std::unique_ptr<v1::ReportAttemptEndRequest> end_;  // the rank's own; the serving thread's
  std::thread thread_;
};

// How a rank process that ended by `wait_status` (waitpid's) after `step` ended, for one that did
// not report its end: "was killed by signal 11 (SIGSEGV, Segmentation fault) after step 30", with
// what SIGKILL and SIGBUS usually mean; "exited with status 3 after step 30 without reporting how
// its attempt ended".
std::string DescribeRankExit(int wait_status, int64_t step);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RANK_PROCESS_H_
