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
#include "engine/core/thread_pool.h"

namespace moetrain {
namespace {

// Elements per ParallelFor chunk, at least: AdamW touches 28 bytes an element, so 32 Ki elements
// are ~1 MiB of traffic, far more than the hand-off costs.
constexpr int64_t kStepGrain = 1 << 15;
// The lighter passes (scale, NaN check) move 4–8 bytes an element.
constexpr int64_t kLightGrain = 1 << 16;
// The norm sums squares block by block, each block in kNormLanes interleaved partial sums, then
// adds the blocks in order: a fixed order whatever the thread count or ISA.
constexpr int64_t kNormBlock = 1 << 16;
constexpr int kNormLanes = 16;
// Elements the NaN check scans between looks at whether another chunk already found one.
constexpr int64_t kFiniteTile = 1 << 14;
// AdamW runs its three loops (below) over tiles this long, so the tile stays in L1 between them.
constexpr int64_t kAdamTile = 512;

// Plain loops that GCC vectorises; target_clones builds them for AVX2 and AVX-512 as well and
// picks one at load time. GCC's C++ default is -ffp-contract=fast, and the AVX-512 clone has FMA:
// without fp-contract=off it would fuse a·b + c and round differently from the other clones. So
// every clone gives the same bits, and a job resumed on another CPU continues identically.
#if defined(__x86_64__) && defined(__GNUC__)
#define MOETRAIN_OPTIM_CLONES \
  __attribute__((target_clones("default", "avx2", "avx512f"), optimize("fp-contract=off")))
#else
#define MOETRAIN_OPTIM_CLONES
#endif

// The per-step f32 scalars of one AdamW update.
struct AdamWScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;       // lr / (1 − β1^t)
  float inv_sqrt_bias2;  // 1 / √(1 − β2^t): √v̂ = √v · inv_sqrt_bias2
  float eps;
  float decay;  // 1 − lr·wd, or exactly 1 for parameters without weight decay
};

// One AdamW update of n elements. std::sqrt keeps errno semantics (the build has no
// -fno-math-errno), which stops GCC from vectorising any loop that calls it; so the moments and
// the parameter update run as vector loops and only the square roots as a scalar one between.
MOETRAIN_OPTIM_CLONES void AdamWUpdate(float* __restrict p, const float* __restrict g,
                                       float* __restrict m, float* __restrict v, int64_t n,
                                       const AdamWScalars s) {
  float root[kAdamTile];  // v, then √v
  for (int64_t start = 0; start < n; start += kAdamTile) {
    const int64_t len = std::min(kAdamTile, n - start);
    float* __restrict pt = p + start;
    const float* __restrict gt = g + start;
    float* __restrict mt = m + start;
    float* __restrict vt = v + start;
    for (int64_t i = 0; i < len; ++i) {
      mt[i] = s.beta1 * mt[i] + s.one_minus_beta1 * gt[i];
      vt[i] = s.beta2 * vt[i] + s.one_minus_beta2 * (gt[i] * gt[i]);
      root[i] = vt[i];
    }
    for (int64_t i = 0; i < len; ++i) root[i] = std::sqrt(root[i]);
    for (int64_t i = 0; i < len; ++i) {
      const float denom = root[i] * s.inv_sqrt_bias2 + s.eps;
      pt[i] = pt[i] * s.decay - s.step_size * (mt[i] / denom);
    }
  }
}

// lanes[i % kNormLanes] += x[i]² in f64, for i in [0, n).
MOETRAIN_OPTIM_CLONES void AccumulateSquares(const float* x, int64_t n, double* lanes) {
  double acc[kNormLanes];
  for (int l = 0; l < kNormLanes; ++l) acc[l] = lanes[l];
  int64_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes) {
    for (int l = 0; l < kNormLanes; ++l) {
      const double xi = x[i + l];
      acc[l] += xi * xi;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const double xi = x[i];
    acc[l] += xi * xi;
  }
  for (int l = 0; l < kNormLanes; ++l) lanes[l] = acc[l];
}

// An exponent field of all ones is ±Inf or NaN; testing the bits needs no float compares, which
// -ffinite-math-only or a signalling NaN could upset.
MOETRAIN_OPTIM_CLONES bool HasNonFinite(const float* x, int64_t n) {
  uint32_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    found |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return found != 0;
}

MOETRAIN_OPTIM_CLONES void ScaleInPlace(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// First element (or byte) of each tensor laid end to end: tensor i is [offsets[i], offsets[i+1]).
template <typename SizeFn>
std::vector<int64_t> Offsets(int64_t count, SizeFn size) {
  std::vector<int64_t> offsets(count + 1, 0);
  for (int64_t i = 0; i < count; ++i) offsets[i + 1] = offsets[i] + size(i);
  return offsets;
}

std::vector<int64_t> GradOffsets(absl::Span<const Parameter> params) {
  return Offsets(static_cast<int64_t>(params.size()),
                 [&](int64_t i) { return params[i].grad.numel(); });
}

// Calls fn(i, begin_i, end_i) for each tensor i that overlaps [begin, end) of the flat range,
// with the overlap in tensor i's own coordinates, in ascending i.
template <typename Fn>
void ForEachSegment(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, Fn fn) {
  const int64_t count = static_cast<int64_t>(offsets.size()) - 1;
  int64_t i = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
  for (; i < count && offsets[i] < end; ++i) {
    const int64_t lo = std::max(begin, offsets[i]);
    const int64_t hi = std::min(end, offsets[i + 1]);
    if (lo < hi) fn(i, lo - offsets[i], hi - offsets[i]);
  }
}

// Calls fn(element pointer) for every element of `t`, in row-major order, whatever its strides.
template <typename Fn>
void ForEachElement(const TensorView& t, Fn fn) {
  if (t.numel() == 0) return;
  if (t.rank() == 0) {
    fn(static_cast<char*>(t.raw()));
    return;
  }
  if (t.rank() == 1) {
    const int64_t step = t.stride(0) * static_cast<int64_t>(DTypeSize(t.dtype()));
    char* base = static_cast<char*>(t.raw());
    for (int64_t i = 0; i < t.dim(0); ++i) fn(base + i * step);
    return;
  }
  for (int64_t i = 0; i < t.dim(0); ++i) ForEachElement(t.Select(i), fn);
}

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
  return absl::OkStatus();
}

absl::StatusOr<AdamW> AdamW::Create(const AdamWConfig& config, std::vector<Parameter> params) {
  MOETRAIN_RETURN_IF_ERROR(config.Validate());
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  return AdamW(config, std::move(params));
}

AdamW::AdamW(const AdamWConfig& config, std::vector<Parameter> params)
    : config_(config), params_(std::move(params)) {
  offsets_ = Offsets(num_params(), [&](int64_t i) { return params_[i].value.numel(); });
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  for (const Parameter& param : params_) {
    exp_avg_.push_back(Tensor::Zeros(DType::kF32, param.value.shape()));
    exp_avg_sq_.push_back(Tensor::Zeros(DType::kF32, param.value.shape()));
  }
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

  DefaultThreadPool().ParallelFor(offsets_.back(), kStepGrain, [&](int64_t begin, int64_t end) {
    ForEachSegment(offsets_, begin, end, [&](int64_t i, int64_t lo, int64_t hi) {
      const Parameter& param = params_[i];
      AdamWUpdate(param.value.data<float>() + lo, param.grad.data<float>() + lo,
                  exp_avg_[i].data<float>() + lo, exp_avg_sq_[i].data<float>() + lo, hi - lo,
                  param.weight_decay ? decaying : plain);
    });
  });
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
      Tensor copy = Tensor::Empty(DType::kF32, param.value.shape());
      float* dst = copy.data<float>();
      ForEachElement(src, [&](char* element) { std::memcpy(dst++, element, sizeof(float)); });
      out->push_back(std::move(copy));
    }
    const float* m = new_exp_avg.back().data<float>();
    const float* v = new_exp_avg_sq.back().data<float>();
    for (int64_t j = 0; j < param.value.numel(); ++j) {
      if (!std::isfinite(m[j])) {
        return absl::InvalidArgumentError(
            absl::StrCat(param.name, kExpAvgSuffix, "[", j, "] = ", m[j], " is not finite"));
      }
      if (!(v[j] >= 0.0f) || !std::isfinite(v[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            param.name, kExpAvgSqSuffix, "[", j, "] = ", v[j], " must be non-negative and finite"));
      }
    }
  }
  exp_avg_ = std::move(new_exp_avg);
  exp_avg_sq_ = std::move(new_exp_avg_sq);
  step_ = step;
  return absl::OkStatus();
}

