#include "engine/ops/permute/permute.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/permute/permute_cpu.h"
#include "engine/ops/permute/permute_cuda.h"

namespace moetrain::ops {
namespace {

absl::Status CheckPairRowShape(const TensorView& pair_row) {
  return CheckDenseTensor(pair_row, "pair_row", DType::kI32, {-1, -1});
}

}  // namespace

int64_t ExpertCapacity(const MoeConfig& config, int64_t tokens) {
  const int64_t pairs = tokens * config.top_k;
  if (config.capacity_factor <= 0.0f) return pairs;
  // In double so that cf·T·k/E lands on an integer exactly when it should.
  return static_cast<int64_t>(std::ceil(static_cast<double>(config.capacity_factor) * pairs /
                                        static_cast<double>(config.num_experts)));
}

std::vector<int64_t> KeptRowsPerExpert(const MoeConfig& config, int64_t tokens,
                                       absl::Span<const int64_t> tokens_per_expert) {
  const int64_t capacity = ExpertCapacity(config, tokens);
  std::vector<int64_t> kept(tokens_per_expert.begin(), tokens_per_expert.end());
  for (int64_t& rows : kept) rows = std::min(rows, capacity);
  return kept;
}

std::vector<int64_t> PermutedExpertOffsets(const MoeConfig& config, int64_t tokens,
                                           absl::Span<const int64_t> tokens_per_expert) {
  const std::vector<int64_t> kept = KeptRowsPerExpert(config, tokens, tokens_per_expert);
  std::vector<int64_t> offsets(kept.size() + 1, 0);
  for (size_t e = 0; e < kept.size(); ++e) offsets[e + 1] = offsets[e] + kept[e];
  return offsets;
}

absl::Status BuildPermutation(const ExecContext& ctx, const MoeConfig& config,
                              const PermutationArgs& args, Permutation* out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "permutation",
                                        {{"topk_experts", args.topk_experts},
                                         {"topk_weights", args.topk_weights},
                                         {"expert_order", args.expert_order}}));
  const int64_t num_experts = config.num_experts, k = config.top_k;
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(args.topk_experts, "topk_experts", DType::kI32, {-1, k}));
  const int64_t tokens = args.topk_experts.dim(0);
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(args.topk_weights, "topk_weights", DType::kF32, {tokens, k}));
  if (!args.expert_order.empty()) {
    MOETRAIN_RETURN_IF_ERROR(
        CheckDenseTensor(args.expert_order, "expert_order", DType::kI32, {num_experts}));
  }
  const absl::Span<const int64_t> offsets = args.expert_offsets;
  if (static_cast<int64_t>(offsets.size()) != num_experts + 1 || offsets.front() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert_offsets: expected ", num_experts + 1,
                                                   " offsets from 0, got ", offsets.size()));
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (offsets[e + 1] < offsets[e]) {
      return absl::InvalidArgumentError(absl::StrCat("expert_offsets: decrease at expert ", e, " (",
                                                     offsets[e], " > ", offsets[e + 1], ")"));
    }
  }
  if (offsets.back() > tokens * k) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert_offsets: ", offsets.back(), " rows for ", tokens * k, " pairs"));
  }
  // The outputs are allocated on the device, so the backend is known to exist first.
#if MOETRAIN_HAVE_CUDA
  const bool has_backend = ctx.device().is_cpu() || ctx.device().type == DeviceType::kCuda;
#else
  const bool has_backend = ctx.device().is_cpu();
#endif
  if (!has_backend) return NoBackend(ctx, "permutation");
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->expert_offsets, DType::kI64, {num_experts + 1}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->row_token, DType::kI32, {offsets.back()}));
  MOETRAIN_RETURN_IF_ERROR(EnsureOutput(ctx, &out->pair_row, DType::kI32, {tokens, k}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::BuildPermutation(ctx, config, args, out);
#endif
  return cpu::BuildPermutation(config, args, out);
}

absl::Status GatherRows(const ExecContext& ctx, TensorView src, TensorView index, TensorView dst) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "gather", {{"src", src}, {"index", index}, {"dst", dst}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(src, "gather src", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(index, "gather index", DType::kI32, {-1}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(dst, "gather dst", src.dtype(), {index.dim(0), src.dim(1)}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::GatherRows(ctx, src, index, dst);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "gather");
  return cpu::GatherRows(ctx, src, index, dst);
}

absl::Status CombineRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         TensorView weights, TensorView extra, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "combine",
                                        {{"rows", rows},
                                         {"pair_row", pair_row},
                                         {"weights", weights},
                                         {"extra", extra},
                                         {"out", out}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRowShape(pair_row));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  if (!extra.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(extra, "combine extra", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "combine out", {tokens, d}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::CombineRows(ctx, rows, pair_row, weights, extra, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "combine");
  return cpu::CombineRows(ctx, rows, pair_row, weights, extra, out);
}

absl::Status CombineRowsBackward(const ExecContext& ctx, TensorView d_out, TensorView rows,
                                 TensorView pair_row, TensorView weights, TensorView d_rows,
                                 TensorView d_weights) {
  MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "combine backward",
                                        {{"d_out", d_out},
                                         {"rows", rows},
                                         {"pair_row", pair_row},
                                         {"weights", weights},
                                         {"d_rows", d_rows},
                                         {"d_weights", d_weights}}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRowShape(pair_row));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_out, "combine d_out", {tokens, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_rows, "combine d_rows", {rows.dim(0), d}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(d_weights, "combine d_weights", DType::kF32, {tokens, k}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::CombineRowsBackward(ctx, d_out, rows, pair_row, weights, d_rows, d_weights);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "combine backward");
  return cpu::CombineRowsBackward(ctx, d_out, rows, pair_row, weights, d_rows, d_weights);
}

absl::Status SumPairRows(const ExecContext& ctx, TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "sum rows", {{"rows", rows}, {"pair_row", pair_row}, {"out", out}}));
  for (const TensorView& a : addends) {
    MOETRAIN_RETURN_IF_ERROR(CheckDevices(ctx, "sum rows", {{"addend", a}}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "sum rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRowShape(pair_row));
  const int64_t tokens = pair_row.dim(0), d = rows.dim(1);
  for (const TensorView& a : addends) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(a, "sum addend", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "sum out", {tokens, d}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda)
    return cuda::SumPairRows(ctx, rows, pair_row, addends, out);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "sum rows");
  return cpu::SumPairRows(ctx, rows, pair_row, addends, out);
}

}  // namespace moetrain::ops
