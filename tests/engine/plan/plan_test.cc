#include "engine/plan/plan.h"

#include <optional>
#include <string>
#include <vector>

#include "engine/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/engine/train/parallel_test_config.h"
#include "tests/engine/train/tiny_trainer_config.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using testing_config::TinyTrainerConfig;

// A cluster whose figures make the arithmetic easy to follow.
ClusterSpec RoundCluster() {
  ClusterSpec cluster;
  cluster.name = "round";
  cluster.gpus_per_node = 8;
  cluster.device = {"round", 1e12, 1e12, 2e12, 1e12};
  cluster.intra_node = {1e9, 1e-6};
  cluster.inter_node = {1e8, 1e-5};
  cluster.efficiency = {1, 1, 1, 1};
  return cluster;
}

TEST(PlanTest, FlopsSplitAddsUpToTrainingFlops) {
  const TrainerConfig config = TinyTrainerConfig("");
  const FlopsSplit split = SplitTrainingFlops(config.model, 32);
  EXPECT_DOUBLE_EQ(split.total(), TrainingFlopsPerToken(config.model, 32));
  // One MoE block: top-2 experts of 3·D·F parameters, 6 FLOPs per parameter.
  EXPECT_DOUBLE_EQ(split.routed_experts, 6.0 * 2 * 3 * 32 * 32);
  EXPECT_GT(split.dense, 0);
  EXPECT_GT(split.attention_core, 0);
}

TEST(PlanTest, MemoryIsTheTrainingEstimateAtTheLayout) {
  TrainerConfig config = TinyTrainerConfig("");
  ASSERT_OK_AND_ASSIGN(LayoutPlan plan, PlanLayout(config, {2, 2}, RoundCluster()));
  config.parallel.data_parallel = 2;
  config.parallel.expert_parallel = 2;
  const MemoryEstimate expected = EstimateTrainingMemory(config);
  EXPECT_DOUBLE_EQ(plan.memory.parameters, expected.parameters);
  EXPECT_DOUBLE_EQ(plan.memory.gradients, expected.gradients);
  EXPECT_DOUBLE_EQ(plan.memory.optimizer, expected.optimizer);
  EXPECT_DOUBLE_EQ(plan.memory.activations, expected.activations);
  EXPECT_TRUE(plan.fits);

  ClusterSpec small = RoundCluster();
  small.device.memory_bytes = expected.total() - 1;
  ASSERT_OK_AND_ASSIGN(LayoutPlan tight, PlanLayout(config, {2, 2}, small));
  EXPECT_FALSE(tight.fits);
}

// ZeRO-1 at dp 4: a quarter of the moments, a quarter of AdamW's traffic, and the same bytes on
// the wire split into the grads' reduce-scatter (under backward) and the weights' all-gather
// (after the optimizer, exposed): the step differs by that and by the optimizer's time. Where only
// the sharded layout fits, it is the one chosen.
TEST(PlanTest, ShardingTradesAnExposedWeightGatherForMemory) {
  TrainerConfig config = TinyTrainerConfig("");
  config.model.moe.num_experts = 4;
  const ClusterSpec cluster = RoundCluster();
  ASSERT_OK_AND_ASSIGN(const LayoutPlan none, PlanLayout(config, {4, 1}, cluster));
  ASSERT_OK_AND_ASSIGN(const LayoutPlan sharded,
                       PlanLayout(config, {4, 1, Sharding::kOptimizer}, cluster));
  EXPECT_NEAR(sharded.memory.optimizer, none.memory.optimizer / 4, 0.01 * none.memory.optimizer);
  // 28 bytes a parameter updated and 2 a parameter held: 28/4 + 2 against 30.
  EXPECT_NEAR(sharded.optimizer_s, none.optimizer_s * (28.0 / 4 + 2) / 30, 0.02 * none.optimizer_s);
  EXPECT_DOUBLE_EQ(sharded.all_reduce_s, none.all_reduce_s);
  EXPECT_DOUBLE_EQ(sharded.all_gather_s, none.all_reduce_s / 2);
  EXPECT_EQ(none.all_gather_s, 0);
  EXPECT_GE(sharded.all_reduce_exposed_s, sharded.all_gather_s);
  EXPECT_GT(sharded.memory.checkpoint_gather, 0);
  EXPECT_LT(sharded.memory.on_device(), none.memory.on_device());

  ClusterSpec tight = cluster;
  tight.device.memory_bytes = (sharded.memory.on_device() + none.memory.on_device()) / 2;
  const std::vector<LayoutPlan> plans = PlanLayouts(config, 4, tight);
  const std::optional<LayoutPlan> best = Fastest(plans);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->layout.sharding, Sharding::kOptimizer);
  EXPECT_NEAR(sharded.step_s - none.step_s,
              (sharded.all_reduce_exposed_s - none.all_reduce_exposed_s) +
                  (sharded.optimizer_s - none.optimizer_s),
              1e-12 * none.step_s);
}

