#include "moetrain/v1/memory_admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moetrain {

DeviceMemoryNeed DeviceMemoryNeedOf(const v1::JobSpec& spec) {
  const v1::ResourceConfig& resources = spec.resources();
  return {
      .job_name = spec.name(),
      .device = resources.device(),
      .devices_per_worker = resources.has_devices_per_worker() ? resources.devices_per_worker() : 1,
      .bytes_per_rank = resources.device_memory_bytes()};
}

std::string FormatGiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

DeviceMemoryVerdict JudgeDeviceMemory(const DeviceMemoryNeed& need,
                                      const std::vector<OfferedWorker>& workers) {
  DeviceMemoryVerdict verdict;
  for (const OfferedWorker& worker : workers) {
    if (worker.device != need.device || worker.device_count < need.devices_per_worker) {
      continue;
    }
    ++verdict.matching_workers;
    if (worker.device_memory_bytes <= 0) continue;
    verdict.smallest_known_bytes =
        verdict.known_memory_workers == 0
            ? worker.device_memory_bytes
            : std::min(verdict.smallest_known_bytes, worker.device_memory_bytes);
    verdict.largest_known_bytes = std::max(verdict.largest_known_bytes, worker.device_memory_bytes);
    ++verdict.known_memory_workers;
    if (worker.device_memory_bytes >= need.bytes_per_rank) ++verdict.enough_memory_workers;
  }
  const bool refuse = need.bytes_per_rank > 0 && verdict.matching_workers > 0 &&
                      verdict.known_memory_workers == verdict.matching_workers &&
                      verdict.largest_known_bytes < need.bytes_per_rank;
  if (!refuse) return verdict;
  const bool one = verdict.matching_workers == 1;
  verdict.status = absl::FailedPreconditionError(absl::StrCat(
      "job ", need.job_name, " needs ", FormatGiB(need.bytes_per_rank),
      " of device memory per rank (resources.device_memory_bytes = ", need.bytes_per_rank,
      "); the ",
      one ? "only registered "
          : absl::StrCat("largest of the ", verdict.matching_workers, " registered "),
      v1::ResourceConfig::Device_Name(need.device), one ? " worker" : " workers",
      need.devices_per_worker > 1
          ? absl::StrCat(" with at least ", need.devices_per_worker, " devices")
          : std::string(),
      " offers ", FormatGiB(verdict.largest_known_bytes),
      " a device; lower train.micro_batch_size or raise parallel.expert_parallel, or make the "
      "model smaller; `moetrain plan SPEC` shows where the memory goes"));
  return verdict;
}

}  // namespace moetrain
