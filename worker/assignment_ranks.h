// An assignment as one worker runs it: the ranks [rank, rank + devices_per_worker) of one attempt,
// one per device of the worker, started, stopped and ended together. Pure functions, so that the
// mapping of ranks onto devices and the one outcome of several ranks are tested without a GPU or
// a coordinator.
#ifndef MOETRAIN_WORKER_ASSIGNMENT_RANKS_H_
#define MOETRAIN_WORKER_ASSIGNMENT_RANKS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/device.h"
#include "moetrain/v1/job.pb.h"
#include "moetrain/v1/worker.pb.h"

namespace moetrain {

// One rank of an assignment, as RunRank takes it.
struct LocalRank {
  v1::Assignment assignment;  // the delivered one with rank() = this rank
  Device device;              // CPU on a CPU worker; on a GPU worker, the rank's GPU
};

// What a worker runs for `assignment`: rank first + i on the worker's i-th device (Cuda(i): the
// worker's --devices list is CUDA_VISIBLE_DEVICES, so its GPUs are 0 .. device_count - 1), first =
// assignment.rank(), i < spec.resources.devices_per_worker (1 where unset). On a CPU worker every
// rank stays on the CPU (spec validation allows one rank per CPU worker).
// Errors, for an assignment the scheduler should never have sent to this worker:
//   ResourceExhausted  devices_per_worker exceeds the worker's device_count (another worker may
//                      have the devices: FailureKindOf makes it TRANSIENT);
//   InvalidArgument    devices_per_worker < 1, or ranks outside [0, world_size).
absl::StatusOr<std::vector<LocalRank>> ExpandAssignment(const v1::Assignment& assignment,
                                                        v1::ResourceConfig::Device worker_device,
                                                        int worker_device_count);

// The one end report of an assignment from the end reports of its ranks (non-empty, in the order
// the ranks ended), for a coordinator that takes one end per worker and attempt: addressed as the
// assignment's first rank (`first_rank`). The worst outcome wins: FAILED over CANCELLED over
// STOPPED over SUCCEEDED (SUCCEEDED only when every rank succeeded). A failure brings its message
// and failure_kind: the first PERMANENT one (restarting cannot help whichever rank saw it), else
// the first to end (the others usually failed because of it). With several ranks the message
// names the rank ("rank 3: ..."). step is the least of the ranks' (what all of them completed);
// worker_draining is set when any rank's is.
v1::ReportAttemptEndRequest CombineRankEnds(int32_t first_rank,
                                            const std::vector<v1::ReportAttemptEndRequest>& ends);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_ASSIGNMENT_RANKS_H_
