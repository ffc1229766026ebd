// `moetrain plan`: one rank's memory, the step time and where it goes, for a training config at a
// data-parallel × expert-parallel layout on a cluster (cluster.h); and the sweep over GPU counts
// that gives weak- and strong-scaling efficiency.
//
// Memory is EstimateTrainingMemory's (engine/train/memory_estimate.h) for the config at the
// layout. Step time, per rank (every rank does the same work):
//   compute      model FLOPs of the rank's tokens, split into dense GEMMs, the routed experts'
//                grouped GEMMs and the attention core, each over (peak × the cluster's
//                efficiency for that class); the peak is FP8's for the GEMMs when an FP8 recipe
//                is on, else BF16's. Plus the AdamW update, memory-bound.
//   all-to-all   per MoE layer and micro-batch: dispatch and combine forward, and their mirrors
//                backward; tokens × top_k rows × the fraction (ep − 1)/ep that leaves the rank,
//                each row in the dtype the MoE layer sends it in (the combines' rows are f32).
//                Over the intra-node link when the expert group fits in a node, else inter-node.
//   all-reduce   ring, 2(n − 1)/n × bytes / bandwidth + 2(n − 1) × latency: the dense grads
//                over the world, the local experts' over their dp replicas, in
//                parallel.grad_reduce_dtype (f32 or bf16). With a sharded optimizer
//                (Layout::sharding) it is the grads' reduce-scatter (half a ring) and the
//                updated f32 weights' all-gather (half a ring of f32) after the optimizer, which
//                nothing overlaps; AdamW then updates the rank's share of the parameters only.
//                With sharded gradients (GRADIENTS) the reduce-scatter runs every micro-batch,
//                each under its own backward.
//   recompute    with train.recompute = FULL (Layout::recompute): the blocks' forward once more in
//                backward, all but the last block's (a third of their matmuls, not the LM head's;
//                another forward pass of the work between them; another forward all-to-all), and
//                one block's activations held instead of all (EstimateTrainingMemory).
// Overlap, as the trainer does it: each MoE layer's exchange is cut into chunks
// (ParallelConfig::overlap_chunks) and one chunk's all-to-all runs under another's expert GEMMs
// (moe_layer.h; the shared experts, which also hide the first dispatch, are not counted there, so
// the exposed exchange errs long); the gradient all-reduces run in buckets under the last
// micro-batch's backward (grad_sync.h), the dense and the expert ones side by side, so only the
// last bucket and what outlasts that backward add to the step.
#ifndef MOETRAIN_ENGINE_PLAN_PLAN_H_
#define MOETRAIN_ENGINE_PLAN_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/plan/cluster.h"
#include "engine/train/memory_estimate.h"
#include "engine/train/trainer.h"

