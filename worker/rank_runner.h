// One rank of one attempt, from assignment to end report: builds the trainer from the job's spec,
// resumes from the newest good checkpoint in the job's directory, trains, and turns what the
// trainer reports into reports to the coordinator (through the Reporter, in order). Runs on a
// thread of the worker's; the worker steers it through RankControl.
#ifndef MOETRAIN_WORKER_RANK_RUNNER_H_
#define MOETRAIN_WORKER_RANK_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/core/device.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.pb.h"
#include "worker/reporter.h"
#include "worker/worker_metrics.h"

namespace moetrain {

// Shared between the rank's thread and the worker.
struct RankControl {
  // Set by the worker: a cancel (kStop) or its own shutdown (kCheckpointAndStop).
  std::atomic<StopRequest> stop{StopRequest::kNone};
  // Set by the rank: the last optimizer step done, for heartbeats.
  std::atomic<int64_t> step{0};
  // Set by the worker's shutdown, before `stop`: the end report says the worker drains.
  std::atomic<bool> worker_draining{false};
};

struct RankEnvironment {
  std::string worker_id;  // the id the reports carry
  int threads = 1;        // the rank's OpenMP team
  Reporter* reporter = nullptr;
  // OK while the worker may write into the job's directory; asked before every checkpoint.
  std::function<absl::Status()> may_write_checkpoints;
  // A gang of several ranks meets through the coordinator's rendezvous and talks over TCP.
  Connection connection;
  std::string comm_host;  // see WorkerOptions::comm_host
  absl::Duration comm_timeout = absl::Seconds(60);
  std::vector<std::string> data_roots;  // see WorkerOptions::data_roots
  int64_t memory_limit_bytes = 0;       // see WorkerOptions::memory_limit_bytes
  int64_t stop_after_step = 0;          // see WorkerOptions::stop_after_step
  // The device this rank computes on, for a job whose spec asks for CUDA (a CPU job stays on the
  // CPU): on a GPU worker, the rank's GPU; its world communicator is then NCCL.
  Device device = Device::Cpu();
  // A worker running several ranks of one assignment speaks for them as its first rank, which is
  // all the coordinator takes from it: the other ranks leave checkpoint reports to the first (the
  // checkpoint is committed collectively, so the first's report covers every rank's part), and
  // every rank hands its end report to on_end, which the worker combines into one. Unset: the
  // rank enqueues its own end report.
  bool reports_checkpoints = true;
  std::function<void(v1::ReportAttemptEndRequest)> on_end;
  // Where the rank's phase times, communication and device go (WorkerOptions::metrics); null =
  // nowhere.
  WorkerMetrics* metrics = nullptr;
};

// Whether another attempt could succeed where one failed with `status`: PERMANENT for the codes
// that say the job's spec, data or checkpoint is wrong (InvalidArgument, FailedPrecondition,
// OutOfRange, Unimplemented), TRANSIENT for every other (a lost peer, a timeout, too little
// memory on this worker, I/O). A failure to meet the gang is TRANSIENT whatever its code.
v1::FailureKind FailureKindOf(const absl::Status& status);

// Runs the rank to its end and enqueues its reports, the end report last. Never throws; every
// failure becomes an ATTEMPT_OUTCOME_FAILED end report whose message names the cause and whose
// failure_kind is FailureKindOf the rank's error.
void RunRank(const v1::Assignment& assignment, const RankEnvironment& environment,
             RankControl* control);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RANK_RUNNER_H_
