// Which accelerators this process can use.
#ifndef MOETRAIN_ENGINE_BACKEND_DEVICE_QUERY_H_
#define MOETRAIN_ENGINE_BACKEND_DEVICE_QUERY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace moetrain {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;
};

struct DeviceReport {
  std::vector<GpuInfo> gpus;
  // Why `gpus` is empty: built without CUDA, no driver, no device... Empty when there are GPUs.
  std::string no_gpu_reason;
};

// Never fails: any CUDA error (e.g. cudaErrorInsufficientDriver on a machine without a driver)
// means "no GPU", with the error in no_gpu_reason.
DeviceReport QueryDevices();

// "2 GPUs: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB), ..." or "no GPU (<reason>)".
std::string DescribeDevices(const DeviceReport& report);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_BACKEND_DEVICE_QUERY_H_
