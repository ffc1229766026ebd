// The rule by which the coordinator refuses at submit a job that no registered worker can hold
// (server/grpc/job_service.cc, through Fleet::CheckDeviceMemory), and by which
// `moetrain submit --dry-run` predicts it (client/dry_run_command.h): one implementation, so that
// the prediction and the decision cannot drift apart.
//
// Arithmetic on numbers only: the need is what the spec states (resources.device_memory_bytes,
// which `moetrain submit` fills from the plan, client/job_plan.h), the offers are what the workers
// advertise. Nothing here plans a job or reaches into the engine, so the coordinator links none.
//
//   DeviceMemoryVerdict verdict = JudgeDeviceMemory(DeviceMemoryNeedOf(spec), offered);
//   if (verdict.refused()) return verdict.status;  // FailedPrecondition, with the numbers
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_MEMORY_ADMISSION_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_MEMORY_ADMISSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

// What one rank of a job needs.
struct DeviceMemoryNeed {
  std::string job_name;  // for the message
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  int64_t devices_per_worker = 1;  // the least device count a matching worker has
  int64_t bytes_per_rank = 0;      // <= 0 = not stated: never refused
};

// The need `spec` states: its name, resources.device, resources.devices_per_worker (1 when unset,
// its default) and resources.device_memory_bytes.
DeviceMemoryNeed DeviceMemoryNeedOf(const v1::JobSpec& spec);

// A worker as the rule sees it: from the fleet's registry, or from ListWorkers.
struct OfferedWorker {
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  int64_t device_count = 0;
  int64_t device_memory_bytes = 0;  // of its smallest device; 0 = unknown (always on the CPU)
};

struct DeviceMemoryVerdict {
  // Workers that match the job: registered (LOST ones too: they may come back, and the
  // coordinator forgets them only later), of its device kind, with at least its
  // devices_per_worker devices.
  int matching_workers = 0;
  // Those of them that advertise their device memory (> 0), and its least and greatest among them
  // (0 when none does).
  int known_memory_workers = 0;
  int64_t smallest_known_bytes = 0;
  int64_t largest_known_bytes = 0;
  // Those that advertise at least the need (all that advertise any, for a need not stated).
  int enough_memory_workers = 0;
  // OK, or FailedPrecondition when the job is refused (the rule below), with the message.
  absl::Status status;

  bool refused() const { return !status.ok(); }
};

// The admission rule. A job is refused only when it states its need (bytes_per_rank > 0), at
// least one worker matches it, every matching worker advertises its memory, and the largest of
// them is below the need: then no worker that exists can hold one of its ranks. A worker of
// unknown memory may hold it, and a job with no matching worker waits for one (the scheduler
// says so), so neither is refused; CPU workers advertise no device memory, so a CPU job never is.
// FailedPrecondition rather than ResourceExhausted: retrying the same submission cannot succeed
// until the spec or the fleet changes, and gRPC clients commonly retry RESOURCE_EXHAUSTED as a
// transient quota. The message names the need, the largest offer and the worker count:
//   "job big needs 17.55 GiB of device memory per rank (resources.device_memory_bytes =
//   18846562304); the largest of the 2 registered CUDA workers offers 2.00 GiB a device; lower
//   train.micro_batch_size or raise parallel.expert_parallel, or make the model smaller;
//   `moetrain plan SPEC` shows where the memory goes"
DeviceMemoryVerdict JudgeDeviceMemory(const DeviceMemoryNeed& need,
                                      const std::vector<OfferedWorker>& workers);

// `bytes` in GiB with two decimals, as the message writes them: "17.55 GiB".
std::string FormatGiB(int64_t bytes);

}  // namespace moetrain

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_MEMORY_ADMISSION_H_
