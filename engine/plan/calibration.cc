#include "engine/plan/calibration.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/dtype.h"
#include "engine/core/json.h"
#include "engine/core/status.h"
#include "engine/plan/plan.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

using Json = nlohmann::json;

// The value at `path` (keys from `root`); InvalidArgument naming the path when it is missing.
absl::StatusOr<const Json*> Find(const Json& root, const std::vector<std::string>& path) {
  const Json* node = &root;
  for (const std::string& key : path) {
    if (!node->is_object() || !node->contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration file: ", absl::StrJoin(path, "."), " is missing"));
    }
    node = &(*node)[key];
  }
  return node;
}

// The number at `path`, positive (or zero, with `zero_ok`); InvalidArgument naming the path
// otherwise.
absl::StatusOr<double> Number(const Json& root, const std::vector<std::string>& path,
                              bool zero_ok = false) {
  MOETRAIN_ASSIGN_OR_RETURN(const Json* node, Find(root, path));
  if (!node->is_number() || !(node->get<double>() > 0 || (zero_ok && node->get<double>() == 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration file: ", absl::StrJoin(path, "."), " = ", JsonExcerpt(*node),
                     zero_ok ? " is not a number ≥ 0" : " is not a positive number"));
  }
  return node->get<double>();
}

absl::StatusOr<Json> Parse(std::string_view text) {
  MOETRAIN_ASSIGN_OR_RETURN(Json json, ParseJson(text, "calibration file"));
  if (!json.is_object()) return absl::InvalidArgumentError("calibration file: not a JSON object");
  return json;
}

absl::StatusOr<DType> DTypeAt(const Json& root, const std::vector<std::string>& path) {
  MOETRAIN_ASSIGN_OR_RETURN(const Json* node, Find(root, path));
  if (*node == "bf16") return DType::kBF16;
  if (*node == "f32") return DType::kF32;
  return absl::InvalidArgumentError(absl::StrCat("calibration file: ", absl::StrJoin(path, "."),
                                                 " = ", JsonExcerpt(*node), " is not bf16 or f32"));
}

absl::StatusOr<ClusterSpec> ClusterOf(const Json& root, int ranks) {
  MOETRAIN_ASSIGN_OR_RETURN(const auto peak,
                            Number(root, {"calibrate_bench", "peak", "dense_bf16_gflops"}));
  MOETRAIN_ASSIGN_OR_RETURN(const auto bandwidth,
                            Number(root, {"calibrate_bench", "peak", "memory_bandwidth_gb_per_s"}));
  MOETRAIN_ASSIGN_OR_RETURN(const auto dense,
                            Number(root, {"calibrate_bench", "efficiency", "dense_gemm"}));
  MOETRAIN_ASSIGN_OR_RETURN(const auto grouped,
                            Number(root, {"calibrate_bench", "efficiency", "grouped_gemm"}));
  MOETRAIN_ASSIGN_OR_RETURN(const auto attention,
                            Number(root, {"calibrate_bench", "efficiency", "attention"}));
  MOETRAIN_ASSIGN_OR_RETURN(const auto memory,
                            Number(root, {"calibrate_bench", "efficiency", "memory_bound"}));
  const std::string at = std::to_string(ranks <= 1 ? 2 : ranks);
  MOETRAIN_ASSIGN_OR_RETURN(const auto link_bandwidth,
                            Number(root, {"dispatch_bench", at, "link", "bandwidth_bytes_per_s"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      const auto latency,
      Number(root, {"dispatch_bench", at, "link", "latency_s"}, /*zero_ok=*/true));
  ClusterSpec cluster;
  cluster.name = "calibrated cpu";
  cluster.gpus_per_node = ranks;
  // Memory plays no part in a time; any positive size.
  cluster.device = {"cpu", 1e18, peak * 1e9, peak * 1e9, bandwidth * 1e9};
  cluster.intra_node = {link_bandwidth, latency};
  cluster.inter_node = cluster.intra_node;
  cluster.efficiency = {dense, grouped, attention, memory};
  for (double e : {dense, grouped, attention, memory}) {
    if (e > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration file: an efficiency of calibrate_bench is ", e, " > 1"));
    }
  }
  return cluster;
}

// train_bench's config as its JSON states it.
absl::StatusOr<TrainerConfig> TrainBenchConfig(const Json& root) {
  const auto field = [&](const char* name) {
    return Number(root, {"train_bench", "config", name});
  };
  TrainerConfig c;
  int64_t* const targets[] = {&c.model.vocab_size,      &c.model.hidden_size,
                              &c.model.num_layers,      &c.model.ffn_dim,
                              &c.model.num_heads,       &c.model.num_kv_heads,
                              &c.model.moe.num_experts, &c.model.moe.expert_ffn_dim,
                              &c.data.seq_len,          &c.data.batch_size};
  const char* const names[] = {"vocab_size", "hidden_size",  "num_layers",  "ffn_dim",
                               "num_heads",  "num_kv_heads", "num_experts", "expert_ffn_dim",
                               "seq_len",    "batch_size"};
  for (size_t i = 0; i < std::size(names); ++i) {
    MOETRAIN_ASSIGN_OR_RETURN(const auto value, field(names[i]));
    *targets[i] = static_cast<int64_t>(value);
  }
  MOETRAIN_ASSIGN_OR_RETURN(const auto top_k, field("top_k"));
  c.model.moe.top_k = static_cast<int64_t>(top_k);
  MOETRAIN_ASSIGN_OR_RETURN(const auto head_dim, field("head_dim"));
  c.model.head_dim = static_cast<int64_t>(head_dim);
  // These two may be 0.
  MOETRAIN_ASSIGN_OR_RETURN(const auto dense,
                            Number(root, {"train_bench", "config", "first_dense_layers"}, true));
  c.model.first_dense_layers = static_cast<int64_t>(dense);
  MOETRAIN_ASSIGN_OR_RETURN(const auto shared,
                            Number(root, {"train_bench", "config", "num_shared_experts"}, true));
  c.model.moe.num_shared_experts = static_cast<int64_t>(shared);
  c.model.max_seq_len = c.data.seq_len;
  MOETRAIN_ASSIGN_OR_RETURN(const auto dtype, DTypeAt(root, {"train_bench", "dtype"}));
  c.compute_dtype = dtype;
  // Files from before train_bench printed it kept every activation.
  const Json& bench = root.at("train_bench");
  if (bench.contains("recompute")) {
    const std::optional<Recompute> mode =
        bench["recompute"].is_string() ? RecomputeFromName(bench["recompute"].get<std::string>())
                                       : std::nullopt;
    if (!mode.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration file: train_bench.recompute = ", bench["recompute"].dump(),
                       " is not \"NONE\", \"SELECTIVE\" or \"FULL\""));
    }
    c.recompute = *mode;
  }
  return c;
}

}  // namespace

