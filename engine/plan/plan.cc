#include "engine/plan/plan.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/dtype.h"
#include "engine/model/transformer.h"
#include "engine/moe/expert_parallel.h"

namespace moetrain {
namespace {

// Passes over the activation memory of the work between the matmuls: written, then read.
constexpr double kActivationPasses = 2;

// Blocks with an MoE FFN: the MoE blocks after the dense ones, and each MTP module's.
double MoeBlocks(const ModelConfig& model) {
  return static_cast<double>(model.num_layers - model.first_dense_layers + model.mtp_depth);
}

// Parameters of every routed expert of every MoE block (gate, up and down: 3·D·F each).
double RoutedExpertParameters(const ModelConfig& model) {
  return MoeBlocks(model) * static_cast<double>(model.moe.num_experts) * 3.0 *
         static_cast<double>(model.hidden_size) * static_cast<double>(model.moe.expert_ffn_dim);
}

// Time of `exchange` seconds of all-to-all cut into `chunks`, pipelined with `compute` seconds of
// expert GEMMs cut the same way: the longer of the two, plus one chunk of the shorter that cannot
// hide (all of it with one chunk). Returns what the exchange adds beyond the compute.
double ExposedExchange(double exchange, double compute, int chunks) {
  const double pipelined =
      std::max(exchange, compute) + std::min(exchange, compute) / static_cast<double>(chunks);
  return pipelined - compute;
}

}  // namespace

FlopsSplit SplitTrainingFlops(const ModelConfig& model, int64_t seq_len) {
  // TrainingFlopsPerToken's attention-core term is proportional to seq_len + 1, so at
  // seq_len = -1 it gives the matmuls alone.
  const double total = TrainingFlopsPerToken(model, seq_len);
  const double matmuls = TrainingFlopsPerToken(model, -1);
  FlopsSplit split;
  split.routed_experts = 6.0 * MoeBlocks(model) * static_cast<double>(model.moe.top_k) * 3.0 *
                         static_cast<double>(model.hidden_size) *
                         static_cast<double>(model.moe.expert_ffn_dim);
  split.dense = matmuls - split.routed_experts;
  split.attention_core = total - matmuls;
  return split;
}

double RingAllReduceSeconds(double bytes, int ranks, const LinkSpec& link) {
  if (ranks <= 1) return 0;
  const double n = static_cast<double>(ranks);
  return 2.0 * (n - 1) / n * bytes / link.bandwidth_bytes_per_s + 2.0 * (n - 1) * link.latency_s;
}

double AllToAllSeconds(double bytes, double messages, const LinkSpec& link) {
  return bytes / link.bandwidth_bytes_per_s + messages * link.latency_s;
}

double AllToAllBytesPerRank(double tokens, int top_k, double row_bytes, int expert_parallel) {
  const double ep = static_cast<double>(expert_parallel);
  return tokens * static_cast<double>(top_k) * row_bytes * (ep - 1) / ep;
}

absl::StatusOr<LayoutPlan> PlanLayout(const TrainerConfig& config, const Layout& layout,
                                      const ClusterSpec& cluster) {
  TrainerConfig at = config;
  at.parallel.data_parallel = layout.data_parallel;
  at.parallel.expert_parallel = layout.expert_parallel;
  at.parallel.sharding = layout.sharding;
  at.recompute = layout.recompute;
  // The memory of the cluster's device (the config is only read: nothing is opened).
  at.device = cluster.device.is_cpu() ? Device::Cpu() : Device::Cuda(0);
  if (absl::Status status = at.parallel.Validate(at.model, at.data.batch_size, at.micro_batch_size);
      !status.ok()) {
    return status;
  }
  const ModelConfig& model = at.model;
  const OpEfficiency& efficiency = cluster.efficiency;
  const DeviceSpec& device = cluster.device;
  const int gpus = layout.gpus();
  const int ep = layout.expert_parallel;
  LayoutPlan plan;
  plan.layout = layout;
  plan.memory = EstimateTrainingMemory(at);
  plan.fits = plan.memory.on_device() <= device.memory_bytes;
  const bool sharded = layout.sharding != Sharding::kNone;
  // Sharded gradients are reduce-scattered every micro-batch, the others once a step.
  const double reductions =
      layout.sharding == Sharding::kGradients ? static_cast<double>(at.micro_batches()) : 1.0;

  // Compute.
  const double micro_batches = static_cast<double>(at.micro_batches());
  const double step_tokens =
      static_cast<double>(at.data.batch_size) * static_cast<double>(at.data.seq_len);
  const double rank_tokens = step_tokens / gpus;
  const FlopsSplit split = SplitTrainingFlops(model, at.data.seq_len);
  const double gemm_peak = at.fp8.has_value() ? device.dense_fp8_flops : device.dense_bf16_flops;
  const double dense_s = rank_tokens * split.dense / (gemm_peak * efficiency.dense_gemm);
  const double experts_s =
      rank_tokens * split.routed_experts / (gemm_peak * efficiency.grouped_gemm);
  const double attention_s =
      rank_tokens * split.attention_core / (device.dense_bf16_flops * efficiency.attention);
  // One f32 grad per parameter the rank holds; two moments per parameter it updates.
  const double rank_parameters = ParameterCount(model, ep);
  const double moment_bytes = static_cast<double>(DTypeSize(at.optimizer.moment_dtype));
  const double updated_parameters = plan.memory.optimizer / (2 * moment_bytes);
  const double optimizer_s = OptimizerBytes(updated_parameters, rank_parameters, moment_bytes) /
                             (device.memory_bandwidth_bytes_per_s * efficiency.memory_bound);
  // The memory-bound work between the matmuls (norms, RoPE, activations, residual adds, the
  // loss's softmax, casts): each activation byte a micro-batch produces (what the rank would hold
  // without recompute) written once in forward and read once in backward.
  TrainerConfig kept = at;
  kept.recompute = Recompute::kNone;
  const double activation_bytes = EstimateTrainingMemory(kept).activations;
  const double elementwise_s = kActivationPasses * activation_bytes * micro_batches /
                               (device.memory_bandwidth_bytes_per_s * efficiency.memory_bound);
  // Recompute, for every block but the last (whose buffers still hold its forward). FULL: the
  // blocks' forward once more: a third of their matmuls (the LM heads' stay once) and another
  // forward pass of the work between them (all of it counted: this errs long). SELECTIVE: the
  // activation bytes it lets go of written once more, and with MLA the up-projections' GEMMs.
  const bool recompute = layout.recompute == Recompute::kFull;
  const double blocks = static_cast<double>(model.num_layers + model.mtp_depth);
  const double again = blocks > 0 ? (blocks - 1) / blocks : 0.0;
  if (recompute) {
    const double lm_heads = 6.0 * static_cast<double>(model.vocab_size) *
                            static_cast<double>(model.hidden_size) *
                            static_cast<double>(1 + model.mtp_depth);
    const double block_dense_s = dense_s * std::max(0.0, split.dense - lm_heads) / split.dense;
    plan.recompute_s = ((block_dense_s + experts_s + attention_s) / 3 + elementwise_s / 2) * again;
  } else if (layout.recompute == Recompute::kSelective) {
    const double dropped = std::max(0.0, activation_bytes - plan.memory.activations);
    plan.recompute_s = elementwise_s / 2 * dropped / std::max(1.0, activation_bytes) * again;
    if (model.is_mla()) {
      const MlaConfig& mla = model.mla;
      const double heads = static_cast<double>(model.num_heads);
      const double query_in =
          static_cast<double>(mla.q_lora_rank > 0 ? mla.q_lora_rank : model.hidden_size);
      const double per_token =
          2.0 * (query_in * heads * static_cast<double>(mla.qk_head_dim()) +
                 static_cast<double>(mla.kv_lora_rank) * heads *
                     static_cast<double>(mla.qk_nope_head_dim + mla.v_head_dim) +
                 static_cast<double>(model.hidden_size * mla.qk_rope_head_dim));
      plan.recompute_s +=
          rank_tokens * blocks * per_token / (gemm_peak * efficiency.dense_gemm) * again;
    }
  }
  plan.dense_gemm_s = dense_s;
  plan.grouped_gemm_s = experts_s;
  plan.attention_s = attention_s;
  plan.elementwise_s = elementwise_s;
  plan.optimizer_s = optimizer_s;
  plan.compute_s =
      dense_s + experts_s + attention_s + elementwise_s + optimizer_s + plan.recompute_s;

  // All-to-all, in the dtypes moe_layer_expert_parallel.cc sends: forward dispatches the input
  // rows (FP8 with fp8_dispatch, else the compute dtype) and combines the experts' f32 outputs;
  // backward sends the compute-dtype output gradients to the experts and the f32 input gradients
  // back.
  if (ep > 1) {
    const LinkSpec& link = ep <= cluster.gpus_per_node ? cluster.intra_node : cluster.inter_node;
    const bool fp8_dispatch = at.fp8.has_value() && at.fp8->fp8_dispatch;
    const double dispatch_row =
        static_cast<double>(DispatchRowBytes(model.hidden_size, at.compute_dtype, fp8_dispatch));
    const double compute_row =
        static_cast<double>(model.hidden_size) * static_cast<double>(DTypeSize(at.compute_dtype));
    const double f32_row = static_cast<double>(model.hidden_size) * 4.0;
    const int chunks = static_cast<int>(
        std::min<int64_t>(at.parallel.overlap_chunks == 0 ? 2 : at.parallel.overlap_chunks,
                          model.moe.num_experts / ep));
    const double exchanges = MoeBlocks(model) * micro_batches;
    const double micro_tokens = rank_tokens / micro_batches;
    // `share` of the exchanges (the recomputed forwards run all but one MoE block's again).
    const auto seconds = [&](double row_bytes, double share = 1.0) {
      const double bytes =
          share * exchanges * AllToAllBytesPerRank(micro_tokens, model.moe.top_k, row_bytes, ep);
      plan.all_to_all_bytes += bytes;
      return AllToAllSeconds(bytes, share * exchanges * chunks, link);
    };
    const double forward_s = seconds(dispatch_row) + seconds(f32_row);
    const double backward_s = seconds(compute_row) + seconds(f32_row);
    plan.all_to_all_s = forward_s + backward_s;
    // Backward's expert GEMMs are twice forward's.
    plan.all_to_all_exposed_s = ExposedExchange(forward_s, experts_s / 3, chunks) +
                                ExposedExchange(backward_s, experts_s * 2 / 3, chunks);
    if (recompute) {  // the recomputed forwards' exchanges: every MoE block's but the last's
      const double share = (MoeBlocks(model) - 1) / MoeBlocks(model);
      const double again_s = seconds(dispatch_row, share) + seconds(f32_row, share);
      plan.all_to_all_s += again_s;
      plan.all_to_all_exposed_s += ExposedExchange(again_s, experts_s / 3 * share, chunks);
    }
  }

  // Gradient all-reduce. The expert-data group's replicas sit ep ranks apart, so both groups
  // leave the node as soon as the world does. The dense and expert all-reduces run side by side
  // over the same links, so their times add.
  const LinkSpec& world_link =
      gpus <= cluster.gpus_per_node ? cluster.intra_node : cluster.inter_node;
  const double expert_parameters = RoutedExpertParameters(model) / ep;
  const double dense_bytes = 4.0 * (rank_parameters - expert_parameters);
  const double expert_bytes = 4.0 * expert_parameters;
  // The grads travel in parallel.grad_reduce_dtype, the sharded weights' all-gather in f32.
  const double grad_share = static_cast<double>(DTypeSize(at.parallel.grad_reduce_dtype)) / 4.0;
  const auto ring_s = [&](double share) {
    return RingAllReduceSeconds(dense_bytes * share, gpus, world_link) +
           RingAllReduceSeconds(expert_bytes * share, layout.data_parallel, world_link);
  };
  plan.all_reduce_s = ring_s(grad_share);
  if (plan.all_reduce_s > 0) {
    // Sharded: the grads' reduce-scatter (half a ring) runs under backward (every micro-batch's
    // with GRADIENTS), the weights' all-gather (the other half) after the optimizer.
    if (sharded) {
      plan.all_gather_s = ring_s(1.0) / 2;
      plan.all_reduce_s = plan.all_reduce_s / 2 * reductions + plan.all_gather_s;
    }
    // Each reduction hides under its micro-batch's backward but for its last bucket.
    const double reduction_s = (plan.all_reduce_s - plan.all_gather_s) / reductions;
    const double backward_s =
        ((dense_s + experts_s + attention_s) * 2 / 3 + plan.recompute_s) / micro_batches;
    const double last_bucket = std::min(
        1.0, static_cast<double>(at.parallel.grad_bucket_bytes) / (dense_bytes + expert_bytes));
    plan.all_reduce_exposed_s =
        plan.all_gather_s +
        reductions * std::min(reduction_s,
                              std::max(0.0, reduction_s - backward_s) + reduction_s * last_bucket);
  }

  plan.step_s = plan.compute_s + plan.all_to_all_exposed_s + plan.all_reduce_exposed_s;
  plan.tokens_per_s = step_tokens / plan.step_s;
  // Against the GEMMs' peak (FP8's with a recipe), the highest any op here runs at.
  plan.mfu = split.total() * step_tokens / (plan.step_s * gemm_peak * gpus);
  return plan;
}

std::vector<LayoutPlan> PlanLayouts(const TrainerConfig& config, int gpus,
                                    const ClusterSpec& cluster) {
  std::vector<LayoutPlan> plans;
  if (gpus < 1 || gpus > kMaxPlanGpus) return plans;
  // The divisors in pairs (small, gpus / small), small ≤ √gpus: O(√gpus) steps, and no counter
  // that could pass INT_MAX.
  std::vector<int> eps;
  for (int small = 1; small <= gpus / small; ++small) {
    if (gpus % small != 0) continue;
    eps.push_back(small);
    if (small != gpus / small) eps.push_back(gpus / small);
  }
  std::sort(eps.begin(), eps.end());
  for (int ep : eps) {
    for (Sharding sharding : {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients}) {
      if (sharding != Sharding::kNone && gpus == 1) continue;  // no replicas to shard over
      absl::StatusOr<LayoutPlan> plan =
          PlanLayout(config, {gpus / ep, ep, sharding, config.recompute}, cluster);
      // Where the spec's recompute does not fit: the cheaper recompute that does, selective first.
      for (const Recompute more : {Recompute::kSelective, Recompute::kFull}) {
        if (!plan.ok() || plan->fits || more <= config.recompute) continue;
        absl::StatusOr<LayoutPlan> recomputed =
            PlanLayout(config, {gpus / ep, ep, sharding, more}, cluster);
        if (recomputed.ok() && recomputed->fits) plan = recomputed;
      }
      if (plan.ok()) plans.push_back(*plan);
    }
  }
  return plans;
}

std::optional<LayoutPlan> Fastest(const std::vector<LayoutPlan>& plans, bool fitting_only) {
  std::optional<LayoutPlan> best;
  for (const LayoutPlan& plan : plans) {
    if ((plan.fits || !fitting_only) && (!best.has_value() || plan.step_s < best->step_s)) {
      best = plan;
    }
  }
  return best;
}

absl::StatusOr<TrainerConfig> AtGpuCount(const TrainerConfig& config, int gpus, Scaling scaling) {
  const int64_t world = config.parallel.world_size();
  const int64_t micro =
      config.micro_batch_size > 0 ? config.micro_batch_size : config.data.batch_size;
  TrainerConfig at = config;
  if (scaling == Scaling::kWeak &&
      __builtin_mul_overflow(config.data.batch_size / world, int64_t{gpus}, &at.data.batch_size)) {
    return absl::InvalidArgumentError(absl::StrCat("train.batch_size = ", config.data.batch_size,
                                                   " over ", world, " ranks, kept per GPU at ",
                                                   gpus, " GPUs, overflows int64"));
  }
  // At most the batch, so that the product may saturate instead of overflowing.
  int64_t micro_at_gpus = 0;
  if (__builtin_mul_overflow(micro / world, int64_t{gpus}, &micro_at_gpus)) {
    micro_at_gpus = at.data.batch_size;
  }
  at.micro_batch_size = std::min<int64_t>(micro_at_gpus, at.data.batch_size);
  // A world of `gpus` (PlanLayout sets the layout), so that the config moves on from here.
  at.parallel.data_parallel = gpus;
  at.parallel.expert_parallel = 1;
  return at;
}

std::vector<SweepPoint> Sweep(const TrainerConfig& config, const std::vector<int>& gpu_counts,
                              Scaling scaling, const ClusterSpec& cluster) {
  std::vector<SweepPoint> points;
  std::optional<SweepPoint> first;  // the first point with a plan
  for (int gpus : gpu_counts) {
    SweepPoint point;
    point.gpus = gpus;
    const absl::StatusOr<TrainerConfig> at = AtGpuCount(config, gpus, scaling);
    const std::vector<LayoutPlan> plans =
        at.ok() ? PlanLayouts(*at, gpus, cluster) : std::vector<LayoutPlan>();
    point.best = Fastest(plans);
    if (!point.best.has_value()) point.best = Fastest(plans, /*fitting_only=*/false);
    if (point.best.has_value()) {
      if (!first.has_value()) first = point;
      const LayoutPlan& base = *first->best;
      point.efficiency = scaling == Scaling::kWeak
                             ? (point.best->tokens_per_s / gpus) / (base.tokens_per_s / first->gpus)
                             : (base.step_s * first->gpus) / (point.best->step_s * gpus);
    }
    points.push_back(point);
  }
  return points;
}

}  // namespace moetrain