// ZeRO-2 at dp 4: the moments as ZeRO-1's; a reduce-scatter every micro-batch instead of one a
// step (the weights' all-gather stays one); of the gradients, on the CPU the rank's quarter and
// the buckets in flight, on a GPU (which keeps what it lets go of) ZeRO-1's; with several
// micro-batches an accumulator of the quarter on either.
TEST(PlanTest, ShardedGradientsTradeAReduceScatterPerMicroBatchForMemory) {
  TrainerConfig config = TinyTrainerConfig("");
  config.model.moe.num_experts = 4;
  config.model.num_layers = 8;  // buckets of a block: a small part of the gradients each
  config.parallel.grad_bucket_bytes = 1 << 10;
  ClusterSpec host = RoundCluster();
  host.device.model = "cpu";
  for (const ClusterSpec& cluster : {host, RoundCluster()}) {
    SCOPED_TRACE(cluster.device.model);
    config.micro_batch_size = 4;
    ASSERT_EQ(config.micro_batches(), 2);
    ASSERT_OK_AND_ASSIGN(const LayoutPlan zero1,
                         PlanLayout(config, {4, 1, Sharding::kOptimizer}, cluster));
    ASSERT_OK_AND_ASSIGN(const LayoutPlan zero2,
                         PlanLayout(config, {4, 1, Sharding::kGradients}, cluster));
    EXPECT_DOUBLE_EQ(zero2.memory.optimizer, zero1.memory.optimizer);
    EXPECT_DOUBLE_EQ(zero2.all_gather_s, zero1.all_gather_s);
    EXPECT_NEAR(zero2.all_reduce_s - zero2.all_gather_s,
                2 * (zero1.all_reduce_s - zero1.all_gather_s), 1e-12 * zero1.all_reduce_s);
    config.micro_batch_size = 0;  // one micro-batch: one reduce-scatter, no accumulator
    ASSERT_OK_AND_ASSIGN(const LayoutPlan once,
                         PlanLayout(config, {4, 1, Sharding::kGradients}, cluster));
    EXPECT_DOUBLE_EQ(once.all_reduce_s, zero1.all_reduce_s);
    const double share = zero1.memory.optimizer / 8;  // the f32 moments' two words a parameter
    EXPECT_NEAR(zero2.memory.gradients - once.memory.gradients, 4 * share, 0.01 * share);
    if (cluster.device.is_cpu()) {
      EXPECT_LT(once.memory.gradients, zero1.memory.gradients);
      EXPECT_GT(once.memory.gradients, zero1.memory.gradients / 4);
    } else {
      EXPECT_DOUBLE_EQ(once.memory.gradients, zero1.memory.gradients);
    }
  }
}

