#include "client/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/job_plan.h"
#include "engine/plan/cluster.h"
#include "engine/plan/plan.h"
#include "engine/train/memory_estimate.h"
#include "moetrain/v1/job_spec.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

using nlohmann::json;

int Usage(const absl::Status& status) {
  std::fprintf(stderr, "moetrain plan: %s\n", std::string(status.message()).c_str());
  return 2;
}

// A GPU count given by `flag`: InvalidArgument naming it and what is allowed, else OK.
absl::Status CheckGpuCount(const char* flag, int64_t gpus) {
  if (gpus >= 1 && gpus <= kMaxPlanGpus) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " = ", gpus, " is not a GPU count: it must be in [1, ", kMaxPlanGpus,
                   "] (without --gpus the plan is for the spec's own ranks)"));
}

}  // namespace

json LayoutPlanJson(const LayoutPlan& plan) {
  return {{"data_parallel", plan.layout.data_parallel},
          {"expert_parallel", plan.layout.expert_parallel},
          {"sharding", ShardingName(plan.layout.sharding)},
          {"recompute", RecomputeName(plan.layout.recompute)},
          {"memory_bytes",
           {{"parameters", plan.memory.parameters},
            {"gradients", plan.memory.gradients},
            {"optimizer", plan.memory.optimizer},
            {"activations", plan.memory.activations},
            {"fp8_state", plan.memory.fp8_state},
            {"checkpoint_gather", plan.memory.checkpoint_gather},
            {"total", plan.memory.total()},
            {"on_device", plan.memory.on_device()}}},
          {"fits", plan.fits},
          {"step_seconds", plan.step_s},
          {"compute_seconds", plan.compute_s},
          {"compute_parts_seconds",
           {{"dense_gemm", plan.dense_gemm_s},
            {"grouped_gemm", plan.grouped_gemm_s},
            {"attention", plan.attention_s},
            {"elementwise", plan.elementwise_s},
            {"optimizer", plan.optimizer_s},
            {"recompute", plan.recompute_s}}},
          {"all_to_all_seconds", plan.all_to_all_s},
          {"all_to_all_exposed_seconds", plan.all_to_all_exposed_s},
          {"all_to_all_bytes", plan.all_to_all_bytes},
          {"all_reduce_seconds", plan.all_reduce_s},
          {"all_reduce_exposed_seconds", plan.all_reduce_exposed_s},
          {"all_gather_seconds", plan.all_gather_s},
          {"all_to_all_share", plan.all_to_all_share()},
          {"all_reduce_share", plan.all_reduce_share()},
          {"tokens_per_s", plan.tokens_per_s},
          {"mfu", plan.mfu}};
}

void PrintLayoutTable(const std::vector<LayoutPlan>& plans) {
  std::printf("%5s %5s %9s %9s %12s %5s %12s %14s %6s %6s %6s\n", "dp", "ep", "sharding",
              "recompute", "memory/rank", "fits", "step", "tokens/s", "MFU", "a2a", "allred");
  for (const LayoutPlan& plan : plans) {
    std::printf("%5d %5d %9s %9s %12s %5s %11.4gs %14.4g %5.1f%% %5.1f%% %5.1f%%\n",
                plan.layout.data_parallel, plan.layout.expert_parallel,
                ShardingName(plan.layout.sharding), RecomputeName(plan.layout.recompute),
                FormatBytes(plan.memory.on_device()).c_str(), plan.fits ? "yes" : "no", plan.step_s,
                plan.tokens_per_s, 100 * plan.mfu, 100 * plan.all_to_all_share(),
                100 * plan.all_reduce_share());
  }
}

namespace {

// "4x2", with " OPTIM" for a sharded optimizer, " GRADS" for sharded gradients, " RC" for full
// and " SRC" for selective recompute.
std::string LayoutName(const Layout& layout) {
  return absl::StrCat(layout.data_parallel, "x", layout.expert_parallel,
                      layout.sharding == Sharding::kOptimizer   ? " OPTIM"
                      : layout.sharding == Sharding::kGradients ? " GRADS"
                                                                : "",
                      layout.recompute == Recompute::kFull        ? " RC"
                      : layout.recompute == Recompute::kSelective ? " SRC"
                                                                  : "");
}

json SweepJson(const std::vector<SweepPoint>& points) {
  json out = json::array();
  for (const SweepPoint& point : points) {
    out.push_back({{"gpus", point.gpus},
                   {"best", point.best.has_value() ? LayoutPlanJson(*point.best) : json(nullptr)},
                   {"efficiency", point.efficiency}});
  }
  return out;
}

void PrintSweep(const char* title, const std::vector<SweepPoint>& points) {
  std::printf("\n%s scaling:\n%6s %16s %12s %5s %12s %14s %7s %6s %6s %10s\n", title, "gpus",
              "dp x ep", "memory/rank", "fits", "step", "tokens/s", "MFU", "a2a", "allred",
              "efficiency");
  bool any_unfit = false;
  for (const SweepPoint& point : points) {
    if (!point.best.has_value()) {
      std::printf("%6d  no valid layout\n", point.gpus);
      continue;
    }
    const LayoutPlan& best = *point.best;
    any_unfit = any_unfit || !best.fits;
    std::printf("%6d %16s %12s %5s %11.4gs %14.4g %6.1f%% %5.1f%% %5.1f%% %9.1f%%\n", point.gpus,
                LayoutName(best.layout).c_str(), FormatBytes(best.memory.on_device()).c_str(),
                best.fits ? "yes" : "no", best.step_s, best.tokens_per_s, 100 * best.mfu,
                100 * best.all_to_all_share(), 100 * best.all_reduce_share(),
                100 * point.efficiency);
  }
  if (any_unfit) {
    std::printf(
        "(fits = no: no layout fits at that count; the row is the fastest layout, the time "
        "its step would take with the memory to hold it)\n");
  }
}

}  // namespace

