// One rank of one attempt, from assignment to end report, inside the rank process
// (worker/rank_main.h): builds the trainer from the job's spec, resumes from the newest good
// checkpoint in the job's directory, trains, and turns what the trainer reports into reports to
// the coordinator. Everything it needs from the worker that started it (the agent: reports, the
// checkpoint lease, the rendezvous, metrics) goes through RankAgent, over the process's channel.
#ifndef MOETRAIN_WORKER_RANK_RUNNER_H_
#define MOETRAIN_WORKER_RANK_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend/device_runtime.h"
#include "engine/comm/metered_communicator.h"
#include "engine/core/device.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/worker.pb.h"
#include "worker/reporter.h"

namespace moetrain {

// Shared between the rank's training and the thread that reads the agent's orders.
struct RankControl {
  // The agent's order: a cancel (kStop) or its own shutdown (kCheckpointAndStop).
  std::atomic<StopRequest> stop{StopRequest::kNone};
  // The last optimizer step done.
  std::atomic<int64_t> step{0};
  // Set before `stop` by the worker's shutdown, or by the rank at stop_after_step: the end
  // report says the worker drains.
  std::atomic<bool> worker_draining{false};
};

// What a rank asks of the worker that started it. Thread-safe. The metering part (CommMeter::Add,
// ObservePhases) is used only when RankEnvironment::metrics is set.
class RankAgent : public CommMeter {
 public:
  // Queued for the coordinator, in the order made (step, log and checkpoint reports).
  virtual void Report(Reporter::Report report) = 0;
  // The last optimizer step done, for the worker's heartbeats.
  virtual void Progress(int64_t step) = 0;
  // OK while the worker may write into the job's directory; asked before every checkpoint.
  virtual absl::Status MayWriteCheckpoints() = 0;
  // The attempt's rendezvous at the coordinator (KeyValueStore's contract).
  virtual absl::Status KvSet(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> KvGet(const std::string& key, absl::Duration timeout) = 0;
  // After every step: its phase times, and the memory of the rank's GPU (null on the CPU).
  virtual void ObservePhases(const StepPhaseSeconds& phases, const DeviceRuntime* device) = 0;
};

struct RankEnvironment {
  std::string worker_id;  // the id the reports carry
  int threads = 1;        // the rank's OpenMP team
  // A gang of several ranks meets through the coordinator's rendezvous and talks over TCP.
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
  // checkpoint is committed collectively, so the first's report covers every rank's part).
  bool reports_checkpoints = true;
  // The worker keeps metrics (--metrics-listen): the rank meters its collectives and phases into
  // the agent.
  bool metrics = false;
};

// Whether another attempt could succeed where one failed with `status`: PERMANENT for the codes
// that say the job's spec, data or checkpoint is wrong (InvalidArgument, FailedPrecondition,
// OutOfRange, Unimplemented), TRANSIENT for every other (a lost peer, a timeout, too little
// memory on this worker, I/O). A failure to meet the gang is TRANSIENT whatever its code.
v1::FailureKind FailureKindOf(const absl::Status& status);

// Runs the rank to its end, its reports going to `agent`; returns the end report. Never throws;
// every failure becomes an ATTEMPT_OUTCOME_FAILED end report whose message names the cause and
// whose failure_kind is FailureKindOf the rank's error.
v1::ReportAttemptEndRequest RunRank(const v1::Assignment& assignment,
                                    const RankEnvironment& environment, RankAgent* agent,
                                    RankControl* control);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RANK_RUNNER_H_