absl::Status AdamW::SetStep(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW step = ", step, " must not be negative"));
  }
  step_ = step;
  return absl::OkStatus();
}

absl::StatusOr<double> GlobalGradNorm(absl::Span<const Parameter> params) {
  MOETRAIN_ASSIGN_OR_RETURN(const double sum, GradSquaredSum(params));
  return std::sqrt(sum);
}

absl::StatusOr<double> GradSquaredSum(absl::Span<const Parameter> params) {
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  const std::vector<int64_t> offsets = GradOffsets(params);
  const int64_t total = offsets.back();
  const int64_t num_blocks = (total + kNormBlock - 1) / kNormBlock;
  std::vector<double> block_sums(num_blocks);
  DefaultThreadPool().ParallelFor(num_blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      double lanes[kNormLanes] = {};
      ForEachSegment(offsets, b * kNormBlock, std::min(total, (b + 1) * kNormBlock),
                     [&](int64_t i, int64_t lo, int64_t hi) {
                       AccumulateSquares(params[i].grad.data<float>() + lo, hi - lo, lanes);
                     });
      double sum = 0.0;
      for (double lane : lanes) sum += lane;
      block_sums[b] = sum;
    }
  });
  double sum = 0.0;
  for (double block_sum : block_sums) sum += block_sum;
  return sum;
}

