#include <cuda_runtime.h>

#include <string>

#include "engine/backend/cuda/device_query.h"

namespace moetrain::cuda {
namespace {

std::string ErrorText(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

}  // namespace

DeviceReport QueryCudaDevices() {
  DeviceReport report;
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Clear the sticky error so later CUDA calls in this process start clean.
    cudaGetLastError();
    report.no_gpu_reason = "cudaGetDeviceCount failed: " + ErrorText(error);
    return report;
  }
  if (count == 0) {
    report.no_gpu_reason = "the CUDA driver reports no devices";
    return report;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    error = cudaGetDeviceProperties(&prop, i);
    if (error != cudaSuccess) {
      cudaGetLastError();
      report.gpus.clear();
      report.no_gpu_reason =
          "cudaGetDeviceProperties(" + std::to_string(i) + ") failed: " + ErrorText(error);
      return report;
    }
    GpuInfo gpu;
    gpu.index = i;
    gpu.name = prop.name;
    gpu.compute_capability_major = prop.major;
    gpu.compute_capability_minor = prop.minor;
    gpu.multiprocessors = prop.multiProcessorCount;
    gpu.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    report.gpus.push_back(gpu);
  }
  return report;
}

}  // namespace moetrain::cuda
