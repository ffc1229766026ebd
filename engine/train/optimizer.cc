#include "engine/train/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/optim/optim.h"

namespace moetrain {
namespace {

absl::Status InvalidField(absl::string_view field, float value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("train.optimizer.", field, " = ", value, " ", why));
}

absl::Status CheckParameter(const Parameter& param) {
  if (param.name.empty()) return absl::InvalidArgumentError("a parameter has an empty name");
  const auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", param.name, ": ", what));
  };
  for (const auto& [view, role] :
       {std::pair(param.value, "value"), std::pair(param.grad, "grad")}) {
    if (view.empty()) return fail(absl::StrCat(role, " has no tensor"));
    if (view.dtype() != DType::kF32) {
      return fail(absl::StrCat(role, " must be f32, got ", view.DebugString()));
    }
    if (!view.is_contiguous()) {
      return fail(
          absl::StrCat(role, " must be contiguous, got a strided ", view.DebugString(), " view"));
    }
  }
  if (param.grad.shape() != param.value.shape()) {
    return fail(absl::StrCat("grad ", param.grad.DebugString(), " does not match value ",
                             param.value.DebugString()));
  }
  return absl::OkStatus();
}

// The grads of `params`, for the optimizer ops.
std::vector<TensorView> GradViews(absl::Span<const Parameter> params) {
  std::vector<TensorView> grads;
  grads.reserve(params.size());
  for (const Parameter& param : params) grads.push_back(param.grad);
  return grads;
}

}  // namespace

absl::Status CheckParameters(absl::Span<const Parameter> params) {
  std::unordered_set<std::string_view> names;
  for (const Parameter& param : params) {
    MOETRAIN_RETURN_IF_ERROR(CheckParameter(param));
    if (!names.insert(param.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", param.name, " is listed more than once"));
    }
  }
  // Byte ranges of every value and grad, sorted by start: any overlap shows between neighbours
  // (against the furthest end so far).
  struct Range {
    uintptr_t begin, end;
    size_t param;
    const char* role;
  };
  std::vector<Range> ranges;
  ranges.reserve(2 * params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    for (const auto& [view, role] :
         {std::pair(params[i].value, "value"), std::pair(params[i].grad, "grad")}) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(view.raw());
      const uintptr_t bytes = static_cast<uintptr_t>(view.numel()) * sizeof(float);
      if (bytes > 0) ranges.push_back({begin, begin + bytes, i, role});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t r = 1, furthest = 0; r < ranges.size(); ++r) {
    if (ranges[r].begin < ranges[furthest].end) {
      const Range& a = ranges[furthest];
      const Range& b = ranges[r];
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters ", params[a.param].name, " (", a.role, ") and ", params[b.param].name, " (",
          b.role, ") share memory; list a tied weight once"));
    }
    if (ranges[r].end > ranges[furthest].end) furthest = r;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParameterPiece>> SliceParameters(
    absl::Span<const Parameter> params, TensorView values, TensorView grads,
    absl::Span<const std::pair<int64_t, int64_t>> ranges) {
  const auto offset_in = [](const TensorView& view, const TensorView& buffer) -> int64_t {
    const auto at = reinterpret_cast<uintptr_t>(view.raw()),
               first = reinterpret_cast<uintptr_t>(buffer.raw());
    if (view.device() != buffer.device() || at < first || (at - first) % sizeof(float) != 0) {
      return -1;
    }
    const int64_t offset = static_cast<int64_t>((at - first) / sizeof(float));
    return offset + view.numel() <= buffer.numel() ? offset : -1;
  };
  std::vector<ParameterPiece> pieces;
  for (const Parameter& param : params) {
    MOETRAIN_RETURN_IF_ERROR(CheckParameter(param));
    const int64_t begin = offset_in(param.value, values);
    if (begin < 0 || offset_in(param.grad, grads) != begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", param.name,
          ": value and grad do not lie at one offset of the flat buffers it is sliced from"));
    }
    const int64_t end = begin + param.value.numel();
    for (const auto& [range_begin, range_end] : ranges) {
      const int64_t lo = std::max(begin, range_begin), hi = std::min(end, range_end);
      if (lo >= hi) continue;
      ParameterPiece piece;
      piece.part.name = absl::StrCat(param.name, "[", lo - begin, ":", hi - begin, "]");
      piece.part.value = values.Slice(lo, hi);
      piece.part.grad = grads.Slice(lo, hi);
      piece.part.weight_decay = param.weight_decay;
      piece.parameter = param.name;
      piece.shape.assign(param.value.shape().begin(), param.value.shape().end());
      piece.offset = lo - begin;
      pieces.push_back(std::move(piece));
    }
  }
  return pieces;
}

