// `moetrain plan SPEC [--cluster PRESET|FILE] [--gpus N] [--sweep 8,16,...] [--recompute]
// [--json]`: what the spec's job needs and how fast it runs at each dp × ep layout on a cluster,
// without running it (engine/plan/plan.h, docs/plan.md).
#ifndef MOETRAIN_CLIENT_PLAN_COMMAND_H_
#define MOETRAIN_CLIENT_PLAN_COMMAND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/plan/plan.h"
#include "nlohmann/json.hpp"

namespace moetrain {

struct PlanOptions {
  std::string spec_path;
  std::string cluster = "cpu";  // a preset name or a cluster YAML file
  // GPU counts, each in [1, kMaxPlanGpus] (PlanCommand refuses others, naming the flag), read as
  // int64 so that no value a user types wraps around first.
  std::optional<int64_t> gpus;  // unset = the spec's world size
  std::vector<int64_t> sweep;   // empty = no sweep
  bool recompute = false;       // every layout with train.recompute = FULL
  bool json = false;
};

// One layout's plan as --json writes it: data_parallel, expert_parallel, memory_bytes, fits, the
// times, shares, tokens_per_s and mfu.
nlohmann::json LayoutPlanJson(const LayoutPlan& plan);

// The table of `plans` on stdout, a header and one row per layout: dp, ep, memory/rank, fits,
// step, tokens/s, MFU, a2a, allred. Shared with `moetrain submit --dry-run`.
void PrintLayoutTable(const std::vector<LayoutPlan>& plans);

// Prints the plan to stdout; returns the exit code: 0, or 2 (printed to stderr) when the spec,
// the cluster or a flag is wrong.
int PlanCommand(const PlanOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_PLAN_COMMAND_H_