namespace moetrain {

// Bytes the optimizer phase moves for a rank that updates `updated` of the `held` parameters it
// holds, with moments of `moment_bytes` (4 for f32, 2 for bf16): AdamW reads the f32 master and
// grad and writes the master (12 an updated parameter) and reads and writes the two moments
// (4·moment_bytes); the bf16 copy of every held parameter is written (2). Unsharded with f32
// moments: 30 bytes a parameter.
inline double OptimizerBytes(double updated, double held, double moment_bytes) {
  return updated * (12 + 4 * moment_bytes) + held * 2;
}

// The most GPUs a plan is made for: one a rank, as many as a job can have (kMaxRanks).
inline constexpr int kMaxPlanGpus = kMaxRanks;

struct Layout {
  int data_parallel = 1;
  int expert_parallel = 1;
  Sharding sharding = Sharding::kNone;     // parallel.sharding
  Recompute recompute = Recompute::kNone;  // train.recompute
  int gpus() const { return data_parallel * expert_parallel; }
};

// Model FLOPs of one training token (TrainingFlopsPerToken), by op class.
struct FlopsSplit {
  double dense = 0;  // every matmul but the routed experts'
  double routed_experts = 0;
  double attention_core = 0;
  double total() const { return dense + routed_experts + attention_core; }
};
FlopsSplit SplitTrainingFlops(const ModelConfig& model, int64_t seq_len);

// Seconds of a ring all-reduce of `bytes` over `ranks` on `link` (0 for one rank).
double RingAllReduceSeconds(double bytes, int ranks, const LinkSpec& link);

// Seconds of all-to-all traffic of which one rank sends `bytes` to its peers, in `messages`
// exchanges: bytes / bandwidth + messages × latency.
double AllToAllSeconds(double bytes, double messages, const LinkSpec& link);

// Bytes one rank sends in one all-to-all of `tokens` of its tokens, each to top_k experts spread
// evenly over `expert_parallel` ranks, at `row_bytes` a row: tokens·k·row_bytes·(ep − 1)/ep.
double AllToAllBytesPerRank(double tokens, int top_k, double row_bytes, int expert_parallel);

struct LayoutPlan {
  Layout layout;
  MemoryEstimate memory;  // one rank
  bool fits = false;      // memory.on_device() ≤ the device's memory
  // Seconds per optimizer step, one rank.
  double compute_s = 0;  // the six parts below
  double dense_gemm_s = 0;
  double grouped_gemm_s = 0;  // the routed experts
  double attention_s = 0;     // the attention core
  double elementwise_s = 0;   // the memory-bound work between the matmuls
  double optimizer_s = 0;
  double recompute_s = 0;           // the blocks' forward again (Layout::recompute; 0 without)
  double all_to_all_s = 0;          // the whole exchange, before overlap
  double all_to_all_exposed_s = 0;  // what it adds to the step
  // The data-parallel sums of the dense and expert grads, before overlap (sharded: the
  // reduce-scatter and the weights' all-gather), and what they add to the step.
  double all_reduce_s = 0;
  double all_reduce_exposed_s = 0;
  double all_gather_s = 0;      // sharded: the weights' all-gather, a part of both figures above
  double all_to_all_bytes = 0;  // sent by one rank per step
  double step_s = 0;            // compute + the exposed communication
  double tokens_per_s = 0;      // all ranks
  double mfu = 0;               // model FLOPs / (step × BF16 peak × GPUs)
  double all_to_all_share() const { return all_to_all_exposed_s / step_s; }
  double all_reduce_share() const { return all_reduce_exposed_s / step_s; }
};

// `config` (valid; its batch and micro-batch are global) run at `layout`: InvalidArgument naming
// the field when the layout does not fit the config (ParallelConfig::Validate).
absl::StatusOr<LayoutPlan> PlanLayout(const TrainerConfig& config, const Layout& layout,
                                      const ClusterSpec& cluster);

// Every dp × ep layout of `gpus` GPUs that the config allows, each planned unsharded and (with
// more than one GPU) with the optimizer sharded, by ep ascending; none for a count outside
// [1, kMaxPlanGpus]. Each with the config's recompute, or with FULL when only that fits (recompute
// only costs time; a layout that fits neither way keeps the config's, the time its step would take
// with the memory to hold it).
std::vector<LayoutPlan> PlanLayouts(const TrainerConfig& config, int gpus,
                                    const ClusterSpec& cluster);

// The fastest of `plans` that fits (of all of them, with `fitting_only` false); nullopt when none
// does (or `plans` is empty).
std::optional<LayoutPlan> Fastest(const std::vector<LayoutPlan>& plans, bool fitting_only = true);

enum class Scaling { kWeak, kStrong };

struct SweepPoint {
  int gpus = 0;
  // The fastest layout that fits; when none fits, the fastest of all (best->fits is false: the
  // time the step would take with memory to hold it). nullopt: no layout is valid.
  std::optional<LayoutPlan> best;
  double efficiency = 0;  // against the first point with a plan; 0 without one
};

// `config` (at its world size) moved to `gpus` GPUs: the per-GPU micro-batch stays (capped at the
// batch); weak scaling keeps the per-GPU batch, strong scaling the global batch. The result's
// world is `gpus` (dp = gpus, ep = 1; PlanLayout sets the layout it plans). InvalidArgument
// naming train.batch_size when weak scaling's batch would overflow int64.
absl::StatusOr<TrainerConfig> AtGpuCount(const TrainerConfig& config, int gpus, Scaling scaling);

// `config` at each of `gpu_counts` (ascending), moved there by AtGpuCount. Weak efficiency:
// tokens/s per GPU over the first point's; strong: (first step time × its GPUs) / (step time ×
// GPUs). The first point is the first with a plan.
std::vector<SweepPoint> Sweep(const TrainerConfig& config, const std::vector<int>& gpu_counts,
                              Scaling scaling, const ClusterSpec& cluster);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_PLAN_PLAN_H_