// Full recompute: the activations of one block instead of all; the blocks' forward once more, but
// the last one's (a third of their matmuls, not the LM head's, and half the elementwise passes
// again), which is all the step adds on one GPU; with expert parallelism the forward's exchange
// once more, half as much again as the exchange when every row goes in one dtype, but the last
// MoE block's. Where only the recomputing layout
// fits, it is the one chosen.
TEST(PlanTest, RecomputeTradesAForwardForActivations) {
  TrainerConfig config = TinyTrainerConfig("");
  config.model.num_layers = 4;
  const ClusterSpec cluster = RoundCluster();
  ASSERT_OK_AND_ASSIGN(const LayoutPlan none, PlanLayout(config, {1, 1}, cluster));
  ASSERT_OK_AND_ASSIGN(const LayoutPlan full,
                       PlanLayout(config, {1, 1, Sharding::kNone, Recompute::kFull}, cluster));
  EXPECT_LT(full.memory.activations, none.memory.activations / 2);
  EXPECT_EQ(none.recompute_s, 0);
  const double lm_head = 6.0 * static_cast<double>(config.model.vocab_size) *
                         static_cast<double>(config.model.hidden_size);
  const FlopsSplit split = SplitTrainingFlops(config.model, config.data.seq_len);
  // All four blocks but the last, whose buffers still hold its forward.
  const double block_matmuls_s = none.dense_gemm_s * (split.dense - lm_head) / split.dense +
                                 none.grouped_gemm_s + none.attention_s;
  EXPECT_NEAR(full.recompute_s, (block_matmuls_s / 3 + none.elementwise_s / 2) * 3 / 4,
              1e-9 * full.recompute_s);
  EXPECT_DOUBLE_EQ(full.elementwise_s, none.elementwise_s);
  EXPECT_NEAR(full.step_s - none.step_s, full.recompute_s, 1e-9 * full.step_s);

  ASSERT_OK_AND_ASSIGN(const LayoutPlan none_ep, PlanLayout(config, {1, 2}, cluster));
  ASSERT_OK_AND_ASSIGN(const LayoutPlan full_ep,
                       PlanLayout(config, {1, 2, Sharding::kNone, Recompute::kFull}, cluster));
  ASSERT_GT(none_ep.all_to_all_s, 0);
  // The forward's two exchanges of every MoE block but the last: 2 of the 3 after the dense one.
  const double again = 1 + 0.5 * 2 / 3;
  EXPECT_NEAR(full_ep.all_to_all_s, again * none_ep.all_to_all_s, 1e-9 * full_ep.all_to_all_s);
  EXPECT_NEAR(full_ep.all_to_all_bytes, again * none_ep.all_to_all_bytes, 1.0);

  ASSERT_OK_AND_ASSIGN(const LayoutPlan selective,
                       PlanLayout(config, {1, 1, Sharding::kNone, Recompute::kSelective}, cluster));
  ClusterSpec tight = cluster;
  tight.device.memory_bytes = (full.memory.on_device() + selective.memory.on_device()) / 2;
  const std::optional<LayoutPlan> best = Fastest(PlanLayouts(config, 1, tight));
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->layout.recompute, Recompute::kFull);
  const std::optional<LayoutPlan> roomy = Fastest(PlanLayouts(config, 1, cluster));
  ASSERT_TRUE(roomy.has_value());
  EXPECT_EQ(roomy->layout.recompute, Recompute::kNone);
}

// Selective recompute: fewer activations than keeping them all, more than full recompute; what
// it adds is one more write of the bytes it lets go of (half an elementwise pass over them), for
// every block but the last, and with MLA the up-projections' GEMMs; no exchange runs again. Where
// it fits and keeping everything does not, it is chosen before full recompute.
TEST(PlanTest, SelectiveRecomputeSitsBetweenKeepingAndFull) {
  for (const bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    TrainerConfig config = TinyTrainerConfig("");
    config.model.num_layers = 4;
    config.model.moe.num_experts = 4;
    if (mla) config = parallel_test::WithDeepseekV3(config);  // MLA and an MTP module
    const ClusterSpec cluster = RoundCluster();
    ASSERT_OK_AND_ASSIGN(const LayoutPlan none, PlanLayout(config, {1, 2}, cluster));
    ASSERT_OK_AND_ASSIGN(
        const LayoutPlan selective,
        PlanLayout(config, {1, 2, Sharding::kNone, Recompute::kSelective}, cluster));
    ASSERT_OK_AND_ASSIGN(const LayoutPlan full,
                         PlanLayout(config, {1, 2, Sharding::kNone, Recompute::kFull}, cluster));
    EXPECT_LT(selective.memory.activations, none.memory.activations);
    EXPECT_GT(selective.memory.activations, full.memory.activations);
    const double dropped = none.memory.activations - selective.memory.activations;
    const double elementwise_s = none.elementwise_s / 2 * dropped / none.memory.activations * 3 / 4;
    if (mla) {
      EXPECT_GT(selective.recompute_s, elementwise_s * (1 + 1e-6));
    } else {
      EXPECT_NEAR(selective.recompute_s, elementwise_s, 1e-9 * selective.recompute_s);
    }
    EXPECT_LT(selective.recompute_s, full.recompute_s);
    EXPECT_DOUBLE_EQ(selective.all_to_all_bytes, none.all_to_all_bytes);

    // On one GPU, whose only layout is 1 × 1.
    ASSERT_OK_AND_ASSIGN(const LayoutPlan none_1, PlanLayout(config, {1, 1}, cluster));
    ASSERT_OK_AND_ASSIGN(
        const LayoutPlan selective_1,
        PlanLayout(config, {1, 1, Sharding::kNone, Recompute::kSelective}, cluster));
    ClusterSpec tight = cluster;
    tight.device.memory_bytes = (selective_1.memory.on_device() + none_1.memory.on_device()) / 2;
    const std::optional<LayoutPlan> best = Fastest(PlanLayouts(config, 1, tight));
    ASSERT_TRUE(best.has_value());
    EXPECT_TRUE(best->fits);
    EXPECT_EQ(best->layout.recompute, Recompute::kSelective);
  }
}

