// The --device flag the benches share: cpu, cuda or cuda:N, opened as an ExecContext.
#ifndef MOETRAIN_BENCH_BENCH_DEVICE_H_
#define MOETRAIN_BENCH_BENCH_DEVICE_H_

#include <cstdio>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "engine/backend/device_query.h"
#include "engine/backend/exec_context.h"
#include "engine/core/device.h"

namespace moetrain::bench {

// --device cuda without a usable GPU (ctest's skip convention).
inline constexpr int kExitSkipped = 77;

// The CUDA index of --device `name`: -1 for cpu, N for cuda (N = 0) and cuda:N; nullopt for
// anything else.
inline std::optional<int> ParseBenchDevice(const std::string& name) {
  if (name == "cpu") return -1;
  if (name == "cuda") return 0;
  int index = 0;
  if (name.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(name.substr(5), &index) && index >= 0) {
    return index;
  }
  return std::nullopt;
}

// The CLI11 check of --device ("--device: gpu is not cpu, cuda or cuda:N").
inline CLI::Validator BenchDeviceCheck() {
  return CLI::Validator(
      [](std::string& name) {
        return ParseBenchDevice(name).has_value() ? std::string()
                                                  : name + " is not cpu, cuda or cuda:N";
      },
      "{cpu,cuda,cuda:N}");
}

// Sets *ctx to the context of --device `name` and returns 0; else says why on stderr (prefixed by
// `tool` for a malformed name) and returns the exit status: 2 for a malformed name, kExitSkipped
// when the GPU is missing or cannot be opened.
inline int OpenBenchDevice(const char* tool, const std::string& name, ExecContext* ctx) {
  const std::optional<int> index = ParseBenchDevice(name);
  if (!index.has_value()) {
    std::fprintf(stderr, "%s: --device %s: expected cpu, cuda or cuda:N\n", tool, name.c_str());
    return 2;
  }
  if (*index < 0) {
    *ctx = ExecContext::Cpu();
    return 0;
  }
  const DeviceReport report = QueryDevices();
  if (report.gpus.empty()) {
    std::fprintf(stderr, "no GPU: %s\n", report.no_gpu_reason.c_str());
    return kExitSkipped;
  }
  absl::StatusOr<ExecContext> device_ctx = ExecContext::ForDevice(Device::Cuda(*index));
  if (!device_ctx.ok()) {
    std::fprintf(stderr, "no GPU: %s\n", device_ctx.status().ToString().c_str());
    return kExitSkipped;
  }
  *ctx = *device_ctx;
  return 0;
}

}  // namespace moetrain::bench

#endif  // MOETRAIN_BENCH_BENCH_DEVICE_H_
