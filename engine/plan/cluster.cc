#include "engine/plan/cluster.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/train/memory_estimate.h"
#include "yaml-cpp/yaml.h"

namespace moetrain {
namespace {

// The NVIDIA H100 and H200 datasheets (nvidia.com, "H100 Tensor Core GPU" and "H200 Tensor Core
// GPU", SXM columns): dense BF16 989 TFLOP/s and FP8 1,979 TFLOP/s (the sheets' figures with
// sparsity are twice these); NVLink 900 GB/s per GPU, counted over both directions, so 450 GB/s
// each way. The inter-node link is one 400 Gb/s InfiniBand NIC per GPU (ConnectX-7, as in DGX
// H100/H200): 50 GB/s. The latencies are round-number assumptions, not measurements.
// The efficiencies too are round-number assumptions (large BF16 GEMMs on Hopper commonly reach
// about 70 % of peak), not measured: calibrate_bench measures the CPU only (docs/plan.md).
ClusterSpec HopperNode(std::string name, std::string model, double memory_bytes,
                       double memory_bandwidth) {
  ClusterSpec cluster;
  cluster.name = std::move(name);
  cluster.gpus_per_node = 8;
  cluster.device = {std::move(model), memory_bytes, 989e12, 1979e12, memory_bandwidth};
  cluster.intra_node = {450e9, 5e-6};
  cluster.inter_node = {50e9, 10e-6};
  cluster.efficiency = {0.7, 0.6, 0.5, 0.7};
  return cluster;
}

// This machine: its ranks are processes on its cores, exchanging over TCP loopback (Gloo). The
// figures are bench/calibration/cpu.json's (scripts/calibrate-plan.sh measured them on a 2-core
// Intel Xeon VM, 2026-12-05; tests/engine/plan/calibration_test.cc keeps the two equal): the bf16
// GEMM peak and copy bandwidth and the op classes' efficiencies from calibrate_bench, the link
// from dispatch_bench at 2 ranks. No network was measured: inter-node is the loopback link too.
// Only the memory is read here (MachineMemoryBytes). FP8 has no CPU peak of its own: bf16's.
absl::StatusOr<ClusterSpec> CpuCluster() {
  absl::StatusOr<int64_t> memory = MachineMemoryBytes();
  if (!memory.ok()) return memory.status();
  ClusterSpec cluster;
  cluster.name = "cpu";
  cluster.gpus_per_node = 2;
  cluster.device = {"cpu", static_cast<double>(*memory), 211.36e9, 211.36e9, 28.92e9};
  cluster.intra_node = {1.656e9, 415e-6};
  cluster.inter_node = cluster.intra_node;
  cluster.efficiency = {/*dense_gemm=*/0.998, /*grouped_gemm=*/0.769, /*attention=*/0.676,
                        /*memory_bound=*/0.732};
  return cluster;
}

std::string Text(const YAML::Node& node) {
  if (!node.IsScalar()) return "(not a scalar)";
  return node.Scalar();
}

absl::Status RefuseUnknownKeys(const YAML::Node& node, const std::string& where,
                               const std::set<std::string>& known) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where.empty() ? "cluster" : where, " must be a mapping"));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    if (known.count(key) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key ", where.empty() ? "" : absl::StrCat(where, "."), key,
                       " (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> Field(const YAML::Node& parent, const std::string& where,
                                 const std::string& key) {
  const YAML::Node node = parent[key];
  if (!node) {
    return absl::InvalidArgumentError(
        absl::StrCat(where.empty() ? "" : absl::StrCat(where, "."), key, " is missing"));
  }
  return node;
}

std::string Name(const std::string& where, const std::string& key) {
  return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
}

// A plain positive number; `at_most_one` for efficiencies.
absl::StatusOr<double> Number(const YAML::Node& parent, const std::string& where,
                              const std::string& key, bool at_most_one = false) {
  absl::StatusOr<YAML::Node> node = Field(parent, where, key);
  if (!node.ok()) return node.status();
  const std::string text = Text(*node);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value <= 0 ||
      (at_most_one && value > 1)) {
    return absl::InvalidArgumentError(absl::StrCat(Name(where, key), " = '", text,
                                                   "' is not a number in ",
                                                   at_most_one ? "(0, 1]" : "(0, inf)"));
  }
  return value;
}

absl::StatusOr<double> Bytes(const YAML::Node& parent, const std::string& where,
                             const std::string& key, bool rate) {
  absl::StatusOr<YAML::Node> node = Field(parent, where, key);
  if (!node.ok()) return node.status();
  return ParseBytes(Text(*node), Name(where, key), rate);
}

