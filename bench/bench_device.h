// The --device flag the benches share: cpu, cuda or cuda:N, opened as an ExecContext.
#ifndef MOETRAIN_BENCH_BENCH_DEVICE_H_
#define MOETRAIN_BENCH_BENCH_DEVICE_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "engine/backend/device_query.h"
#include "engine/backend/exec_context.h"
#include "engine/core/device.h"

namespace moetrain::bench {

// --device cuda without a usable GPU (ctest's skip convention).
inline constexpr int kExitSkipped = 77;

// Sets *ctx to the context of --device `name` and returns 0; else says why on stderr (prefixed by
// `tool` for a malformed name) and returns the exit status: 2 for a malformed name, kExitSkipped
// when the GPU is missing or cannot be opened.
inline int OpenBenchDevice(const char* tool, const std::string& name, ExecContext* ctx) {
  if (name == "cpu") {
    *ctx = ExecContext::Cpu();
    return 0;
  }
  int index = 0;
  const bool cuda = name == "cuda" || (name.rfind("cuda:", 0) == 0 &&
                                       absl::SimpleAtoi(name.substr(5), &index) && index >= 0);
  if (!cuda) {
    std::fprintf(stderr, "%s: --device %s: expected cpu, cuda or cuda:N\n", tool, name.c_str());
    return 2;
  }
  const DeviceReport report = QueryDevices();
  if (report.gpus.empty()) {
    std::fprintf(stderr, "no GPU: %s\n", report.no_gpu_reason.c_str());
    return kExitSkipped;
  }
  absl::StatusOr<ExecContext> device_ctx = ExecContext::ForDevice(Device::Cuda(index));
  if (!device_ctx.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", device_ctx.status().ToString().c_str());
    return kExitSkipped;
  }
  *ctx = *device_ctx;
  return 0;
}

}  // namespace moetrain::bench

#endif  // MOETRAIN_BENCH_BENCH_DEVICE_H_