// Gradients reduced in bf16: half the bytes of the gradients' all-reduce (or reduce-scatter), the
// sharded weights' all-gather still f32, and a bf16 staging copy of the grads, 2 bytes a
// parameter.
TEST(PlanTest, Bf16GradientReductionHalvesTheGradientsBytes) {
  TrainerConfig config = TinyTrainerConfig("");
  config.model.moe.num_experts = 4;
  ClusterSpec cluster = RoundCluster();
  cluster.intra_node.latency_s = cluster.inter_node.latency_s = 0;  // bytes only
  for (const Sharding sharding : {Sharding::kNone, Sharding::kOptimizer}) {
    SCOPED_TRACE(ShardingName(sharding));
    config.parallel.grad_reduce_dtype = DType::kF32;
    ASSERT_OK_AND_ASSIGN(const LayoutPlan f32, PlanLayout(config, {4, 1, sharding}, cluster));
    config.parallel.grad_reduce_dtype = DType::kBF16;
    ASSERT_OK_AND_ASSIGN(const LayoutPlan bf16, PlanLayout(config, {4, 1, sharding}, cluster));
    ASSERT_GT(f32.all_reduce_s, 0);
    EXPECT_DOUBLE_EQ(bf16.all_gather_s, f32.all_gather_s);
    EXPECT_NEAR(bf16.all_reduce_s - bf16.all_gather_s, (f32.all_reduce_s - f32.all_gather_s) / 2,
                1e-12 * f32.all_reduce_s);
    EXPECT_DOUBLE_EQ(bf16.memory.gradients, f32.memory.gradients * 1.5);
  }
}

TEST(PlanTest, RefusesALayoutTheConfigCannotTake) {
  // 3 does not divide the 4 experts.
  absl::StatusOr<LayoutPlan> plan = PlanLayout(TinyTrainerConfig(""), {1, 3}, RoundCluster());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("num_experts"), std::string::npos)
      << plan.status().message();
}

TEST(PlanTest, AllToAllBytesOfASmallCase) {
  // 2 ranks, E = 4, k = 2, D = 8, 16 tokens a rank, bf16: each token's 2 rows of 8·2 bytes, half of
  // them to the other rank.
  EXPECT_DOUBLE_EQ(AllToAllBytesPerRank(16, 2, 8 * 2, 2), 16 * 2 * 16 / 2);
  EXPECT_DOUBLE_EQ(AllToAllBytesPerRank(16, 2, 8 * 2, 1), 0);

  TrainerConfig config = TinyTrainerConfig("");
  config.model.hidden_size = 8;
  config.model.num_heads = 2;
  config.model.num_kv_heads = 2;
  config.model.moe.num_experts = 4;
  config.model.moe.top_k = 2;
  config.compute_dtype = DType::kBF16;
  config.data.seq_len = 16;
  config.data.batch_size = 2;  // one sequence of 16 tokens a rank
  config.micro_batch_size = 0;
  ASSERT_OK_AND_ASSIGN(LayoutPlan plan, PlanLayout(config, {1, 2}, RoundCluster()));
  // One MoE block, one micro-batch. Forward: the bf16 input rows out, the experts' f32 outputs
  // back; backward: the bf16 output gradients out, the f32 input gradients back.
  const double bf16_exchange = 16 * 2 * (8 * 2) * (2 - 1) / 2.0;
  const double f32_exchange = 16 * 2 * (8 * 4) * (2 - 1) / 2.0;
  EXPECT_DOUBLE_EQ(plan.all_to_all_bytes, 2 * bf16_exchange + 2 * f32_exchange);
  // Intra-node: bytes over 1e9 B/s, one latency per exchange and chunk (2 chunks of 2 experts).
  EXPECT_DOUBLE_EQ(plan.all_to_all_s, (2 * bf16_exchange + 2 * f32_exchange) / 1e9 + 4 * 2 * 1e-6);
  EXPECT_LE(plan.all_to_all_exposed_s, plan.all_to_all_s);
  EXPECT_GT(plan.all_to_all_exposed_s, 0);

  // One rank: nothing leaves it.
  ASSERT_OK_AND_ASSIGN(LayoutPlan single, PlanLayout(config, {2, 1}, RoundCluster()));
  EXPECT_EQ(single.all_to_all_bytes, 0);
  EXPECT_EQ(single.all_to_all_s, 0);
}

