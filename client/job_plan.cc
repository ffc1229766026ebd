#include "client/job_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/status.h"
#include "moetrain/v1/job_spec.h"
#include "worker/job_config.h"

namespace moetrain {
namespace {

// What would lower one rank's memory of `config`, as far as the spec allows: a smaller per-rank
// micro-batch (activations), more expert-parallel ranks (fewer experts each), activation
// recompute, a smaller model.
std::string MemoryHint(const TrainerConfig& config) {
  std::vector<std::string> hints;
  const int64_t world = std::max(1, config.parallel.world_size());
  const int64_t micro =
      config.micro_batch_size > 0 ? config.micro_batch_size : config.data.batch_size;
  const int64_t per_rank = micro / world;
  if (per_rank > 1) {
    hints.push_back(absl::StrCat("lower train.micro_batch_size (", per_rank,
                                 " a rank now; activations grow with it)"));
  }
  const int ep = config.parallel.expert_parallel;
  const int64_t experts = config.model.moe.num_experts;
  if (experts > 1 && ep < experts) {
    hints.push_back(absl::StrCat("raise parallel.expert_parallel (", ep,
                                 " now, at most model.moe.num_experts = ", experts,
                                 "; each rank then holds fewer experts)"));
  }
  if (config.recompute == Recompute::kNone) {
    hints.push_back(
        "recompute activations (train.recompute: FULL, for a third more compute; SELECTIVE frees "
        "less for less)");
  } else if (config.recompute == Recompute::kSelective) {
    hints.push_back("recompute whole blocks (train.recompute: FULL; a third more compute)");
  }
  hints.push_back("make the model smaller");
  if (hints.size() == 1) return hints[0];
  return absl::StrCat(absl::StrJoin(hints.begin(), hints.end() - 1, ", "), ", or ", hints.back());
}

}  // namespace

absl::StatusOr<TrainerConfig> PlanTrainerConfig(const v1::JobSpec& spec) {
  // Not by rewriting the spec into one-rank CPU workers: its checks would then name
  // resources.workers with the rank count.
  return TrainerConfigFromSpecOnCpu(spec);
}

int64_t JobMemoryPlan::DeviceBytesNeeded() const {
  const double bytes = std::ceil(device_bytes);
  // 2^63 is the first double past INT64_MAX.
  if (!(bytes < 9223372036854775808.0)) return std::numeric_limits<int64_t>::max();
  return bytes > 0 ? static_cast<int64_t>(bytes) : 0;
}

absl::StatusOr<JobMemoryPlan> PlanJobMemory(const v1::JobSpec& spec) {
  MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec resolved, ResolveJobSpec(spec));
  JobMemoryPlan plan;
  plan.device = resolved.resources().device();
  plan.workers = resolved.resources().workers();
  plan.devices_per_worker = resolved.resources().devices_per_worker();
  MOETRAIN_ASSIGN_OR_RETURN(plan.config, PlanTrainerConfig(resolved));
  // Estimated and placed for the job's own device (a CUDA config is only read here, the device
  // never opened): a device keeps memory the CPU gives back (sharded gradients).
  TrainerConfig placed = plan.config;
  if (plan.device == v1::ResourceConfig::CUDA) placed.device = Device::Cuda(0);
  plan.estimate = EstimateTrainingMemory(placed);
  plan.device_bytes = PlaceTrainingMemory(placed, plan.estimate).device;
  plan.hint = MemoryHint(plan.config);
  return plan;
}

std::string CompleteDeviceMemory(v1::JobSpec* spec) {
  if (spec->resources().device() != v1::ResourceConfig::CUDA ||
      spec->resources().device_memory_bytes() != 0) {
    return "";
  }
  absl::StatusOr<JobMemoryPlan> plan = PlanJobMemory(*spec);
  if (!plan.ok()) {
    return absl::StrCat("cannot plan the device memory per rank (", plan.status().message(),
                        "): submitting without resources.device_memory_bytes");
  }
  spec->mutable_resources()->set_device_memory_bytes(plan->DeviceBytesNeeded());
  return absl::StrCat("planned device memory per rank: ", plan->estimate.DebugString());
}

}  // namespace moetrain