absl::Status ClipGradNorm(absl::Span<const Parameter> params, double max_norm,
                          double* norm_before) {
  if (std::isnan(max_norm)) {
    return absl::InvalidArgumentError("max grad norm = nan (0 or less turns clipping off)");
  }
  MOETRAIN_ASSIGN_OR_RETURN(const double norm, GlobalGradNorm(params));
  if (norm_before != nullptr) *norm_before = norm;
  return ClipGradsToNorm(params, max_norm, norm);
}

absl::Status ClipGradsToNorm(absl::Span<const Parameter> params, double max_norm, double norm) {
  if (std::isnan(max_norm)) {
    return absl::InvalidArgumentError("max grad norm = nan (0 or less turns clipping off)");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckParameters(params));
  if (!(max_norm > 0.0) || !std::isfinite(norm) || !(norm > max_norm)) return absl::OkStatus();
  const float scale = static_cast<float>(max_norm / (norm + 1e-6));
  const std::vector<int64_t> offsets = GradOffsets(params);
  DefaultThreadPool().ParallelFor(offsets.back(), kLightGrain, [&](int64_t begin, int64_t end) {
    ForEachSegment(offsets, begin, end, [&](int64_t i, int64_t lo, int64_t hi) {
      ScaleInPlace(params[i].grad.data<float>() + lo, hi - lo, scale);
    });
  });
  return absl::OkStatus();
}

bool AllFinite(absl::Span<const Parameter> params) {
  for (const Parameter& param : params) {
    if (param.grad.empty() || param.grad.dtype() != DType::kF32 || !param.grad.is_contiguous()) {
      return false;
    }
  }
  const std::vector<int64_t> offsets = GradOffsets(params);
  std::atomic<bool> found{false};
  DefaultThreadPool().ParallelFor(offsets.back(), kLightGrain, [&](int64_t begin, int64_t end) {
    for (int64_t start = begin; start < end; start += kFiniteTile) {
      if (found.load(std::memory_order_relaxed)) return;
      ForEachSegment(offsets, start, std::min(end, start + kFiniteTile),
                     [&](int64_t i, int64_t lo, int64_t hi) {
                       if (HasNonFinite(params[i].grad.data<float>() + lo, hi - lo)) {
                         found.store(true, std::memory_order_relaxed);
                       }
                     });
    }
  });
  return !found.load();
}

void ZeroGrads(absl::Span<const Parameter> params) {
  // Contiguous grads (the usual case) are zeroed in parallel as one byte range; others one
  // element at a time.
  std::vector<const TensorView*> dense;
  for (const Parameter& param : params) {
    if (param.grad.empty()) continue;
    if (param.grad.is_contiguous()) {
      dense.push_back(&param.grad);
    } else {
      const size_t size = DTypeSize(param.grad.dtype());
      ForEachElement(param.grad, [&](char* element) { std::memset(element, 0, size); });
    }
  }
  const std::vector<int64_t> offsets = Offsets(static_cast<int64_t>(dense.size()), [&](int64_t i) {
    return dense[i]->numel() * static_cast<int64_t>(DTypeSize(dense[i]->dtype()));
  });
  DefaultThreadPool().ParallelFor(
      offsets.back(), kLightGrain * static_cast<int64_t>(sizeof(float)),
      [&](int64_t begin, int64_t end) {
        ForEachSegment(offsets, begin, end, [&](int64_t i, int64_t lo, int64_t hi) {
          std::memset(static_cast<char*>(dense[i]->raw()) + lo, 0, hi - lo);
        });
      });
}

}  // namespace moetrain
