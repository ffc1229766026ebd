#include "client/dry_run_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/job_plan.h"
#include "client/plan_command.h"
#include "client/terminal_text.h"
#include "engine/plan/cluster.h"
#include "engine/plan/plan.h"
#include "engine/train/memory_estimate.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/memory_admission.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

using nlohmann::json;

constexpr absl::string_view kCommand = "submit --dry-run";

std::string DeviceName(v1::ResourceConfig::Device device) {
  return v1::ResourceConfig::Device_Name(device);
}

// "4 CUDA workers with at least 8 devices registered, 139.80 GiB each; the job needs 2".
std::string WorkersLine(const JobMemoryPlan& plan, const DeviceMemoryVerdict& verdict) {
  const std::string kind =
      absl::StrCat(DeviceName(plan.device), verdict.matching_workers == 1 ? " worker" : " workers",
                   plan.devices_per_worker > 1
                       ? absl::StrCat(" with at least ", plan.devices_per_worker, " devices")
                       : std::string());
  const std::string needs = absl::StrCat("; the job needs ", plan.workers);
  if (verdict.matching_workers == 0) {
    return absl::StrCat("no ", kind, " registered", needs, ", and would wait for them");
  }
  const std::string range =
      verdict.smallest_known_bytes == verdict.largest_known_bytes
          ? FormatBytes(static_cast<double>(verdict.largest_known_bytes))
          : absl::StrCat(FormatBytes(static_cast<double>(verdict.smallest_known_bytes)), " to ",
                         FormatBytes(static_cast<double>(verdict.largest_known_bytes)));
  std::string memory;
  if (verdict.known_memory_workers == 0) {
    memory = ", device memory not advertised";
  } else if (verdict.known_memory_workers == verdict.matching_workers) {
    memory = absl::StrCat(", ", range, " each");
  } else {
    memory = absl::StrCat(" (", verdict.known_memory_workers, " advertise ", range, " a device, ",
                          verdict.matching_workers - verdict.known_memory_workers, " do not say)");
  }
  return absl::StrCat(verdict.matching_workers, " ", kind, " registered", memory, needs);
}

}  // namespace

