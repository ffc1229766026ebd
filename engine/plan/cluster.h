// What `moetrain plan` knows of a cluster: its GPUs, their links, and what fraction of each peak
// the kernels of each op class reach. A preset by name (h100-node, h200-node, cpu) or a YAML file.
//
// YAML (every key required, unknown keys refused):
//   name: my-cluster
//   gpus_per_node: 8
//   device: {model: H200, memory: 141GB, dense_bf16_flops: 989e12, dense_fp8_flops: 1979e12,
//            memory_bandwidth: 4.8TB/s}
//   intra_node: {bandwidth: 450GB/s, latency: 5e-6}   # per GPU, one direction; seconds
//   inter_node: {bandwidth: 50GB/s, latency: 1e-5}
//   efficiency: {dense_gemm: 0.7, grouped_gemm: 0.6, attention: 0.5, memory_bound: 0.7}
// Sizes and rates are a number of bytes, optionally followed by a unit: B, KB, MB, GB, TB (powers
// of 1000) or KiB, MiB, GiB, TiB (powers of 1024), and for rates "/s". FLOP/s and latencies
// (seconds) are plain numbers; efficiencies are fractions in (0, 1].
#ifndef MOETRAIN_ENGINE_PLAN_CLUSTER_H_
#define MOETRAIN_ENGINE_PLAN_CLUSTER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moetrain {

struct DeviceSpec {
  std::string model;  // "cpu" (the cpu preset: the host) or a GPU's name
  // Whether the ranks run on the host: the estimate then counts the memory the CPU gives back
  // (sharded gradients), which a GPU rank keeps.
  bool is_cpu() const { return model == "cpu"; }
  double memory_bytes = 0;
  double dense_bf16_flops = 0;  // FLOP/s, dense (no sparsity)
  double dense_fp8_flops = 0;
  double memory_bandwidth_bytes_per_s = 0;
};

struct LinkSpec {
  double bandwidth_bytes_per_s = 0;  // per GPU, one direction
  double latency_s = 0;              // per message
};

// Achieved fraction of the peak, per op class.
struct OpEfficiency {
  double dense_gemm = 0;    // attention projections, dense FFNs, shared experts, LM head
  double grouped_gemm = 0;  // the routed experts
  double attention = 0;     // the attention core (q·kᵀ, p·v)
  double memory_bound = 0;  // of memory bandwidth: the optimizer update
};

struct ClusterSpec {
  std::string name;
  int gpus_per_node = 0;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;
  OpEfficiency efficiency;
};

// The preset names, in the order help text lists them.
std::vector<std::string> ClusterPresetNames();

// A preset by name; NotFound naming it (and the presets) otherwise.
absl::StatusOr<ClusterSpec> ClusterPreset(std::string_view name);

// A cluster from YAML text; InvalidArgument naming the field and its value.
absl::StatusOr<ClusterSpec> ParseClusterYaml(std::string_view yaml);

// `--cluster`: a preset name, else a YAML file's path. NotFound when it is neither.
absl::StatusOr<ClusterSpec> LoadCluster(std::string_view name_or_path);

// "141GB", "4.8TB/s", "80GiB", "1e9": bytes (or bytes/s when `rate`). InvalidArgument naming
// `field` and the text when it is not one, or not positive.
absl::StatusOr<double> ParseBytes(std::string_view text, std::string_view field, bool rate);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_PLAN_CLUSTER_H_