TEST(PlanTest, RingAllReduceTime) {
  const LinkSpec link = {1e9, 1e-5};
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e9, 4, link), 2.0 * 3 / 4 * 1e9 / 1e9 + 2 * 3 * 1e-5);
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(1e9, 1, link), 0);
  EXPECT_DOUBLE_EQ(RingAllReduceSeconds(2e6, 2, link), 2.0 * 1 / 2 * 2e6 / 1e9 + 2 * 1e-5);
}

TEST(PlanTest, StepIsComputePlusExposedCommunication) {
  ASSERT_OK_AND_ASSIGN(LayoutPlan plan, PlanLayout(TinyTrainerConfig(""), {2, 2}, RoundCluster()));
  EXPECT_DOUBLE_EQ(plan.step_s,
                   plan.compute_s + plan.all_to_all_exposed_s + plan.all_reduce_exposed_s);
  EXPECT_GT(plan.all_reduce_s, 0);
  EXPECT_LE(plan.all_reduce_exposed_s, plan.all_reduce_s);
  EXPECT_DOUBLE_EQ(plan.tokens_per_s, 8 * 32 / plan.step_s);
  EXPECT_GT(plan.mfu, 0);
  EXPECT_LE(plan.mfu, 1);
}

TEST(PlanTest, SweepScalesWhenComputeDominates) {
  // Links so fast that communication is negligible: strong scaling's step time falls with more
  // GPUs, and weak scaling's tokens/s grows.
  ClusterSpec cluster = RoundCluster();
  cluster.device.dense_bf16_flops = cluster.device.dense_fp8_flops = 1e9;
  cluster.intra_node = cluster.inter_node = {1e18, 1e-15};
  const TrainerConfig config = TinyTrainerConfig("");  // world 1, batch 8, micro-batch 4
  const std::vector<int> gpus = {1, 2, 4, 8};
  const std::vector<SweepPoint> strong = Sweep(config, gpus, Scaling::kStrong, cluster);
  ASSERT_EQ(strong.size(), gpus.size());
  for (size_t i = 0; i < strong.size(); ++i) {
    ASSERT_TRUE(strong[i].best.has_value()) << gpus[i];
    EXPECT_EQ(strong[i].best->layout.gpus(), gpus[i]);
    if (i > 0) {
      EXPECT_LE(strong[i].best->step_s, strong[i - 1].best->step_s) << gpus[i];
    }
    EXPECT_GT(strong[i].efficiency, 0);
  }
  EXPECT_DOUBLE_EQ(strong[0].efficiency, 1.0);
  const std::vector<SweepPoint> weak = Sweep(config, gpus, Scaling::kWeak, cluster);
  for (size_t i = 1; i < weak.size(); ++i) {
    ASSERT_TRUE(weak[i].best.has_value()) << gpus[i];
    EXPECT_GE(weak[i].best->tokens_per_s, weak[i - 1].best->tokens_per_s) << gpus[i];
  }
}

TEST(PlanTest, FastestSkipsWhatDoesNotFit) {
  ClusterSpec cluster = RoundCluster();
  std::vector<LayoutPlan> plans = PlanLayouts(TinyTrainerConfig(""), 4, cluster);
  // ep 1, 2, 4 of 4 experts, each unsharded, with sharded moments and with sharded gradients
  ASSERT_EQ(plans.size(), 9u);
  for (LayoutPlan& plan : plans) plan.fits = false;
  EXPECT_FALSE(Fastest(plans).has_value());
  ASSERT_TRUE(Fastest(plans, /*fitting_only=*/false).has_value());
  plans[3].fits = true;  // ep 2, unsharded
  EXPECT_EQ(Fastest(plans)->layout.expert_parallel, 2);
  EXPECT_EQ(Fastest(plans)->layout.sharding, Sharding::kNone);
}

