#include "engine/backend/exec_context.h"

#include "absl/strings/str_cat.h"

namespace moetrain {

ExecContext ExecContext::Cpu(ThreadPool* pool) {
  return ExecContext(Device::Cpu(), &CpuAllocator(), pool != nullptr ? pool : &DefaultThreadPool());
}

absl::StatusOr<ExecContext> ExecContext::ForDevice(Device device) {
  if (device.is_cpu()) return Cpu();
  return absl::InvalidArgumentError(
      absl::StrCat("device ", device.DebugString(),
                   ": no backend in this build serves it (the engine computes on the CPU only)"));
}

}  // namespace moetrain