int SubmitDryRunCommand(const ClientOptions& options, const std::string& spec_path) {
  // The spec first, as submit checks it: a bad one never reaches the coordinator.
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(spec_path);
  if (!spec.ok()) return FailCommand(kCommand, spec.status());
  if (absl::Status valid = ValidateJobSpec(*spec); !valid.ok()) {
    return FailCommand(kCommand,
                       absl::Status(valid.code(), absl::StrCat(spec_path, ": ", valid.message())));
  }
  absl::StatusOr<JobMemoryPlan> plan = PlanJobMemory(*spec);
  if (!plan.ok()) {
    return FailCommand(
        kCommand,
        absl::Status(plan.status().code(), absl::StrCat(spec_path, ": ", plan.status().message())));
  }
  // The spec as `moetrain submit` would send it: a CUDA job's device memory filled from the plan
  // unless the spec states it. The coordinator judges that figure.
  v1::JobSpec completed = *spec;
  CompleteDeviceMemory(&completed);
  const DeviceMemoryNeed need = DeviceMemoryNeedOf(completed);
  const bool need_stated = spec->resources().device_memory_bytes() > 0;
  absl::StatusOr<v1::ListWorkersResponse> listed = ListCoordinatorWorkers(options);
  if (!listed.ok()) return FailCommand(kCommand, listed.status());

  std::vector<OfferedWorker> offered;
  for (const v1::WorkerInfo& worker : listed->workers()) {
    offered.push_back({
        .device = worker.device(),
        .device_count = worker.device_count(),
        .device_memory_bytes = worker.device_memory_bytes(),
    });
  }
  const DeviceMemoryVerdict verdict = JudgeDeviceMemory(need, offered);

  // The cluster the workers make: the preset of the job's device kind, with their memory.
  const bool cuda = plan->device == v1::ResourceConfig::CUDA;
  absl::StatusOr<ClusterSpec> cluster = ClusterPreset(cuda ? "h200-node" : "cpu");
  if (!cluster.ok()) return FailCommand(kCommand, cluster.status());
  const std::string preset = cluster->name;
  const bool memory_from_workers = verdict.smallest_known_bytes > 0;
  if (memory_from_workers) {
    cluster->device.memory_bytes = static_cast<double>(verdict.smallest_known_bytes);
    cluster->name = absl::StrCat(preset, " with the workers' memory");
  }
  cluster->gpus_per_node = static_cast<int>(plan->devices_per_worker);
  const Layout layout{.data_parallel = plan->config.parallel.data_parallel,
                      .expert_parallel = plan->config.parallel.expert_parallel,
                      .sharding = plan->config.parallel.sharding,
                      .recompute = plan->config.recompute};
  absl::StatusOr<LayoutPlan> layout_plan = PlanLayout(plan->config, layout, *cluster);
  if (!layout_plan.ok()) {
    return FailCommand(kCommand,
                       absl::Status(layout_plan.status().code(),
                                    absl::StrCat(spec_path, ": ", layout_plan.status().message())));
  }
  const int exit_code = verdict.refused() ? kExitUsage : kExitOk;
  // "17.55 GiB (params ...) of device memory by the plan", or the figure the spec states.
  const std::string need_text =
      need_stated
          ? absl::StrCat(FormatBytes(static_cast<double>(need.bytes_per_rank)),
                         " of device memory (resources.device_memory_bytes = ", need.bytes_per_rank,
                         " in the spec)")
          : absl::StrCat(plan->estimate.DebugString(), " of device memory by the plan");

  if (options.json) {
    const json out = {
        {"spec", spec_path},
        {"coordinator", options.connect.address},
        {"device", DeviceName(plan->device)},
        {"workers_needed", plan->workers},
        {"devices_per_worker", plan->devices_per_worker},
        {"workers",
         {{"matching", verdict.matching_workers},
          {"known_memory", verdict.known_memory_workers},
          {"enough_memory", verdict.enough_memory_workers},
          {"smallest_memory_bytes", verdict.smallest_known_bytes},
          {"largest_memory_bytes", verdict.largest_known_bytes}}},
        {"cluster", cluster->name},
        {"device_memory_bytes", cluster->device.memory_bytes},
        {"gpus_per_node", cluster->gpus_per_node},
        {"gpus", layout.gpus()},
        {"device_memory_needed_bytes", need.bytes_per_rank},
        {"device_memory_stated", need_stated},
        {"layout", LayoutPlanJson(*layout_plan)},
        {"accepted", !verdict.refused()},
        {"refusal", verdict.refused() ? json(std::string(verdict.status.message())) : json()}};
    // A path is bytes, not always UTF-8: replaced rather than thrown on.
    std::printf("%s\n",
                JsonTerminalSafe(out.dump(-1, ' ', false, json::error_handler_t::replace)).c_str());
    return exit_code;
  }
  std::printf("%s: %lld %s %s x %lld %s, dp=%d x ep=%d\n", TerminalSafe(spec_path).c_str(),
              static_cast<long long>(plan->workers), DeviceName(plan->device).c_str(),
              plan->workers == 1 ? "worker" : "workers",
              static_cast<long long>(plan->devices_per_worker),
              plan->devices_per_worker == 1 ? "device" : "devices", layout.data_parallel,
              layout.expert_parallel);
  std::printf("coordinator %s: %s\n", TerminalSafe(options.connect.address).c_str(),
              WorkersLine(*plan, verdict).c_str());
  std::printf("plan on %s: %s a device (%s), %d per node\n", cluster->name.c_str(),
              FormatBytes(cluster->device.memory_bytes).c_str(),
              memory_from_workers ? "the smallest the workers advertise"
              : cuda              ? "the preset's: no worker advertises its memory"
                                  : "the preset's: this machine's",
              cluster->gpus_per_node);
  PrintLayoutTable({*layout_plan});
  if (verdict.refused()) {
    std::printf("the coordinator would refuse it (FAILED_PRECONDITION): %s\n",
                TerminalSafe(verdict.status.message()).c_str());
    std::printf("what would lower the need of this spec: %s\n", plan->hint.c_str());
  } else if (need.bytes_per_rank > 0 && verdict.matching_workers == 0) {
    std::printf(
        "the coordinator would accept it: a rank needs %s; the job waits for matching workers to "
        "register\n",
        need_text.c_str());
  } else if (need.bytes_per_rank > 0) {
    // Which workers can hold a rank: those that offer enough, and those that do not say.
    const int unknown = verdict.matching_workers - verdict.known_memory_workers;
    const std::string silent =
        unknown > 0 ? absl::StrCat(", ", unknown, " do not say their memory") : "";
    std::printf(
        "the coordinator would accept it: a rank needs %s; %d of the %d matching workers offer "
        "that much%s\n",
        need_text.c_str(), verdict.enough_memory_workers, verdict.matching_workers, silent.c_str());
  } else {
    std::printf("the coordinator would accept it: a rank needs %s of host memory by the plan\n",
                plan->estimate.DebugString().c_str());
  }
  return exit_code;
}

}  // namespace moetrain
