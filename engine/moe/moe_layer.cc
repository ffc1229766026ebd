#include "engine/moe/moe_layer.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/swiglu/swiglu.h"

namespace moetrain {

MoeLayer::MoeLayer(const MoeConfig& config, int64_t hidden_size, DType dtype,
                   const ExpertParallelConfig& parallel, const ExecContext& ctx)
    : config_(config),
      hidden_size_(hidden_size),
      dtype_(dtype),
      parallel_(parallel),
      ctx_(ctx),
      num_local_experts_(config.num_experts),
      first_local_expert_(0),
      experts_gate_up_(ctx),
      experts_down_(ctx),
      shared_gate_up_proj_(ctx),
      shared_down_proj_(ctx),
      workspace_(kNumKept, ctx.allocator()),
      scratch_(kNumScratch, ctx.allocator()) {
  const int ep = parallel.expert_group != nullptr ? parallel.expert_group->size() : 1;
  if (ep > 1) {
    num_local_experts_ = config.num_experts / ep;
    first_local_expert_ = parallel.expert_group->rank() * num_local_experts_;
    expert_parallel_ = true;
    num_chunks_ = static_cast<int>(std::min<int64_t>(
        parallel.overlap_chunks == 0 ? 2 : parallel.overlap_chunks, num_local_experts_));
  }
}

absl::StatusOr<MoeLayer> MoeLayer::Create(const MoeConfig& config, int64_t hidden_size,
                                          DType compute_dtype, const ExpertParallelConfig& parallel,
                                          const ExecContext& ctx, Fp8State* fp8,
                                          const std::string& name) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  if (hidden_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.hidden_size = ", hidden_size, " must be at least 1"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckComputeDType(compute_dtype, "the MoE layer's compute dtype"));
  if (parallel.overlap_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert parallel overlap_chunks = ", parallel.overlap_chunks, " must be at least 0"));
  }
  if (parallel.expert_group != nullptr && config.num_experts % parallel.expert_group->size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.moe.num_experts = ", config.num_experts,
        " is not divisible by parallel.expert_parallel = ", parallel.expert_group->size()));
  }
  MoeLayer layer(config, hidden_size, compute_dtype, parallel, ctx);
  if (fp8 != nullptr) {
    layer.fp8_ = fp8;
    const int64_t e = config.num_experts;
    layer.experts_gate_up_ =
        GroupedLinear(ctx, fp8, fp8->Register(name + ".experts.gate_up_proj", e));
    layer.experts_down_ = GroupedLinear(ctx, fp8, fp8->Register(name + ".experts.down_proj", e));
    if (config.num_shared_experts > 0) {
      layer.shared_gate_up_proj_ =
          Linear(ctx, fp8, fp8->Register(name + ".shared_experts.gate_up_proj", 1));
      layer.shared_down_proj_ =
          Linear(ctx, fp8, fp8->Register(name + ".shared_experts.down_proj", 1));
    }
  }
  return layer;
}

namespace {

// `local`: the routed experts held here (L).
absl::Status CheckWeights(const MoeConfig& config, int64_t local, int64_t d, DType dtype,
                          const MoeWeights& w) {
  const int64_t e = config.num_experts, f = config.expert_ffn_dim;
  const int64_t sf = config.num_shared_experts * f;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.router, "weights.router", DType::kF32, {e, d}));
  if (config.expert_bias) {
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.expert_bias, "weights.expert_bias", DType::kF32, {e}));
  }
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(w.expert_gate_up, "weights.expert_gate_up", dtype, {local, 2 * f, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.expert_down, "weights.expert_down", dtype, {local, d, f}));
  if (sf > 0) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(w.shared_gate_up, "weights.shared_gate_up", dtype, {2 * sf, d}));
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.shared_down, "weights.shared_down", dtype, {d, sf}));
  }
  return absl::OkStatus();
}

absl::Status CheckGrads(const MoeConfig& config, int64_t local, int64_t d, const MoeGrads& g) {
  const int64_t e = config.num_experts, f = config.expert_ffn_dim;
  const int64_t sf = config.num_shared_experts * f;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(g.router, "grads.router", DType::kF32, {e, d}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(g.expert_gate_up, "grads.expert_gate_up", DType::kF32, {local, 2 * f, d}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(g.expert_down, "grads.expert_down", DType::kF32, {local, d, f}));
  if (sf > 0) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(g.shared_gate_up, "grads.shared_gate_up", DType::kF32, {2 * sf, d}));
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(g.shared_down, "grads.shared_down", DType::kF32, {d, sf}));
  }
  return absl::OkStatus();
}

