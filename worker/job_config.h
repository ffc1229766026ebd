// JobSpec (the wire schema) → the engine's TrainerConfig. The engine never sees proto types:
// this is the one place that maps one onto the other.
#ifndef MOETRAIN_WORKER_JOB_CONFIG_H_
#define MOETRAIN_WORKER_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/device_query.h"
#include "engine/train/trainer.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

// OK when `report` (QueryDevices) lists a GPU; else UNAVAILABLE, "resources.device = CUDA: no
// usable GPU on this machine (<why: the CUDA error, or a build without CUDA>)".
absl::Status CheckUsableGpu(const DeviceReport& report);

// Resolves the spec's defaults (ResolveJobSpec), checks what this engine cannot do
// (v1::CheckTrainerSupports), and fills a TrainerConfig (its micro-batch counted over all ranks;
// train.precision = FP8 gives compute dtype bf16 and `fp8` from train.fp8, validated by
// TrainerConfig::Validate). A CUDA spec needs a usable
// GPU here (without one it fails at once with CheckUsableGpu's error) and gets device
// cuda:<cuda_device>, this process's index of the rank's GPU (0 for `moetrain run`; a worker
// passes each rank's own, so that TrainerConfig::Validate opens that GPU and no other); a CPU spec
// ignores it. `checkpoint_dir` replaces spec.checkpoint.dir when not empty. Errors name the spec
// field.
absl::StatusOr<TrainerConfig> TrainerConfigFromSpec(const v1::JobSpec& spec,
                                                    const std::string& checkpoint_dir = "",
                                                    int cuda_device = 0);

// The same conversion with the config's device the CPU whatever resources.device says, and no GPU
// looked for or opened: what a plan of the job models (client/job_plan.h). The ranks, layout and
// batches stay the spec's, and errors name the spec's own fields and values.
absl::StatusOr<TrainerConfig> TrainerConfigFromSpecOnCpu(const v1::JobSpec& spec);

// `moetrain-worker --devices`: "cpu", "cuda" (every GPU this process sees) or "cuda:I,J,..." (those
// GPUs, by the driver's index).
struct DeviceFlag {
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  std::vector<int> indexes;  // "cuda:I,J": I, J, ... (distinct); empty for "cpu" and "cuda"
};

// InvalidArgument naming the flag for anything else: an empty, negative or repeated index.
absl::StatusOr<DeviceFlag> ParseDeviceFlag(const std::string& text);

// What a worker offers, from its flag and the GPUs it found.
struct OfferedDevices {
  v1::ResourceConfig::Device device = v1::ResourceConfig::CPU;
  int count = 1;
  // The smallest of its devices' memory; 0 on the CPU (unknown).
  int64_t memory_bytes = 0;
};

// `report` is QueryDevices() taken after CUDA_VISIBLE_DEVICES was set to a "cuda:I,J" list, so its
// GPUs are the listed ones, in order, as far as the first that does not exist (CUDA hides the
// rest). FailedPrecondition, naming the flag and the CUDA error, when a CUDA flag finds no GPU or
// fewer than it lists; "cpu" never looks at the report.
absl::StatusOr<OfferedDevices> DevicesOffered(const std::string& text, const DeviceFlag& flag,
                                              const DeviceReport& report);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_JOB_CONFIG_H_