absl::Status AdamWConfig::Validate() const {
  // Negated comparisons, so that NaN fails each of them.
  if (!(beta1 >= 0.0f && beta1 < 1.0f)) return InvalidField("beta1", beta1, "must be in [0, 1)");
  if (!(beta2 >= 0.0f && beta2 < 1.0f)) return InvalidField("beta2", beta2, "must be in [0, 1)");
  if (!(eps > 0.0f) || !std::isfinite(eps)) {
    return InvalidField("eps", eps, "must be positive and finite");
  }
  if (!(weight_decay >= 0.0f) || !std::isfinite(weight_decay)) {
    return InvalidField("weight_decay", weight_decay, "must be non-negative and finite");
  }
  if (moment_dtype != DType::kF32 && moment_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.optimizer.moment_dtype = ", std::string(DTypeName(moment_dtype)),
                     " must be f32 or bf16"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AdamW> AdamW::Create(const ExecContext& ctx, const AdamWConfig& config,
                                    std::vector<Parameter> params) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  AdamW optimizer(ctx, config, std::move(params));
  for (const Parameter& param : optimizer.params_) {
    for (std::vector<Tensor>* moments : {&optimizer.exp_avg_, &optimizer.exp_avg_sq_}) {
      MOETRAIN_ASSIGN_OR_RETURN(
          Tensor moment,
          Tensor::Allocate(ctx.allocator(), config.moment_dtype, param.value.shape()));
      MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx, moment, 0.0f));
      moments->push_back(std::move(moment));
    }
  }
  return optimizer;
}

absl::Status AdamW::Step(float lr) {
  if (!(lr >= 0.0f) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW learning rate = ", lr, " must be non-negative and finite"));
  }
  const int64_t t = step_ + 1;
  const double bias1 = 1.0 - std::pow(static_cast<double>(config_.beta1), static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(t));
  AdamWScalars decaying;
  decaying.beta1 = config_.beta1;
  decaying.one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
  decaying.beta2 = config_.beta2;
  decaying.one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
  decaying.step_size = static_cast<float>(lr / bias1);
  decaying.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  decaying.eps = config_.eps;
  decaying.decay = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
  AdamWScalars plain = decaying;
  plain.decay = 1.0f;
  std::vector<TensorView> values, grads, exp_avg, exp_avg_sq;
  std::vector<bool> weight_decay;
  for (size_t i = 0; i < params_.size(); ++i) {
    values.push_back(params_[i].value);
    grads.push_back(params_[i].grad);
    exp_avg.push_back(exp_avg_[i]);
    exp_avg_sq.push_back(exp_avg_sq_[i]);
    weight_decay.push_back(params_[i].weight_decay);
  }
  MOETRAIN_RETURN_IF_ERROR(ops::AdamWStep(ctx_, {.params = values,
                                                 .grads = grads,
                                                 .exp_avg = exp_avg,
                                                 .exp_avg_sq = exp_avg_sq,
                                                 .weight_decay = &weight_decay,
                                                 .decaying = decaying,
                                                 .plain = plain}));
  step_ = t;
  return absl::OkStatus();
}