int PlanCommand(const PlanOptions& options) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(options.spec_path);
  if (!spec.ok()) return Usage(spec.status());
  absl::StatusOr<ClusterSpec> cluster = LoadCluster(options.cluster);
  if (!cluster.ok()) return Usage(cluster.status());
  // The plan is for the cluster, not this machine: converted with the CPU as the device, as
  // `moetrain submit` plans a CUDA job's device memory (client/job_plan.h).
  absl::StatusOr<TrainerConfig> spec_config = PlanTrainerConfig(*spec);
  if (!spec_config.ok()) return Usage(spec_config.status());
  if (options.recompute) spec_config->recompute = Recompute::kFull;
  if (options.gpus.has_value()) {
    if (absl::Status count = CheckGpuCount("--gpus", *options.gpus); !count.ok()) {
      return Usage(count);
    }
  }
  for (int64_t count : options.sweep) {
    if (absl::Status checked = CheckGpuCount("--sweep", count); !checked.ok()) {
      return Usage(checked);
    }
  }
  const int gpus = static_cast<int>(options.gpus.value_or(spec_config->parallel.world_size()));
  // The spec's global batch and per-GPU micro-batch, at `gpus`.
  absl::StatusOr<TrainerConfig> config = AtGpuCount(*spec_config, gpus, Scaling::kStrong);
  if (!config.ok()) return Usage(config.status());
  const std::vector<LayoutPlan> plans = PlanLayouts(*config, gpus, *cluster);
  if (plans.empty()) {
    return Usage(absl::InvalidArgumentError(absl::StrCat(
        "--gpus = ", gpus, ": no dp x ep layout of ", gpus,
        " GPUs divides model.moe.num_experts = ", config->model.moe.num_experts,
        " and train.batch_size = ", config->data.batch_size, " (and its micro-batch)")));
  }
  const std::optional<LayoutPlan> best = Fastest(plans);
  std::vector<int> sweep(options.sweep.begin(), options.sweep.end());  // each checked above
  std::sort(sweep.begin(), sweep.end());
  std::vector<SweepPoint> weak, strong;
  if (!sweep.empty()) {
    // From the spec's own world: weak scaling keeps the spec's per-GPU batch.
    weak = Sweep(*spec_config, sweep, Scaling::kWeak, *cluster);
    strong = Sweep(*spec_config, sweep, Scaling::kStrong, *cluster);
  }
  const double checkpoint_bytes = EstimateCheckpointBytes(*config);
  if (options.json) {
    json out = {{"spec", options.spec_path},
                {"cluster", cluster->name},
                {"device_memory_bytes", cluster->device.memory_bytes},
                {"gpus", gpus},
                {"checkpoint_bytes", checkpoint_bytes},
                {"layouts", json::array()},
                {"best", best.has_value() ? LayoutPlanJson(*best) : json(nullptr)}};
    for (const LayoutPlan& plan : plans) out["layouts"].push_back(LayoutPlanJson(plan));
    if (!sweep.empty()) out["sweep"] = {{"weak", SweepJson(weak)}, {"strong", SweepJson(strong)}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s on %s: %d x %s (%s each), %d per node\n", options.spec_path.c_str(),
              cluster->name.c_str(), gpus, cluster->device.model.c_str(),
              FormatBytes(cluster->device.memory_bytes).c_str(), cluster->gpus_per_node);
  PrintLayoutTable(plans);
  if (best.has_value()) {
    std::printf("fastest that fits: dp=%d x ep=%d, sharding %s, recompute %s, memory/rank %s\n",
                best->layout.data_parallel, best->layout.expert_parallel,
                ShardingName(best->layout.sharding), RecomputeName(best->layout.recompute),
                best->memory.DebugString().c_str());
  } else {
    std::printf("no layout fits in %s per GPU\n",
                FormatBytes(cluster->device.memory_bytes).c_str());
  }
  std::printf("a checkpoint step: %s (f32 weights, AdamW moments%s)\n",
              FormatBytes(checkpoint_bytes).c_str(),
              config->fp8.has_value() && config->fp8->has_state() ? ", FP8 amax histories" : "");
  if (!sweep.empty()) {
    PrintSweep("weak (per-GPU batch fixed)", weak);
    PrintSweep("strong (global batch fixed)", strong);
  }
  return 0;
}

}  // namespace moetrain