// Whether the switch aux loss's f_e counts the pairs of every rank of the count group.
bool UsesGroupCounts(const MoeConfig& config, const ExpertParallelConfig& parallel) {
  return parallel.count_group != nullptr && config.aux_loss == AuxLossType::kSwitch &&
         config.aux_loss_coeff > 0.0f;
}

// `offsets` relative to their first row.
std::vector<int64_t> Relative(absl::Span<const int64_t> offsets) {
  std::vector<int64_t> relative(offsets.begin(), offsets.end());
  for (int64_t& row : relative) row -= offsets.front();
  return relative;
}

}  // namespace

absl::Status MoeLayer::RoutedExpertsForward(const MoeWeights& weights, TensorView rows_x,
                                            int64_t first, int64_t last,
                                            absl::Span<const int64_t> offsets) {
  const int64_t begin = offsets.front(), end = offsets.back();
  const std::vector<int64_t> relative = Relative(offsets);
  const TensorView gate_up = gate_up_.Slice(begin, end), activated = activated_.Slice(begin, end);
  const int64_t first_group = first_local_expert_ + first;
  MOETRAIN_RETURN_IF_ERROR(experts_gate_up_.Forward(rows_x.Slice(begin, end),
                                                    weights.expert_gate_up.Slice(first, last),
                                                    relative, first_group, gate_up));
  MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, gate_up, activated));
  return experts_down_.Forward(activated, weights.expert_down.Slice(first, last), relative,
                               first_group, expert_out_.Slice(begin, end));
}

absl::Status MoeLayer::RoutedExpertsBackward(const MoeWeights& weights, TensorView rows_x,
                                             TensorView d_rows_out, int64_t first, int64_t last,
                                             absl::Span<const int64_t> offsets, TensorView d_rows_x,
                                             MoeGrads* grads) {
  const int64_t f = config_.expert_ffn_dim, begin = offsets.front(), end = offsets.back();
  const std::vector<int64_t> relative = Relative(offsets);
  const TensorView x = rows_x.Slice(begin, end), d_out = d_rows_out.Slice(begin, end);
  const TensorView w_gate_up = weights.expert_gate_up.Slice(first, last);
  const TensorView w_down = weights.expert_down.Slice(first, last);
  const int64_t total = gate_up_.dim(0);

  // Down projection, SwiGLU, gate/up projection.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_activated,
                            scratch_.Get(kDActivated, DType::kF32, {total, f}));
  d_activated = d_activated.Slice(begin, end);
  const int64_t first_group = first_local_expert_ + first;
  MOETRAIN_RETURN_IF_ERROR(
      experts_down_.BackwardData(d_out, w_down, relative, first_group, d_activated));
  MOETRAIN_RETURN_IF_ERROR(
      experts_down_.BackwardWeight(d_out, activated_.Slice(begin, end), relative, first_group,
                                   grads->expert_down.Slice(first, last), /*accumulate=*/true));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_gate_up, scratch_.Get(kDGateUp, dtype_, {total, 2 * f}));
  d_gate_up = d_gate_up.Slice(begin, end);
  MOETRAIN_RETURN_IF_ERROR(
      ops::SwigluBackward(ctx_, gate_up_.Slice(begin, end), d_activated, d_gate_up));
  MOETRAIN_RETURN_IF_ERROR(experts_gate_up_.BackwardData(d_gate_up, w_gate_up, relative,
                                                         first_group, d_rows_x.Slice(begin, end)));
  return experts_gate_up_.BackwardWeight(d_gate_up, x, relative, first_group,
                                         grads->expert_gate_up.Slice(first, last),
                                         /*accumulate=*/true);
}

absl::StatusOr<TensorView> MoeLayer::SharedExpertsForward(const MoeWeights& weights) {
  const int64_t t = x_.dim(0), d = hidden_size_;
  const int64_t sf = config_.num_shared_experts * config_.expert_ffn_dim;
  if (sf == 0) return TensorView();
  MOETRAIN_ASSIGN_OR_RETURN(shared_gate_up_,
                            workspace_.Get(kSharedGateUp, DType::kF32, {t, 2 * sf}));
  MOETRAIN_RETURN_IF_ERROR(
      shared_gate_up_proj_.Forward(x_, weights.shared_gate_up, shared_gate_up_));
  MOETRAIN_ASSIGN_OR_RETURN(shared_activated_, scratch_.Get(kSharedActivated, dtype_, {t, sf}));
  MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, shared_gate_up_, shared_activated_));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView shared_out, scratch_.Get(kSharedOut, DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      shared_down_proj_.Forward(shared_activated_, weights.shared_down, shared_out));
  return shared_out;
}

