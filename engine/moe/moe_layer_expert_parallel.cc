// MoeLayer with its routed experts spread over an expert group (see moe_layer.h): the pairs go to
// the ranks that own their experts and come back, chunk by chunk, while other work runs.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/permute/permute.h"

namespace moetrain {

absl::Status MoeLayer::RunChunks(
    const DispatchArgs& dispatch, const CombineArgs& combine,
    const std::function<absl::Status()>& other,
    const std::function<absl::Status(int chunk, int source)>& compute) {
  const int chunks = handle_.num_chunks;
  const bool overlap = chunks > 1;
  if (!overlap) MOETRAIN_RETURN_IF_ERROR(other());
  // Destroyed before returning, an unfinished request waits: no buffer is written after an error.
  std::vector<ExchangeRequest> dispatched(chunks), combined(chunks);
  // The exchanges read what the ops wrote: each starts once they are done, waited for on the host
  // unless the group orders its collectives after the queued device work itself (NCCL: an event),
  // so that the host goes on queuing the next chunk's GEMMs while an exchange travels.
  const bool ordered = handle_.group != nullptr && handle_.group->orders_after_device_work();
  auto start_dispatch = [&](int c) -> absl::Status {
    if (!ordered) MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
    DispatchArgs args = dispatch;
    args.chunk = c;
    MOETRAIN_ASSIGN_OR_RETURN(dispatched[c], StartDispatch(args));
    return absl::OkStatus();
  };
  MOETRAIN_RETURN_IF_ERROR(start_dispatch(0));
  if (overlap) MOETRAIN_RETURN_IF_ERROR(other());
  for (int c = 0; c < chunks; ++c) {
    // One dispatch ahead: chunk c + 1 travels while chunk c computes.
    if (c + 1 < chunks) MOETRAIN_RETURN_IF_ERROR(start_dispatch(c + 1));
    MOETRAIN_RETURN_IF_ERROR(dispatched[c].Wait());
    if (handle_.chunk_first_expert(c) < handle_.chunk_last_expert(c)) {
      for (int s = 0; s < handle_.group_size; ++s) MOETRAIN_RETURN_IF_ERROR(compute(c, s));
    }
    if (!ordered) MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
    CombineArgs args = combine;
    args.chunk = c;
    MOETRAIN_ASSIGN_OR_RETURN(combined[c], StartCombine(args));
  }
  for (ExchangeRequest& request : combined) MOETRAIN_RETURN_IF_ERROR(request.Wait());
  return absl::OkStatus();
}

absl::Status MoeLayer::ForwardExpertParallel(const MoeWeights& weights, TensorView out,
                                             bool rerun) {
  const int64_t t = x_.dim(0), k = config_.top_k, d = hidden_size_;
  const int64_t e = config_.num_experts, f = config_.expert_ffn_dim;

  // The rows each expert gets from this rank (capped by capacity as BuildPermutation caps them),
  // exchanged for the layout; then the pairs sorted by their experts' send slots, so that every
  // exchange sends one contiguous block of rows. A rerun keeps both.
  if (!rerun) {
    MOETRAIN_ASSIGN_OR_RETURN(
        handle_, PlanDispatch({.group = parallel_.expert_group,
                               .rows_per_expert = ops::KeptRowsPerExpert(config_, t, host_counts_),
                               .num_chunks = num_chunks_}));
    MOETRAIN_ASSIGN_OR_RETURN(TensorView send_order, workspace_.Get(kSendOrder, DType::kI32, {e}));
    MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(
        ctx_, TensorView(handle_.expert_send_slot.data(), DType::kI32, {e}), send_order));
    const std::vector<int64_t> send_offsets = handle_.SendOrderOffsets();
    MOETRAIN_RETURN_IF_ERROR(ops::BuildPermutation(ctx_, config_,
                                                   {.topk_experts = routing_.topk_experts,
                                                    .topk_weights = routing_.topk_weights,
                                                    .expert_offsets = send_offsets,
                                                    .expert_order = send_order},
                                                   &permutation_));
    has_routing_ = true;
  }
  const int64_t r = handle_.num_send_rows(), n = handle_.num_received_rows();
  dropped_ = t * k - r;

