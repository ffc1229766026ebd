// The coordinator's scheduling decision: which pending jobs start now, and on which workers.
// A pure function of its inputs (no I/O, no threads, no clock), so the coordinator can call it on
// every change and a restart that reloads the same store makes the same decision.
//
// Rules, applied in this order:
//  1. Order. Jobs are considered by (priority descending, submit_sequence ascending).
//  2. Matching. A worker matches a job when its device kind equals the job's, its device count
//     is at least devices_per_worker, and, when both are known (> 0), its device memory is at
//     least the job's device_memory_bytes (unknown memory never excludes a worker). A worker is
//     usable only when IDLE; BUSY, DRAINING and LOST workers are never assigned.
//  3. Gang scheduling. A job starts only when workers_needed usable matching workers are free at
//     once; there are no partial allocations.
//  4. Unschedulable. A job that needs more matching workers than are registered and not LOST
//     (IDLE, BUSY or DRAINING all count) can never start as the fleet stands. It is reported in
//     ScheduleDecision::unschedulable with a reason ("needs 4 CPU workers, 2 registered"), takes
//     no workers and reserves none, so it cannot block the queue behind it.
//  4b. Waiting. A job that could start on the fleet but not now (too few of its workers are free,
//     or they are held for the head) is reported in ScheduleDecision::waiting with a reason
//     ("waiting for 2 CPU workers to be free at once, 3 registered").
//  5. No starvation (backfill). The first job in order that could fit the fleet but cannot start
//     now is the head: it reserves the free matching workers it would use. Every later job may
//     start only on free workers that are not reserved. Since the head reserves every free
//     worker that matches it, a backfilled job never takes a worker the head could use, so
//     backfill never delays the head. Only the head reserves: blocked jobs behind it wait without
//     holding anything, and each becomes the head in turn as the jobs ahead of it start.
//  6. Determinism. Among the free matching workers a job takes those with the fewest devices first
//     (best fit: large workers stay free for jobs that need them), ties broken by worker id
//     (byte-wise ascending). An assignment lists its workers by worker id ascending, which is the
//     rank order. The same inputs, in any order, give the same decision.
#ifndef MOETRAIN_SERVER_CORE_SCHEDULER_H_
#define MOETRAIN_SERVER_CORE_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/job_state.h"

namespace moetrain::server {

enum class DeviceKind { kCpu, kCuda };

// "CPU", "CUDA": as they appear in unschedulable reasons.
absl::string_view DeviceKindName(DeviceKind kind);

struct PendingJob {
  std::string job_id;
  int32_t priority = 0;         // higher is scheduled first
  int64_t submit_sequence = 0;  // monotonically increasing; earlier first among equal priorities
  int32_t workers_needed = 1;   // >= 1: the gang size, one rank per worker
  DeviceKind device_kind = DeviceKind::kCpu;
  int32_t devices_per_worker = 1;  // >= 0: the least device count a worker must have
  // >= 0: the device memory one rank needs (the spec's resources.device_memory_bytes, which
  // `moetrain submit` fills from the plan); 0 = unknown: any worker's will do.
  int64_t device_memory_bytes = 0;
};

struct SchedulerWorker {
  std::string worker_id;
  DeviceKind device_kind = DeviceKind::kCpu;
  int32_t device_count = 0;  // >= 0
  WorkerState state = WorkerState::kIdle;
  // >= 0: memory of one of its devices (the smallest); 0 = unknown, matches any need.
  int64_t device_memory_bytes = 0;
};

struct Assignment {
  std::string job_id;
  std::vector<std::string> worker_ids;  // by rank: rank i runs on worker_ids[i]
};

struct UnschedulableJob {
  std::string job_id;
  std::string reason;  // e.g. "needs 4 CPU workers, 2 registered"
};

struct ScheduleDecision {
  std::vector<Assignment> assignments;          // in scheduling order (rule 1)
  std::vector<UnschedulableJob> unschedulable;  // in scheduling order (rule 1)
  std::vector<UnschedulableJob> waiting;        // rule 4b, in scheduling order (rule 1)
};

// Decides which of `jobs` start now on `workers` (rules above). Every job is in exactly one of
// assignments, unschedulable and waiting. InvalidArgument, naming the job or worker and the value,
// for an empty or repeated job or worker id, a repeated submit_sequence, workers_needed < 1,
// devices_per_worker < 0, device_count < 0 or a negative device memory.
absl::StatusOr<ScheduleDecision> Schedule(const std::vector<PendingJob>& jobs,
                                          const std::vector<SchedulerWorker>& workers);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_SCHEDULER_H_
