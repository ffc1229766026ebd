// `moetrain plan` through the real binary: the table and the JSON of the mini DeepSeek-V3 spec on
// this machine's preset, and exit code 2 naming the flag for a bad one.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cli_fixture.h"

namespace moetrain::cli_testing {
namespace {

const std::string kMiniSpec = std::string(MOETRAIN_SOURCE_DIR) + "/examples/deepseek-v3-mini.yaml";

using CliPlanTest = CliTest;

TEST_F(CliPlanTest, PlansTheMiniSpecOnThisMachine) {
  const Finished table = Moetrain({"plan", kMiniSpec, "--cluster", "cpu"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("memory/rank"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("fastest that fits: dp=1 x ep=1"), std::string::npos) << table.out;

  const Finished run = Moetrain({"plan", kMiniSpec, "--cluster", "cpu", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json plan = json::parse(run.out);
  EXPECT_EQ(plan["cluster"], "cpu");
  EXPECT_EQ(plan["gpus"], 1);  // the spec's world size
  ASSERT_EQ(plan["layouts"].size(), 1u);
  const json& layout = plan["layouts"][0];
  for (const char* key :
       {"data_parallel", "expert_parallel", "memory_bytes", "fits", "step_seconds", "tokens_per_s",
        "mfu", "all_to_all_share", "all_reduce_share"}) {
    EXPECT_TRUE(layout.contains(key)) << key << " missing from " << layout.dump();
  }
  EXPECT_GT(layout["memory_bytes"]["total"].get<double>(), 0);
  EXPECT_TRUE(layout["fits"].get<bool>());
  EXPECT_GT(layout["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(plan["best"]["step_seconds"], layout["step_seconds"]);
}

TEST_F(CliPlanTest, SweepsGpuCounts) {
  const Finished run =
      Moetrain({"plan", kMiniSpec, "--cluster", "h200-node", "--sweep", "1,2,4", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json plan = json::parse(run.out);
  for (const char* scaling : {"weak", "strong"}) {
    const json& points = plan["sweep"][scaling];
    ASSERT_EQ(points.size(), 3u) << plan.dump();
    EXPECT_EQ(points[0]["gpus"], 1);
    EXPECT_DOUBLE_EQ(points[0]["efficiency"].get<double>(), 1.0);
    EXPECT_EQ(points[2]["best"]["data_parallel"].get<int>() *
                  points[2]["best"]["expert_parallel"].get<int>(),
              4);
  }
}

// The question the command exists for: does DeepSeek-V3 fit on 256 H200s with EP 64?
TEST_F(CliPlanTest, PlansDeepSeekV3On256H200s) {
  const std::string spec = std::string(MOETRAIN_SOURCE_DIR) + "/examples/deepseek-v3-671b.yaml";
  const Finished run =
      Moetrain({"plan", spec, "--cluster", "h200-node", "--gpus", "256", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json plan = json::parse(run.out);
  EXPECT_EQ(plan["gpus"], 256);
  const json* ep64 = nullptr;
  for (const json& layout : plan["layouts"]) {
    if (layout["expert_parallel"] == 64) ep64 = &layout;
  }
  ASSERT_NE(ep64, nullptr) << plan.dump();
  EXPECT_EQ((*ep64)["data_parallel"], 4);
  const double total = (*ep64)["memory_bytes"]["total"].get<double>();
  // 4 of 256 routed experts a block and every dense weight: well over a GB of f32 masters alone.
  EXPECT_GT((*ep64)["memory_bytes"]["parameters"].get<double>(), 1e9);
  EXPECT_EQ((*ep64)["fits"].get<bool>(), total <= 141e9);
  // EP 64 spans 8 nodes of 8: the exchange crosses InfiniBand and shows in the step.
  EXPECT_GT((*ep64)["all_to_all_share"].get<double>(), 0);
  EXPECT_GT((*ep64)["mfu"].get<double>(), 0);
  EXPECT_LT((*ep64)["mfu"].get<double>(), 1);
}

// --recompute plans every layout recomputing: DeepSeek-V3's activations at ep 64 shrink to one
// block's (and the residual stream), and the recomputed forward shows in the compute.
TEST_F(CliPlanTest, RecomputeFlagPlansEveryLayoutRecomputing) {
  const std::string spec = std::string(MOETRAIN_SOURCE_DIR) + "/examples/deepseek-v3-671b.yaml";
  const Finished keep =
      Moetrain({"plan", spec, "--cluster", "h200-node", "--gpus", "256", "--json"});
  const Finished redo =
      Moetrain({"plan", spec, "--cluster", "h200-node", "--gpus", "256", "--recompute", "--json"});
  ASSERT_EQ(keep.exit_code, 0) << keep.err;
  ASSERT_EQ(redo.exit_code, 0) << redo.err;
  const json kept = json::parse(keep.out), redone = json::parse(redo.out);
  ASSERT_EQ(kept["layouts"].size(), redone["layouts"].size());
  for (size_t i = 0; i < redone["layouts"].size(); ++i) {
    const json& a = kept["layouts"][i];
    const json& b = redone["layouts"][i];
    SCOPED_TRACE(b.dump());
    EXPECT_EQ(a["recompute"], "NONE");  // it fits nowhere either way: the spec's setting stays
    EXPECT_EQ(b["recompute"], "FULL");
    EXPECT_LT(10 * b["memory_bytes"]["activations"].get<double>(),
              a["memory_bytes"]["activations"].get<double>());
    EXPECT_GT(b["compute_parts_seconds"]["recompute"].get<double>(), 0);
    EXPECT_GT(b["compute_seconds"].get<double>(), a["compute_seconds"].get<double>());
    // Never faster; no slower where the gradients' reduce-scatters outlast every backward
    // (GRADIENTS at dp 256: the recomputed forward hides under them).
    EXPECT_GE(b["step_seconds"].get<double>(), a["step_seconds"].get<double>());
  }
}

TEST_F(CliPlanTest, BadFlagsExitTwoNamingTheFlag) {
  const Finished nope = Moetrain({"plan", kMiniSpec, "--cluster", "nope"});
  EXPECT_EQ(nope.exit_code, 2);
  EXPECT_NE(nope.err.find("--cluster = 'nope'"), std::string::npos) << nope.err;

  const Finished zero = Moetrain({"plan", kMiniSpec, "--cluster", "cpu", "--gpus", "0"});
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--gpus"), std::string::npos) << zero.err;

  const Finished sweep = Moetrain({"plan", kMiniSpec, "--cluster", "cpu", "--sweep", "8,x"});
  EXPECT_EQ(sweep.exit_code, 2);
  EXPECT_NE(sweep.err.find("--sweep"), std::string::npos) << sweep.err;

  // What is allowed, not just that 0 is not.
  EXPECT_NE(zero.err.find("--gpus = 0 is not a GPU count: it must be in [1, 1073741824]"),
            std::string::npos)
      << zero.err;

  // 3 GPUs: no layout divides the 16 experts and the batch of 16.
  const Finished three = Moetrain({"plan", kMiniSpec, "--cluster", "cpu", "--gpus", "3"});
  EXPECT_EQ(three.exit_code, 2);
  EXPECT_NE(three.err.find("--gpus = 3"), std::string::npos) << three.err;
}

// 2^31 − 1 GPUs: the layout loop's int counter wrapped past INT_MAX to 0, and `gpus % 0` killed
// the process with SIGFPE. Each count out of range, as --gpus or in --sweep, is now exit 2 naming
// the flag, and the largest allowed one plans.
TEST_F(CliPlanTest, HugeGpuCountsExitTwoNamingTheFlagNotBySignal) {
  for (const std::vector<std::string>& flags : {std::vector<std::string>{"--gpus", "2147483647"},
                                                {"--gpus", "1073741825"},
                                                {"--gpus", "-8"},
                                                {"--sweep", "2,2147483647"},
                                                {"--sweep", "0"}}) {
    std::vector<std::string> args = {"plan", kMiniSpec, "--cluster", "h200-node"};
    args.insert(args.end(), flags.begin(), flags.end());
    const Finished run = Moetrain(args);
    EXPECT_EQ(run.term_signal, 0) << flags[1] << ": killed by signal " << run.term_signal;
    EXPECT_EQ(run.exit_code, 2) << flags[1] << ": " << run.err;
    EXPECT_NE(run.err.find(flags[0] + " = "), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("must be in [1, 1073741824]"), std::string::npos) << run.err;
  }
  // The largest count is looked at whole: none of its layouts divides the spec's batch of 16.
  const Finished largest =
      Moetrain({"plan", kMiniSpec, "--cluster", "h200-node", "--gpus", "1073741824"});
  EXPECT_EQ(largest.term_signal, 0);
  EXPECT_EQ(largest.exit_code, 2) << largest.err;
  EXPECT_NE(largest.err.find("--gpus = 1073741824: no dp x ep layout"), std::string::npos)
      << largest.err;
}

}  // namespace
}  // namespace moetrain::cli_testing