// The sweep of `moetrain plan --gpus N --sweep ...` starts from the config already moved to N.
TEST(PlanTest, MovingToAGpuCountTwiceIsMovingOnce) {
  TrainerConfig config = TinyTrainerConfig("");  // world 1, batch 8, micro-batch 4
  config.data.batch_size = 64;
  config.micro_batch_size = 16;
  for (Scaling scaling : {Scaling::kWeak, Scaling::kStrong}) {
    ASSERT_OK_AND_ASSIGN(const TrainerConfig once, AtGpuCount(config, 8, scaling));
    ASSERT_OK_AND_ASSIGN(const TrainerConfig two, AtGpuCount(config, 2, scaling));
    ASSERT_OK_AND_ASSIGN(const TrainerConfig twice, AtGpuCount(two, 8, scaling));
    EXPECT_EQ(once.parallel.world_size(), 8);
    EXPECT_EQ(twice.data.batch_size, once.data.batch_size);
    EXPECT_EQ(twice.micro_batch_size, once.micro_batch_size);
  }
  ASSERT_OK_AND_ASSIGN(const TrainerConfig weak, AtGpuCount(config, 8, Scaling::kWeak));
  EXPECT_EQ(weak.data.batch_size, 512);
  EXPECT_EQ(weak.micro_batch_size, 128);
  ASSERT_OK_AND_ASSIGN(const TrainerConfig strong, AtGpuCount(config, 2, Scaling::kStrong));
  EXPECT_EQ(strong.data.batch_size, 64);
  EXPECT_EQ(strong.micro_batch_size, 32);
}

// The largest counts plan without overflow: 2^31 − 1 (a prime) is refused, not looped up to with
// an int counter that wraps to 0 (SIGFPE); kMaxPlanGpus plans its layouts; a per-GPU batch that
// weak scaling would take past int64 is an error naming the field.
TEST(PlanTest, HugeGpuCountsArePlannedOrRefusedWithoutOverflow) {
  const ClusterSpec cluster = RoundCluster();
  TrainerConfig config = TinyTrainerConfig("");  // 4 experts, batch 8
  EXPECT_TRUE(PlanLayouts(config, 2147483647, cluster).empty());
  EXPECT_TRUE(PlanLayouts(config, 0, cluster).empty());
  EXPECT_TRUE(PlanLayouts(config, -4, cluster).empty());
  config.data.batch_size = config.micro_batch_size = kMaxPlanGpus;
  const std::vector<LayoutPlan> plans = PlanLayouts(config, kMaxPlanGpus, cluster);
  ASSERT_EQ(plans.size(), 9u);  // ep 1, 2, 4 of 4 experts, each at the three sharding stages
  EXPECT_EQ(plans[6].layout.expert_parallel, 4);
  EXPECT_EQ(plans[6].layout.sharding, Sharding::kNone);
  EXPECT_EQ(plans[7].layout.sharding, Sharding::kOptimizer);
  EXPECT_EQ(plans[8].layout.sharding, Sharding::kGradients);
  EXPECT_EQ(plans[6].layout.gpus(), kMaxPlanGpus);

  config.data.batch_size = config.micro_batch_size = int64_t{1} << 62;
  const absl::StatusOr<TrainerConfig> overflow = AtGpuCount(config, 8, Scaling::kWeak);
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.status().message().find("train.batch_size"), std::string::npos)
      << overflow.status();
  const std::vector<SweepPoint> points = Sweep(config, {8}, Scaling::kWeak, cluster);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_FALSE(points[0].best.has_value());
}

TEST(PlanTest, SweepShowsTheFastestLayoutWhenNoneFits) {
  ClusterSpec cluster = RoundCluster();
  cluster.device.memory_bytes = 1;  // nothing fits
  const std::vector<SweepPoint> weak =
      Sweep(TinyTrainerConfig(""), {1, 2, 4}, Scaling::kWeak, cluster);
  for (const SweepPoint& point : weak) {
    ASSERT_TRUE(point.best.has_value()) << point.gpus;
    EXPECT_FALSE(point.best->fits);
    ASSERT_OK_AND_ASSIGN(const TrainerConfig at,
                         AtGpuCount(TinyTrainerConfig(""), point.gpus, Scaling::kWeak));
    const std::vector<LayoutPlan> all = PlanLayouts(at, point.gpus, cluster);
    for (const LayoutPlan& plan : all) EXPECT_LE(point.best->step_s, plan.step_s);
    EXPECT_GT(point.efficiency, 0);
  }
  EXPECT_DOUBLE_EQ(weak[0].efficiency, 1.0);
}

}  // namespace
}  // namespace moetrain