absl::Status ParseLink(const YAML::Node& root, const std::string& key, LinkSpec& link) {
  absl::StatusOr<YAML::Node> node = Field(root, "", key);
  if (!node.ok()) return node.status();
  if (absl::Status s = RefuseUnknownKeys(*node, key, {"bandwidth", "latency"}); !s.ok()) return s;
  absl::StatusOr<double> bandwidth = Bytes(*node, key, "bandwidth", /*rate=*/true);
  if (!bandwidth.ok()) return bandwidth.status();
  absl::StatusOr<double> latency = Number(*node, key, "latency");
  if (!latency.ok()) return latency.status();
  link = {*bandwidth, *latency};
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ParseRoot(const YAML::Node& root) {
  if (absl::Status s = RefuseUnknownKeys(
          root, "", {"name", "gpus_per_node", "device", "intra_node", "inter_node", "efficiency"});
      !s.ok()) {
    return s;
  }
  ClusterSpec cluster;
  absl::StatusOr<YAML::Node> name = Field(root, "", "name");
  if (!name.ok()) return name.status();
  cluster.name = Text(*name);
  absl::StatusOr<double> gpus = Number(root, "", "gpus_per_node");
  if (!gpus.ok()) return gpus.status();
  if (*gpus != std::floor(*gpus) || *gpus > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("gpus_per_node = '", Text(root["gpus_per_node"]),
                                                   "' is not a whole number from 1 to 1024"));
  }
  cluster.gpus_per_node = static_cast<int>(*gpus);

  absl::StatusOr<YAML::Node> device = Field(root, "", "device");
  if (!device.ok()) return device.status();
  if (absl::Status s = RefuseUnknownKeys(
          *device, "device",
          {"model", "memory", "dense_bf16_flops", "dense_fp8_flops", "memory_bandwidth"});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<YAML::Node> model = Field(*device, "device", "model");
  if (!model.ok()) return model.status();
  cluster.device.model = Text(*model);
  absl::StatusOr<double> memory = Bytes(*device, "device", "memory", false);
  if (!memory.ok()) return memory.status();
  absl::StatusOr<double> bf16 = Number(*device, "device", "dense_bf16_flops");
  if (!bf16.ok()) return bf16.status();
  absl::StatusOr<double> fp8 = Number(*device, "device", "dense_fp8_flops");
  if (!fp8.ok()) return fp8.status();
  absl::StatusOr<double> bandwidth = Bytes(*device, "device", "memory_bandwidth", true);
  if (!bandwidth.ok()) return bandwidth.status();
  cluster.device.memory_bytes = *memory;
  cluster.device.dense_bf16_flops = *bf16;
  cluster.device.dense_fp8_flops = *fp8;
  cluster.device.memory_bandwidth_bytes_per_s = *bandwidth;

  if (absl::Status s = ParseLink(root, "intra_node", cluster.intra_node); !s.ok()) return s;
  if (absl::Status s = ParseLink(root, "inter_node", cluster.inter_node); !s.ok()) return s;

  absl::StatusOr<YAML::Node> efficiency = Field(root, "", "efficiency");
  if (!efficiency.ok()) return efficiency.status();
  if (absl::Status s = RefuseUnknownKeys(
          *efficiency, "efficiency", {"dense_gemm", "grouped_gemm", "attention", "memory_bound"});
      !s.ok()) {
    return s;
  }
  std::pair<const char*, double*> fractions[] = {
      {"dense_gemm", &cluster.efficiency.dense_gemm},
      {"grouped_gemm", &cluster.efficiency.grouped_gemm},
      {"attention", &cluster.efficiency.attention},
      {"memory_bound", &cluster.efficiency.memory_bound}};
  for (auto& [key, out] : fractions) {
    absl::StatusOr<double> value = Number(*efficiency, "efficiency", key, /*at_most_one=*/true);
    if (!value.ok()) return value.status();
    *out = *value;
  }
  return cluster;
}

}  // namespace

std::vector<std::string> ClusterPresetNames() { return {"h100-node", "h200-node", "cpu"}; }

absl::StatusOr<ClusterSpec> ClusterPreset(std::string_view name) {
  // Memory: the datasheets' 80 GB and 141 GB (powers of 1000); HBM bandwidth 3.35 and 4.8 TB/s.
  if (name == "h100-node") return HopperNode("h100-node", "H100 SXM", 80e9, 3.35e12);
  if (name == "h200-node") return HopperNode("h200-node", "H200 SXM", 141e9, 4.8e12);
  if (name == "cpu") return CpuCluster();
  return absl::NotFoundError(absl::StrCat("no cluster preset '", std::string(name), "' (presets: ",
                                          absl::StrJoin(ClusterPresetNames(), ", "), ")"));
}

absl::StatusOr<ClusterSpec> ParseClusterYaml(std::string_view yaml) {
  try {
    return ParseRoot(YAML::Load(std::string(yaml)));
  } catch (const YAML::Exception& error) {
    return absl::InvalidArgumentError(absl::StrCat("cluster YAML: ", error.what()));
  }
}

absl::StatusOr<ClusterSpec> LoadCluster(std::string_view name_or_path) {
  for (const std::string& preset : ClusterPresetNames()) {
    if (preset == name_or_path) return ClusterPreset(name_or_path);
  }
  const std::string path(name_or_path);
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat("--cluster = '", path, "' is neither a preset (",
                                            absl::StrJoin(ClusterPresetNames(), ", "),
                                            ") nor a file"));
  }
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<ClusterSpec> cluster = ParseClusterYaml(text.str());
  if (!cluster.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", cluster.status().message()));
  }
  return cluster;
}

absl::StatusOr<double> ParseBytes(std::string_view text_view, std::string_view field_view,
                                  bool rate) {
  const std::string text(text_view), field(field_view);
  std::string rest(absl::StripAsciiWhitespace(text));
  const auto refuse = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = '", text, "' is not a positive ", rate ? "rate" : "size",
                     " (bytes, or a number and B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
                     rate ? ", then /s" : "", ")"));
  };
  if (rate && absl::EndsWith(rest, "/s")) rest.resize(rest.size() - 2);
  char* end = nullptr;
  const double number = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str()) return refuse();
  const std::string unit(end);
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = number * scale;
      if (!std::isfinite(bytes) || bytes <= 0) return refuse();
      return bytes;
    }
  }
  return refuse();
}

}  // namespace moetrain
