// A job spec's plan where the CLI acts on it: the TrainerConfig that `moetrain plan` models
// (client/plan_command.h), the device memory one rank of the job needs by that plan, and the
// completion `moetrain submit` applies before it sends a spec: a CUDA job's
// resources.device_memory_bytes, filled from the plan when the user left it 0. The coordinator
// judges a job by that field (moetrain/v1/memory_admission.h) and plans nothing itself, so that
// it never links the engine; `moetrain submit --dry-run` (client/dry_run_command.h) completes the
// spec the same way and applies the same rule.
//
// The spec is converted by TrainerConfigFromSpec (worker/job_config.h), the conversion the
// workers run, and sized by EstimateTrainingMemory (engine/train/memory_estimate.h), the estimate
// the workers check before they allocate. Both are arithmetic on the config: nothing is
// allocated and no device is opened. Part of the `moetrain` executable, never of the
// moetrain_client library, which does not link the engine.
#ifndef MOETRAIN_CLIENT_JOB_PLAN_H_
#define MOETRAIN_CLIENT_JOB_PLAN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/train/memory_estimate.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

// `spec` resolved (ResolveJobSpec) and converted with the CPU as its device
// (TrainerConfigFromSpecOnCpu), so that a CUDA spec converts without a GPU here (PlanJobMemory
// estimates with the spec's device); the ranks (resources.workers × devices_per_worker), the layout
// (dp × ep), the batch and the per-rank micro-batch stay the spec's. Errors name the spec's field
// and its value.
absl::StatusOr<TrainerConfig> PlanTrainerConfig(const v1::JobSpec& spec);

// The memory one rank of a job needs, by the plan.
struct JobMemoryPlan {
  // The spec's resolved resources.
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  int64_t workers = 1;
  int64_t devices_per_worker = 1;
  TrainerConfig config;     // PlanTrainerConfig's
  MemoryEstimate estimate;  // one rank at the spec's layout
  // PlaceTrainingMemory's device part: all of the estimate for a CUDA job, 0 for a CPU job.
  double device_bytes = 0;
  // What would lower the need, with the spec's figures: "lower train.micro_batch_size (16 a rank
  // now; activations grow with it), raise parallel.expert_parallel (1 now, ...), or make the
  // model smaller".
  std::string hint;

  // device_bytes rounded up, capped at INT64_MAX (a hostile spec's sizes overflow int64): the
  // value of resources.device_memory_bytes.
  int64_t DeviceBytesNeeded() const;
};

absl::StatusOr<JobMemoryPlan> PlanJobMemory(const v1::JobSpec& spec);

// What `moetrain submit` does to a checked spec before sending it: for a CUDA job whose
// resources.device_memory_bytes is 0, sets it to DeviceBytesNeeded() of its plan. Returns the
// line to print on stderr: "planned device memory per rank: 17.55 GiB (params 2.05, grads ...,
// activations ... GiB)", or, when the spec cannot be planned, that it goes without the field and
// why. Empty when the spec is left as it is: a CPU job, or a need the user stated.
std::string CompleteDeviceMemory(v1::JobSpec* spec);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_JOB_PLAN_H_
