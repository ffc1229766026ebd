#include "engine/moe/moe_layer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/elementwise.h"
#include "engine/backend/cpu/gemm.h"
#include "engine/core/status.h"

namespace moetrain {

absl::StatusOr<MoeLayer> MoeLayer::Create(const MoeConfig& config, int64_t hidden_size,
                                          DType compute_dtype) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  if (hidden_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.hidden_size = ", hidden_size, " must be at least 1"));
  }
  if (compute_dtype != DType::kF32 && compute_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute dtype ", std::string(DTypeName(compute_dtype)),
                     " is not supported by the MoE layer (f32, bf16)"));
  }
  return MoeLayer(config, hidden_size, compute_dtype);
}

TensorView MoeLayer::Workspace(Tensor& storage, DType dtype, std::initializer_list<int64_t> shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t words = (numel * static_cast<int64_t>(DTypeSize(dtype)) + 3) / 4;
  if (storage.empty() || storage.numel() < words) storage = Tensor::Empty(DType::kF32, {words});
  return TensorView(storage.view().raw(), dtype, shape);
}

namespace {

absl::Status CheckWeights(const MoeConfig& config, int64_t d, DType dtype, const MoeWeights& w) {
  const int64_t e = config.num_experts, f = config.expert_ffn_dim;
  const int64_t sf = config.num_shared_experts * f;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.router, "weights.router", DType::kF32, {e, d}));
  if (config.expert_bias) {
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.expert_bias, "weights.expert_bias", DType::kF32, {e}));
  }
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(w.expert_gate_up, "weights.expert_gate_up", dtype, {e, 2 * f, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.expert_down, "weights.expert_down", dtype, {e, d, f}));
  if (sf > 0) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(w.shared_gate_up, "weights.shared_gate_up", dtype, {2 * sf, d}));
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(w.shared_down, "weights.shared_down", dtype, {d, sf}));
  }
  return absl::OkStatus();
}