  MOETRAIN_ASSIGN_OR_RETURN(permuted_x_, scratch_.Get(kSentX, dtype_, {r, d}));
  MOETRAIN_RETURN_IF_ERROR(ops::GatherRows(ctx_, x_, permutation_.row_token, permuted_x_));
  MOETRAIN_ASSIGN_OR_RETURN(received_x_, workspace_.Get(kReceivedX, dtype_, {n, d}));
  MOETRAIN_ASSIGN_OR_RETURN(gate_up_, workspace_.Get(kGateUp, DType::kF32, {n, 2 * f}));
  MOETRAIN_ASSIGN_OR_RETURN(activated_, scratch_.Get(kActivated, dtype_, {n, f}));
  MOETRAIN_ASSIGN_OR_RETURN(expert_out_, scratch_.Get(kSentOut, DType::kF32, {n, d}));
  MOETRAIN_ASSIGN_OR_RETURN(combined_, workspace_.Get(kCombined, DType::kF32, {r, d}));

  // With fp8_dispatch the rows travel as FP8 and arrive dequantised, so everything after the
  // dispatch (the experts, the backward's use of received_x_) is as without it. Only this
  // dispatch: combine and the backward's exchanges of gradients stay in the compute dtype.
  const bool fp8_dispatch = fp8_ != nullptr && fp8_->config().fp8_dispatch;
  TensorView shared_out;
  MOETRAIN_RETURN_IF_ERROR(RunChunks(
      {.handle = &handle_,
       .rows = permuted_x_,
       .received = received_x_,
       .fp8 = fp8_dispatch,
       .ctx = &ctx_},
      {.handle = &handle_, .rows = expert_out_, .out = combined_},
      [&]() -> absl::Status {
        MOETRAIN_ASSIGN_OR_RETURN(shared_out, SharedExpertsForward(weights));
        return absl::OkStatus();
      },
      [&](int c, int source) {
        return RoutedExpertsForward(weights, received_x_, handle_.chunk_first_expert(c),
                                    handle_.chunk_last_expert(c), handle_.ExpertOffsets(c, source));
      }));
  return ops::CombineRows(ctx_, combined_, permutation_.pair_row, routing_.topk_weights, shared_out,
                          out);
}

absl::Status MoeLayer::BackwardExpertParallel(const MoeWeights& weights, TensorView d_out,
                                              TensorView d_x, MoeGrads* grads, float loss_weight) {
  const int64_t t = x_.dim(0), k = config_.top_k, d = hidden_size_;
  const int64_t r = handle_.num_send_rows(), n = handle_.num_received_rows();

  // Combine → the rows in permuted order and the combine weights.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_combined, scratch_.Get(kDExpertOut, dtype_, {r, d}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_weights, scratch_.Get(kDWeights, DType::kF32, {t, k}));
  MOETRAIN_RETURN_IF_ERROR(ops::CombineRowsBackward(ctx_, d_out, combined_, permutation_.pair_row,
                                                    routing_.topk_weights, d_combined, d_weights));

  // Their gradients travel to the experts (the backward of combine is a dispatch) and the input
  // rows' gradients back (the backward of dispatch is a combine), in the forward's layout.
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_received, scratch_.Get(kDReceived, dtype_, {n, d}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_received_x,
                            scratch_.Get(kDReceivedX, DType::kF32, {n, d}));
  MOETRAIN_ASSIGN_OR_RETURN(TensorView d_permuted_x,
                            scratch_.Get(kDPermutedX, DType::kF32, {r, d}));
  TensorView d_x_shared, d_x_router;
  MOETRAIN_RETURN_IF_ERROR(RunChunks(
      {.handle = &handle_, .rows = d_combined, .received = d_received},
      {.handle = &handle_, .rows = d_received_x, .out = d_permuted_x},
      [&]() -> absl::Status {
        MOETRAIN_ASSIGN_OR_RETURN(d_x_shared, SharedExpertsBackward(weights, d_out, grads));
        MOETRAIN_ASSIGN_OR_RETURN(d_x_router,
                                  RouterBackwardPart(weights, d_weights, grads, loss_weight));
        return absl::OkStatus();
      },
      [&](int c, int source) {
        return RoutedExpertsBackward(weights, received_x_, d_received,
                                     handle_.chunk_first_expert(c), handle_.chunk_last_expert(c),
                                     handle_.ExpertOffsets(c, source), d_received_x, grads);
      }));

  TensorView addends[2] = {d_x_router, d_x_shared};
  return ops::SumPairRows(ctx_, d_permuted_x, permutation_.pair_row,
                          absl::MakeConstSpan(addends, d_x_shared.empty() ? 1 : 2), d_x);
}

}  // namespace moetrain