absl::StatusOr<TensorView> MoeLayer::SharedExpertsBackward(const MoeWeights& weights,
                                                           TensorView d_out, MoeGrads* grads) {
  const int64_t t = x_.dim(0), d = hidden_size_;
  const int64_t sf = config_.num_shared_experts * config_.expert_ffn_dim;
  if (sf == 0) return TensorView();
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_shared_activated,
                            scratch_.Get(kDSharedActivated, DType::kF32, {t, sf}));
  MOETRAIN_RETURN_IF_ERROR(
      shared_down_proj_.BackwardData(d_out, weights.shared_down, d_shared_activated));
  MOETRAIN_RETURN_IF_ERROR(
      shared_down_proj_.BackwardWeight(d_out, shared_activated_, grads->shared_down));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_shared_gate_up,
                            scratch_.Get(kDSharedGateUp, dtype_, {t, 2 * sf}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::SwigluBackward(ctx_, shared_gate_up_, d_shared_activated, d_shared_gate_up));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_x_shared, scratch_.Get(kDXShared, DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(
      shared_gate_up_proj_.BackwardData(d_shared_gate_up, weights.shared_gate_up, d_x_shared));
  MOETRAIN_RETURN_IF_ERROR(
      shared_gate_up_proj_.BackwardWeight(d_shared_gate_up, x_, grads->shared_gate_up));
  return d_x_shared;
}

absl::StatusOr<TensorView> MoeLayer::RouterBackwardPart(const MoeWeights& weights,
                                                        TensorView d_weights, MoeGrads* grads,
                                                        float loss_weight) {
  const int64_t t = x_.dim(0), d = hidden_size_, e = config_.num_experts;
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_logits, scratch_.Get(kDLogits, DType::kF32, {t, e}));
  const ops::RouterArgs router_args = {logits_, weights.expert_bias, tokens_per_sequence_};
  MOETRAIN_RETURN_IF_ERROR(
      ops::RouterBackward(ctx_, config_, router_args, routing_, d_weights, d_logits, loss_weight));
  MOETRAIN_RETURN_IF_ERROR(ops::Gemm(ctx_, {.a = d_logits,
                                            .b = router_input_,
                                            .c = grads->router,
                                            .trans_a = true,
                                            .accumulate = true}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_x_router, scratch_.Get(kDXRouter, DType::kF32, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(ops::Gemm(ctx_, {.a = d_logits, .b = weights.router, .c = d_x_router}));
  return d_x_router;
}

absl::Status MoeLayer::Route(const MoeWeights& weights, bool rerun) {
  const int64_t t = x_.dim(0), d = hidden_size_, e = config_.num_experts;
  // Router, in f32.
  if (dtype_ == DType::kF32) {
    router_input_ = x_;
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(router_input_, scratch_.Get(kRouterInput, DType::kF32, {t, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, x_, router_input_));
  }
  MOETRAIN_ASSIGN_OR_RETURN(logits_, workspace_.Get(kLogits, DType::kF32, {t, e}));
  MOETRAIN_RETURN_IF_ERROR(
      ops::Gemm(ctx_, {.a = router_input_, .b = weights.router, .c = logits_, .trans_b = true}));
  if (rerun) return absl::OkStatus();
  const ops::RouterArgs router_args = {logits_, weights.expert_bias, tokens_per_sequence_};
  MOETRAIN_RETURN_IF_ERROR(ops::RouterForward(ctx_, config_, router_args, &routing_));
  if (UsesGroupCounts(config_, parallel_)) {
    // f_e counts the pairs (and tokens) of every rank of the count group. The all-reduce reads the
    // counts RouterForward wrote (Wait then orders RouterAuxLoss after it).
    if (!parallel_.count_group->orders_after_device_work()) {
      MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
    }
    MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<CommRequest> request,
                              parallel_.count_group->StartAllReduceSum(
                                  routing_.aux_counts.view().raw(), e + 1, DType::kI64));
    MOETRAIN_RETURN_IF_ERROR(request->Wait());
  }
  MOETRAIN_RETURN_IF_ERROR(ops::RouterAuxLoss(ctx_, config_, router_args, &routing_));
  return ReadRoutingOnHost();
}

absl::Status MoeLayer::ReadRoutingOnHost() {
  const int64_t e = config_.num_experts;
  host_counts_.resize(e);
  MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx_, routing_.tokens_per_expert,
                                           TensorView(host_counts_.data(), DType::kI64, {e})));
  return ops::CopyTensor(ctx_, routing_.losses, TensorView(host_losses_, DType::kF32, {2}));
}

