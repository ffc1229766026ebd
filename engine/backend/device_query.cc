#include "engine/backend/device_query.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#ifdef MOETRAIN_HAVE_CUDA
#include "engine/backend/cuda/device_query.h"
#endif

namespace moetrain {

DeviceReport QueryDevices() {
#ifdef MOETRAIN_HAVE_CUDA
  return cuda::QueryCudaDevices();
#else
  DeviceReport report;
  report.no_gpu_reason = "built without CUDA (MOETRAIN_WITH_CUDA=OFF)";
  return report;
#endif
}

std::string DescribeDevices(const DeviceReport& report) {
  if (report.gpus.empty()) return absl::StrCat("no GPU (", report.no_gpu_reason, ")");
  std::string text = absl::StrCat(report.gpus.size(), report.gpus.size() == 1 ? " GPU:" : " GPUs:");
  for (size_t i = 0; i < report.gpus.size(); ++i) {
    const GpuInfo& gpu = report.gpus[i];
    absl::StrAppendFormat(&text, "%s %s (sm_%d%d, %d SMs, %.1f GiB)", i == 0 ? "" : ",", gpu.name,
                          gpu.compute_capability_major, gpu.compute_capability_minor,
                          gpu.multiprocessors, gpu.memory_bytes / (1024.0 * 1024.0 * 1024.0));
  }
  return text;
}

}  // namespace moetrain