absl::Status CheckGrads(const MoeConfig& config, int64_t d, const MoeGrads& g) {
  const int64_t e = config.num_experts, f = config.expert_ffn_dim;
  const int64_t sf = config.num_shared_experts * f;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(g.router, "grads.router", DType::kF32, {e, d}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckTensor(g.expert_gate_up, "grads.expert_gate_up", DType::kF32, {e, 2 * f, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(g.expert_down, "grads.expert_down", DType::kF32, {e, d, f}));
  if (sf > 0) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckTensor(g.shared_gate_up, "grads.shared_gate_up", DType::kF32, {2 * sf, d}));
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(g.shared_down, "grads.shared_down", DType::kF32, {d, sf}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MoeLayer::Forward(const MoeWeights& weights, TensorView x, int64_t tokens_per_sequence,
                               TensorView out, MoeStats* stats) {
  // A failed Forward leaves nothing for Backward to use.
  has_forward_ = false;
  const int64_t d = hidden_size_, e = config_.num_experts, f = config_.expert_ffn_dim;
  const int64_t sf = config_.num_shared_experts * f;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(x, "x", dtype_, {-1, d}));
  const int64_t t = x.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(out, "out", dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckWeights(config_, d, dtype_, weights));
  if (!x.is_contiguous() || !out.is_contiguous()) {
    return absl::InvalidArgumentError("x and out must be contiguous");
  }

  // Router, in f32.
  if (dtype_ == DType::kF32) {
    router_input_ = x;
  } else {
    router_input_ = Workspace(buffers_[kRouterInput], DType::kF32, {t, d});
    MOETRAIN_RETURN_IF_ERROR(cpu::ConvertTensor(x, router_input_));
  }
  logits_ = Workspace(buffers_[kLogits], DType::kF32, {t, e});
  MOETRAIN_RETURN_IF_ERROR(
      cpu::Gemm({.a = router_input_, .b = weights.router, .c = logits_, .trans_b = true}));
  const RouterArgs router_args = {logits_, weights.expert_bias, tokens_per_sequence};
  MOETRAIN_RETURN_IF_ERROR(RouterForward(config_, router_args, &routing_));
  MOETRAIN_RETURN_IF_ERROR(
      BuildPermutation(config_, routing_.topk_experts, routing_.topk_weights, &permutation_));

  // Routed experts over the permuted rows: one contiguous block per expert.
  const int64_t r = permutation_.num_rows;
  const auto& offsets = permutation_.expert_offsets;
  permuted_x_ = Workspace(buffers_[kPermutedX], dtype_, {r, d});
  MOETRAIN_RETURN_IF_ERROR(cpu::GatherRows(x, permutation_.row_token, permuted_x_));
  gate_up_ = Workspace(buffers_[kGateUp], DType::kF32, {r, 2 * f});
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmForward(permuted_x_, weights.expert_gate_up, offsets, gate_up_));
  activated_ = Workspace(buffers_[kActivated], dtype_, {r, f});
  MOETRAIN_RETURN_IF_ERROR(cpu::SwigluForward(gate_up_, activated_));
  expert_out_ = Workspace(buffers_[kExpertOut], DType::kF32, {r, d});
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmForward(activated_, weights.expert_down, offsets, expert_out_));

  // Shared experts see every token.
  TensorView shared_out;
  if (sf > 0) {
    shared_gate_up_ = Workspace(buffers_[kSharedGateUp], DType::kF32, {t, 2 * sf});
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = x, .b = weights.shared_gate_up, .c = shared_gate_up_, .trans_b = true}));
    shared_activated_ = Workspace(buffers_[kSharedActivated], dtype_, {t, sf});
    MOETRAIN_RETURN_IF_ERROR(cpu::SwigluForward(shared_gate_up_, shared_activated_));
    shared_out = Workspace(buffers_[kSharedOut], DType::kF32, {t, d});
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm(
        {.a = shared_activated_, .b = weights.shared_down, .c = shared_out, .trans_b = true}));
  }
  MOETRAIN_RETURN_IF_ERROR(
      cpu::CombineRows(expert_out_, permutation_.pair_row, routing_.topk_weights, shared_out, out));

  x_ = x;
  tokens_per_sequence_ = tokens_per_sequence;
  has_forward_ = true;
  if (stats != nullptr) {
    stats->tokens_per_expert = routing_.tokens_per_expert;
    stats->dropped_tokens = permutation_.dropped;
    stats->aux_loss = routing_.aux_loss;
    stats->z_loss = routing_.z_loss;
    const int64_t max_load =
        *std::max_element(routing_.tokens_per_expert.begin(), routing_.tokens_per_expert.end());
    const double mean_load = static_cast<double>(t * config_.top_k) / static_cast<double>(e);
    stats->max_mean_load_ratio = t > 0 ? static_cast<float>(max_load / mean_load) : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::Backward(const MoeWeights& weights, TensorView d_out, TensorView d_x,
                                MoeGrads* grads, float loss_weight) {
  if (!has_forward_) {
    return absl::FailedPreconditionError("MoeLayer::Backward needs a successful Forward first");
  }
  const int64_t d = hidden_size_, e = config_.num_experts, f = config_.expert_ffn_dim;
  const int64_t sf = config_.num_shared_experts * f;
  const int64_t t = x_.dim(0), k = config_.top_k, r = permutation_.num_rows;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_out, "d_out", dtype_, {t, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_x, "d_x", dtype_, {t, d}));
  if (!d_out.is_contiguous() || !d_x.is_contiguous()) {
    return absl::InvalidArgumentError("d_out and d_x must be contiguous");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckWeights(config_, d, dtype_, weights));
  if (grads == nullptr) return absl::InvalidArgumentError("grads: null");
  MOETRAIN_RETURN_IF_ERROR(CheckGrads(config_, d, *grads));
  const auto& offsets = permutation_.expert_offsets;

  // Combine → routed rows and combine weights.
  TensorView d_expert_out = Workspace(buffers_[kDExpertOut], dtype_, {r, d});
  TensorView d_weights = Workspace(buffers_[kDWeights], DType::kF32, {t, k});
  MOETRAIN_RETURN_IF_ERROR(cpu::CombineRowsBackward(
      d_out, expert_out_, permutation_.pair_row, routing_.topk_weights, d_expert_out, d_weights));

  // Down projection, SwiGLU, gate/up projection of the routed experts.
  TensorView d_activated = Workspace(buffers_[kDActivated], DType::kF32, {r, f});
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmBackwardData(d_expert_out, weights.expert_down, offsets, d_activated));
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmBackwardWeight(d_expert_out, activated_, offsets, grads->expert_down, true));
  TensorView d_gate_up = Workspace(buffers_[kDGateUp], dtype_, {r, 2 * f});
  MOETRAIN_RETURN_IF_ERROR(cpu::SwigluBackward(gate_up_, d_activated, d_gate_up));
  TensorView d_permuted_x = Workspace(buffers_[kDPermutedX], DType::kF32, {r, d});
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmBackwardData(d_gate_up, weights.expert_gate_up, offsets, d_permuted_x));
  MOETRAIN_RETURN_IF_ERROR(
      cpu::GroupedGemmBackwardWeight(d_gate_up, permuted_x_, offsets, grads->expert_gate_up, true));

  // Shared experts.
  TensorView d_x_shared;
  if (sf > 0) {
    TensorView d_shared_activated = Workspace(buffers_[kDSharedActivated], DType::kF32, {t, sf});
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = d_out, .b = weights.shared_down, .c = d_shared_activated}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_out,
                                        .b = shared_activated_,
                                        .c = grads->shared_down,
                                        .trans_a = true,
                                        .accumulate = true}));
    TensorView d_shared_gate_up = Workspace(buffers_[kDSharedGateUp], dtype_, {t, 2 * sf});
    MOETRAIN_RETURN_IF_ERROR(
        cpu::SwigluBackward(shared_gate_up_, d_shared_activated, d_shared_gate_up));
    d_x_shared = Workspace(buffers_[kDXShared], DType::kF32, {t, d});
    MOETRAIN_RETURN_IF_ERROR(
        cpu::Gemm({.a = d_shared_gate_up, .b = weights.shared_gate_up, .c = d_x_shared}));
    MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_shared_gate_up,
                                        .b = x_,
                                        .c = grads->shared_gate_up,
                                        .trans_a = true,
                                        .accumulate = true}));
  }

  // Router, in f32: the combine weights' gradient plus the aux and z losses.
  TensorView d_logits = Workspace(buffers_[kDLogits], DType::kF32, {t, e});
  const RouterArgs router_args = {logits_, weights.expert_bias, tokens_per_sequence_};
  MOETRAIN_RETURN_IF_ERROR(
      RouterBackward(config_, router_args, routing_, d_weights, d_logits, loss_weight));
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_logits,
                                      .b = router_input_,
                                      .c = grads->router,
                                      .trans_a = true,
                                      .accumulate = true}));
  TensorView d_x_router = Workspace(buffers_[kDXRouter], DType::kF32, {t, d});
  MOETRAIN_RETURN_IF_ERROR(cpu::Gemm({.a = d_logits, .b = weights.router, .c = d_x_router}));

  // Each token's input gradient: its pairs' rows, the router's and the shared experts' parts.
  TensorView addends[2] = {d_x_router, d_x_shared};
  return cpu::SumPairRows(d_permuted_x, permutation_.pair_row,
                          absl::MakeConstSpan(addends, sf > 0 ? 2 : 1), d_x);
}

}  // namespace moetrain