int64_t MoeLayer::routing_bytes() const {
  int64_t bytes = 0;
  for (const Tensor* t :
       {&routing_.scores, &routing_.topk_experts, &routing_.topk_weights,
        &routing_.tokens_per_expert, &routing_.aux_counts, &routing_.losses,
        &permutation_.expert_offsets, &permutation_.row_token, &permutation_.pair_row}) {
    if (!t->empty()) bytes += t->numel() * static_cast<int64_t>(DTypeSize(t->dtype()));
  }
  return bytes;
}

absl::Status MoeLayer::Forward(const MoeWeights& weights, TensorView x, int64_t tokens_per_sequence,
                               TensorView out, MoeStats* stats, bool rerun) {
  // A failed Forward leaves nothing for Backward to use.
  has_forward_ = false;
  if (rerun && (!has_routing_ || stats != nullptr || x.dim(0) != x_.dim(0))) {
    return absl::FailedPreconditionError(
        "MoeLayer::Forward: a rerun needs the routing of a Forward on as many tokens, and reports "
        "no statistics");
  }
  if (!rerun) has_routing_ = false;
  const int64_t d = hidden_size_, e = config_.num_experts, f = config_.expert_ffn_dim;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(x, "x", dtype_, {-1, d}));
  const int64_t t = x.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(out, "out", dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckWeights(config_, num_local_experts_, d, dtype_, weights));
  if (!x.is_contiguous() || !out.is_contiguous()) {
    return absl::InvalidArgumentError("x and out must be contiguous");
  }
  x_ = x;
  tokens_per_sequence_ = tokens_per_sequence;
  MOETRAIN_RETURN_IF_ERROR(Route(weights, rerun));

  if (expert_parallel_) {
    MOETRAIN_RETURN_IF_ERROR(ForwardExpertParallel(weights, out, rerun));
  } else {
    // Routed experts over the permuted rows: one contiguous block per expert, laid out as the
    // host plans it from the counts.
    if (!rerun) {
      offsets_ = ops::PermutedExpertOffsets(config_, t, host_counts_);
      MOETRAIN_RETURN_IF_ERROR(ops::BuildPermutation(ctx_, config_,
                                                     {.topk_experts = routing_.topk_experts,
                                                      .topk_weights = routing_.topk_weights,
                                                      .expert_offsets = offsets_},
                                                     &permutation_));
      has_routing_ = true;
    }
    const int64_t r = offsets_.back();
    dropped_ = t * config_.top_k - r;
    MOETRAIN_ASSIGN_OR_RETURN(permuted_x_, workspace_.Get(kPermutedX, dtype_, {r, d}));
    MOETRAIN_RETURN_IF_ERROR(ops::GatherRows(ctx_, x, permutation_.row_token, permuted_x_));
    MOETRAIN_ASSIGN_OR_RETURN(gate_up_, workspace_.Get(kGateUp, DType::kF32, {r, 2 * f}));
    MOETRAIN_ASSIGN_OR_RETURN(activated_, scratch_.Get(kActivated, dtype_, {r, f}));
    MOETRAIN_ASSIGN_OR_RETURN(expert_out_, workspace_.Get(kExpertOut, DType::kF32, {r, d}));
    MOETRAIN_RETURN_IF_ERROR(RoutedExpertsForward(weights, permuted_x_, 0, e, offsets_));
    // Shared experts see every token.
    MOETRAIN_ASSIGN_OR_RETURN(const TensorView shared_out, SharedExpertsForward(weights));
    MOETRAIN_RETURN_IF_ERROR(ops::CombineRows(ctx_, expert_out_, permutation_.pair_row,
                                              routing_.topk_weights, shared_out, out));
  }

  has_forward_ = true;
  if (stats != nullptr) {
    stats->tokens_per_expert = host_counts_;
    stats->dropped_tokens = dropped_;
    stats->aux_loss = host_losses_[0];
    stats->z_loss = host_losses_[1];
    const int64_t max_load = *std::max_element(host_counts_.begin(), host_counts_.end());
    const double mean_load = static_cast<double>(t * config_.top_k) / static_cast<double>(e);
    stats->max_mean_load_ratio = t > 0 ? static_cast<float>(max_load / mean_load) : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::ShareWorkspaceOf(const MoeLayer& other) {
  MOETRAIN_RETURN_IF_ERROR(workspace_.ShareSlotsOf(other.workspace_));
  return scratch_.ShareSlotsOf(other.scratch_);
}

absl::Status MoeLayer::Recompute(TensorView x) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("MoeLayer::Recompute needs a successful Forward first");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(x, "x", dtype_, {x_.dim(0), hidden_size_}));
  if (!x.is_contiguous()) return absl::InvalidArgumentError("x must be contiguous");
  has_forward_ = false;
  x_ = x;
  const int64_t t = x_.dim(0), f = config_.expert_ffn_dim;
  if (dtype_ == DType::kF32) {
    router_input_ = x_;
  } else {
    MOETRAIN_ASSIGN_OR_RETURN(router_input_,
                              scratch_.Get(kRouterInput, DType::kF32, {t, hidden_size_}));
    MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, x_, router_input_));
  }
  // SwiGLU is row by row: over all rows at once it gives each row what Forward's blocks gave.
  MOETRAIN_ASSIGN_OR_RETURN(activated_, scratch_.Get(kActivated, dtype_, {gate_up_.dim(0), f}));
  MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, gate_up_, activated_));
  if (config_.num_shared_experts > 0) {
    MOETRAIN_ASSIGN_OR_RETURN(shared_activated_, scratch_.Get(kSharedActivated, dtype_,
                                                              {t, config_.num_shared_experts * f}));
    MOETRAIN_RETURN_IF_ERROR(ops::SwigluForward(ctx_, shared_gate_up_, shared_activated_));
  }
  has_forward_ = true;
  return absl::OkStatus();
}

