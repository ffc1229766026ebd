// `moetrain plan SPEC [--cluster PRESET|FILE] [--gpus N] [--sweep 8,16,...] [--json]`: what the
// spec's job needs and how fast it runs at each dp × ep layout on a cluster, without running it
// (engine/plan/plan.h, docs/plan.md).
#ifndef MOETRAIN_CLIENT_PLAN_COMMAND_H_
#define MOETRAIN_CLIENT_PLAN_COMMAND_H_

#include <string>
#include <vector>

namespace moetrain {

struct PlanOptions {
  std::string spec_path;
  std::string cluster = "cpu";  // a preset name or a cluster YAML file
  int gpus = 0;                 // 0 = the spec's world size
  std::vector<int> sweep;       // GPU counts; empty = no sweep
  bool json = false;
};

// Prints the plan to stdout; returns the exit code: 0, or 2 (printed to stderr) when the spec,
// the cluster or a flag is wrong.
int PlanCommand(const PlanOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_PLAN_COMMAND_H_