absl::Status AdamW::SetState(int64_t step, absl::Span<const TensorView> exp_avg,
                             absl::Span<const TensorView> exp_avg_sq) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW step = ", step, " must not be negative"));
  }
  for (const auto& [views, what] :
       {std::pair(exp_avg, "exp_avg"), std::pair(exp_avg_sq, "exp_avg_sq")}) {
    if (static_cast<int64_t>(views.size()) != num_params()) {
      return absl::InvalidArgumentError(absl::StrCat("AdamW state has ", views.size(), " ", what,
                                                     " tensors for ", num_params(), " parameters"));
    }
  }
  // Copied and checked first, swapped in last: a bad tensor leaves the state as it was.
  std::vector<Tensor> new_exp_avg, new_exp_avg_sq;
  new_exp_avg.reserve(params_.size());
  new_exp_avg_sq.reserve(params_.size());
  for (int64_t i = 0; i < num_params(); ++i) {
    const Parameter& param = params_[i];
    for (const auto& [src, suffix, out] :
         {std::tuple(exp_avg[i], kExpAvgSuffix, &new_exp_avg),
          std::tuple(exp_avg_sq[i], kExpAvgSqSuffix, &new_exp_avg_sq)}) {
      if (src.empty() || src.dtype() != DType::kF32 || src.shape() != param.value.shape()) {
        return absl::InvalidArgumentError(
            absl::StrCat(param.name, suffix, ": expected ", param.value.DebugString(), ", got ",
                         src.empty() ? std::string("no tensor") : src.DebugString()));
      }
      MOETRAIN_ASSIGN_OR_RETURN(
          Tensor copy, Tensor::Allocate(ctx_.allocator(), DType::kF32, param.value.shape()));
      MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx_, src, copy));
      out->push_back(std::move(copy));
    }
    MOETRAIN_RETURN_IF_ERROR(
        ops::CheckAdamWMoments(ctx_, param.name + kExpAvgSuffix, new_exp_avg.back(),
                               param.name + kExpAvgSqSuffix, new_exp_avg_sq.back()));
    if (config_.moment_dtype == DType::kBF16) {
      for (std::vector<Tensor>* moments : {&new_exp_avg, &new_exp_avg_sq}) {
        MOETRAIN_ASSIGN_OR_RETURN(
            Tensor rounded, Tensor::Allocate(ctx_.allocator(), DType::kBF16, param.value.shape()));
        MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_, moments->back(), rounded));
        moments->back() = std::move(rounded);
      }
    }
  }
  exp_avg_ = std::move(new_exp_avg);
  exp_avg_sq_ = std::move(new_exp_avg_sq);
  step_ = step;
  return absl::OkStatus();
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const std::vector<Tensor>* moments : {&exp_avg_, &exp_avg_sq_}) {
    for (const Tensor& moment : *moments) {
      bytes += moment.numel() * static_cast<int64_t>(DTypeSize(moment.dtype()));
    }
  }
  return bytes;
}

absl::Status AdamW::SetStep(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW step = ", step, " must not be negative"));
  }
  step_ = step;
  return absl::OkStatus();
}

absl::StatusOr<double> GlobalGradNorm(const ExecContext& ctx, absl::Span<const Parameter> params) {
  MOETRAIN_ASSIGN_OR_RETURN(const double sum, GradSquaredSum(ctx, params));
  return std::sqrt(sum);
}

absl::StatusOr<double> GradSquaredSum(const ExecContext& ctx, absl::Span<const Parameter> params) {
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  return ops::SquaredNorm(ctx, GradViews(params));
}

absl::Status ClipGradNorm(const ExecContext& ctx, absl::Span<const Parameter> params,
                          double max_norm, double* norm_before) {
  if (std::isnan(max_norm)) {
    return absl::InvalidArgumentError("max grad norm = nan (0 or less turns clipping off)");
  }
  MOETRAIN_ASSIGN_OR_RETURN(const double norm, GlobalGradNorm(ctx, params));
  if (norm_before != nullptr) *norm_before = norm;
  return ClipGradsToNorm(ctx, params, max_norm, norm);
}

absl::Status ClipGradsToNorm(const ExecContext& ctx, absl::Span<const Parameter> params,
                             double max_norm, double norm) {
  if (std::isnan(max_norm)) {
    return absl::InvalidArgumentError("max grad norm = nan (0 or less turns clipping off)");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  if (!(max_norm > 0.0) || !std::isfinite(norm) || !(norm > max_norm)) return absl::OkStatus();
  return ops::ScaleTensors(ctx, GradViews(params), static_cast<float>(max_norm / (norm + 1e-6)));
}

bool AllFinite(const ExecContext& ctx, absl::Span<const Parameter> params) {
  for (const Parameter& param : params) {
    if (param.grad.empty() || param.grad.dtype() != DType::kF32 || !param.grad.is_contiguous() ||
        param.grad.device() != ctx.device()) {
      return false;
    }
  }
  const absl::StatusOr<bool> finite = ops::AllFinite(ctx, GradViews(params));
  return finite.ok() && *finite;
}

absl::Status ZeroGrads(const ExecContext& ctx, absl::Span<const Parameter> params) {
  for (const Parameter& param : params) {
    if (!param.grad.empty()) MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx, param.grad, 0.0f));
  }
  return absl::OkStatus();
}

}  // namespace moetrain