absl::Status MoeLayer::Backward(const MoeWeights& weights, TensorView d_out, TensorView d_x,
                                MoeGrads* grads, float loss_weight) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("MoeLayer::Backward needs a successful Forward first");
  }
  const int64_t d = hidden_size_, e = config_.num_experts;
  const int64_t t = x_.dim(0), k = config_.top_k;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_out, "d_out", dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_x, "d_x", dtype_, {t, d}));
  if (!d_out.is_contiguous() || !d_x.is_contiguous()) {
    return absl::InvalidArgumentError("d_out and d_x must be contiguous");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckWeights(config_, num_local_experts_, d, dtype_, weights));
  if (grads == nullptr) return absl::InvalidArgumentError("grads: null");
  MOETRAIN_RETURN_IF_ERROR(CheckGrads(config_, num_local_experts_, d, *grads));
  if (expert_parallel_) {
    return BackwardExpertParallel(weights, d_out, d_x, grads, loss_weight);
  }
  const int64_t r = offsets_.back();

  // Combine → routed rows and combine weights.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_expert_out, scratch_.Get(kDExpertOut, dtype_, {r, d}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_weights, scratch_.Get(kDWeights, DType::kF32, {t, k}));
  MOETRAIN_RETURN_IF_ERROR(ops::CombineRowsBackward(ctx_, d_out, expert_out_, permutation_.pair_row,
                                                    routing_.topk_weights, d_expert_out,
                                                    d_weights));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_permuted_x,
                            scratch_.Get(kDPermutedX, DType::kF32, {r, d}));
  MOETRAIN_RETURN_IF_ERROR(RoutedExpertsBackward(weights, permuted_x_, d_expert_out, 0, e, offsets_,
                                                 d_permuted_x, grads));
  MOETRAIN_ASSIGN_OR_RETURN(const TensorView d_x_shared,
                            SharedExpertsBackward(weights, d_out, grads));
  // Router, in f32: the combine weights' gradient plus the aux and z losses.
  MOETRAIN_ASSIGN_OR_RETURN(const TensorView d_x_router,
                            RouterBackwardPart(weights, d_weights, grads, loss_weight));

  // Each token's input gradient: its pairs' rows, the router's and the shared experts' parts.
  TensorView addends[2] = {d_x_router, d_x_shared};
  return ops::SumPairRows(ctx_, d_permuted_x, permutation_.pair_row,
                          absl::MakeConstSpan(addends, d_x_shared.empty() ? 1 : 2), d_x);
}

}  // namespace moetrain