absl::StatusOr<ClusterSpec> CalibratedCluster(std::string_view calibration_json, int ranks) {
  MOETRAIN_ASSIGN_OR_RETURN(const auto root, Parse(calibration_json));
  return ClusterOf(root, ranks);
}

absl::StatusOr<std::vector<CalibrationCheck>> CheckCalibration(std::string_view calibration_json) {
  MOETRAIN_ASSIGN_OR_RETURN(const auto root, Parse(calibration_json));
  std::vector<CalibrationCheck> checks;

  // train_bench, one rank, against the dense GEMM of its own run.
  MOETRAIN_ASSIGN_OR_RETURN(const auto train_config, TrainBenchConfig(root));
  absl::StatusOr<ClusterSpec> cluster = ClusterOf(root, 1);
  if (!cluster.ok()) return cluster.status();
  MOETRAIN_ASSIGN_OR_RETURN(const auto train_peak,
                            Number(root, {"train_bench", "dense_gemm_gflops_bf16"}));
  cluster->device.dense_bf16_flops = cluster->device.dense_fp8_flops = train_peak * 1e9;
  absl::StatusOr<LayoutPlan> plan =
      PlanLayout(train_config, {1, 1, Sharding::kNone, train_config.recompute}, *cluster);
  if (!plan.ok()) return plan.status();
  MOETRAIN_ASSIGN_OR_RETURN(const auto tokens_per_s, Number(root, {"train_bench", "tokens_per_s"}));
  checks.push_back(
      {"train_bench tokens/s", plan->tokens_per_s, tokens_per_s, kTrainBenchTolerance});

  // dispatch_bench at each stored rank count: dispatch and combine, one chunk.
  if (!root.contains("dispatch_bench") || !root["dispatch_bench"].is_object() ||
      root["dispatch_bench"].empty()) {
    return absl::InvalidArgumentError("calibration file: dispatch_bench is missing");
  }
  for (const auto& [key, run] : root["dispatch_bench"].items()) {
    MOETRAIN_ASSIGN_OR_RETURN(const auto ranks,
                              Number(root, {"dispatch_bench", key, "machine", "ranks"}));
    MOETRAIN_ASSIGN_OR_RETURN(const auto ep_cluster, ClusterOf(root, static_cast<int>(ranks)));
    MOETRAIN_ASSIGN_OR_RETURN(const auto tokens,
                              Number(root, {"dispatch_bench", key, "config", "tokens_per_rank"}));
    MOETRAIN_ASSIGN_OR_RETURN(const auto top_k,
                              Number(root, {"dispatch_bench", key, "config", "top_k"}));
    MOETRAIN_ASSIGN_OR_RETURN(const auto hidden,
                              Number(root, {"dispatch_bench", key, "config", "hidden"}));
    MOETRAIN_ASSIGN_OR_RETURN(const auto dtype,
                              DTypeAt(root, {"dispatch_bench", key, "config", "dtype"}));
    MOETRAIN_ASSIGN_OR_RETURN(
        const auto measured_ms,
        Number(root, {"dispatch_bench", key, "exchange", "dispatch_combine_ms"}));
    const double row = hidden * static_cast<double>(DTypeSize(dtype));
    const double bytes =
        AllToAllBytesPerRank(tokens, static_cast<int>(top_k), row, static_cast<int>(ranks));
    const double predicted = 2 * AllToAllSeconds(bytes, 1, ep_cluster.intra_node);
    checks.push_back({absl::StrCat("dispatch_bench exchange ms, ", key, " ranks"), predicted * 1e3,
                      measured_ms, kDispatchBenchTolerance});
  }
  return checks;
}

}  // namespace moetrain
