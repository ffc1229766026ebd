// Where a tensor's memory lives: the host (CPU), or one CUDA device by its ordinal.
#ifndef MOETRAIN_ENGINE_CORE_DEVICE_H_
#define MOETRAIN_ENGINE_CORE_DEVICE_H_

#include <cstdint>
#include <string>

namespace moetrain {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // the CUDA ordinal; 0 for the CPU

  static constexpr Device Cpu() { return {}; }
  static constexpr Device Cuda(int index) { return {DeviceType::kCuda, index}; }

  bool is_cpu() const { return type == DeviceType::kCpu; }
  // "cpu", "cuda:1".
  std::string DebugString() const;

  friend bool operator==(const Device& a, const Device& b) = default;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_DEVICE_H_
