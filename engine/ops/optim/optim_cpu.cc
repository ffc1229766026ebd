#include "engine/ops/optim/optim_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/fast_math.h"

namespace moetrain::cpu {
namespace {

// Elements per ParallelFor chunk, at least: AdamW touches 28 bytes an element, so 32 Ki elements
// are ~1 MiB of traffic, far more than the hand-off costs.
constexpr int64_t kStepGrain = 1 << 15;
// The lighter passes (scale, NaN check) move 4–8 bytes an element.
constexpr int64_t kLightGrain = 1 << 16;
// The norm sums squares in the fixed order of kNormBlock and kNormLanes (optim_cpu.h), whatever
// the thread count or ISA.
// Elements the NaN check scans between looks at whether another chunk already found one.
constexpr int64_t kFiniteTile = 1 << 14;
// AdamW runs its three loops (below) over tiles this long, so the tile stays in L1 between them.
constexpr int64_t kAdamTile = 512;

// One AdamW update of n elements (adamw_math.h). std::sqrt keeps errno semantics (the build has
// no -fno-math-errno), which stops GCC from vectorising any loop that calls it; so the moments
// and the parameter update run as vector loops and only the square roots as a scalar one between.
MOETRAIN_CLONES MOETRAIN_NO_FP_CONTRACT void AdamWUpdate(float* __restrict p,
                                                         const float* __restrict g,
                                                         float* __restrict m, float* __restrict v,
                                                         int64_t n, const AdamWScalars s) {
  float root[kAdamTile];  // v, then √v
  for (int64_t start = 0; start < n; start += kAdamTile) {
    const int64_t len = std::min(kAdamTile, n - start);
    float* __restrict pt = p + start;
    const float* __restrict gt = g + start;
    float* __restrict mt = m + start;
    float* __restrict vt = v + start;
    for (int64_t i = 0; i < len; ++i) {
      AdamWMoments(gt[i], &mt[i], &vt[i], s);
      root[i] = vt[i];
    }
    for (int64_t i = 0; i < len; ++i) root[i] = std::sqrt(root[i]);
    for (int64_t i = 0; i < len; ++i) pt[i] = AdamWParameter(pt[i], mt[i], root[i], s);
  }
}

// The same with bf16 moments (AdamWUpdateElementBf16), widened into f32 tiles and rounded back.
MOETRAIN_CLONES MOETRAIN_NO_FP_CONTRACT void AdamWUpdateBf16(float* __restrict p,
                                                             const float* __restrict g,
                                                             uint16_t* __restrict m,
                                                             uint16_t* __restrict v, int64_t n,
                                                             const AdamWScalars s) {
  float mf[kAdamTile], vf[kAdamTile], root[kAdamTile];
  for (int64_t start = 0; start < n; start += kAdamTile) {
    const int64_t len = std::min(kAdamTile, n - start);
    float* __restrict pt = p + start;
    const float* __restrict gt = g + start;
    uint16_t* __restrict mt = m + start;
    uint16_t* __restrict vt = v + start;
    for (int64_t i = 0; i < len; ++i) {
      mf[i] = BF16BitsToFloat(mt[i]);
      vf[i] = BF16BitsToFloat(vt[i]);
      AdamWMoments(gt[i], &mf[i], &vf[i], s);
    }
    for (int64_t i = 0; i < len; ++i) root[i] = std::sqrt(vf[i]);
    for (int64_t i = 0; i < len; ++i) {
      pt[i] = AdamWParameter(pt[i], mf[i], root[i], s);
      mt[i] = FloatToBF16Bits(mf[i]);
      vt[i] = FloatToBF16Bits(vf[i]);
    }
  }
}

// lanes[i % kNormLanes] += x[i]² in f64, for i in [0, n).
MOETRAIN_CLONES MOETRAIN_NO_FP_CONTRACT void AccumulateSquares(const float* x, int64_t n,
                                                               double* lanes) {
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
MOETRAIN_CLONES bool HasNonFinite(const float* x, int64_t n) {
  uint32_t found = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    found |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return found != 0;
}

MOETRAIN_CLONES MOETRAIN_NO_FP_CONTRACT void ScaleInPlace(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// First element of each tensor laid end to end: tensor i is [offsets[i], offsets[i+1]).
std::vector<int64_t> Offsets(absl::Span<const TensorView> tensors) {
  std::vector<int64_t> offsets(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) offsets[i + 1] = offsets[i] + tensors[i].numel();
  return offsets;
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

}  // namespace

void AdamWStep(const ExecContext& ctx, const ops::AdamWStepArgs& args) {
  const std::vector<int64_t> offsets = Offsets(args.params);
  ctx.thread_pool().ParallelFor(offsets.back(), kStepGrain, [&](int64_t begin, int64_t end) {
    ForEachSegment(offsets, begin, end, [&](int64_t i, int64_t lo, int64_t hi) {
      const AdamWScalars& scalars = (*args.weight_decay)[i] ? args.decaying : args.plain;
      float* p = args.params[i].data<float>() + lo;
      const float* g = args.grads[i].data<float>() + lo;
      if (args.exp_avg[i].dtype() == DType::kBF16) {
        AdamWUpdateBf16(p, g, static_cast<uint16_t*>(args.exp_avg[i].raw()) + lo,
                        static_cast<uint16_t*>(args.exp_avg_sq[i].raw()) + lo, hi - lo, scalars);
      } else {
        AdamWUpdate(p, g, args.exp_avg[i].data<float>() + lo, args.exp_avg_sq[i].data<float>() + lo,
                    hi - lo, scalars);
      }
    });
  });
}

double SquaredNorm(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  const std::vector<int64_t> offsets = Offsets(tensors);
  const int64_t total = offsets.back();
  const int64_t num_blocks = (total + kNormBlock - 1) / kNormBlock;
  std::vector<double> block_sums(num_blocks);
  ctx.thread_pool().ParallelFor(num_blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      double lanes[kNormLanes] = {};
      ForEachSegment(offsets, b * kNormBlock, std::min(total, (b + 1) * kNormBlock),
                     [&](int64_t i, int64_t lo, int64_t hi) {
                       AccumulateSquares(tensors[i].data<float>() + lo, hi - lo, lanes);
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

void ScaleTensors(const ExecContext& ctx, absl::Span<const TensorView> tensors, float scale) {
  const std::vector<int64_t> offsets = Offsets(tensors);
  ctx.thread_pool().ParallelFor(offsets.back(), kLightGrain, [&](int64_t begin, int64_t end) {
    ForEachSegment(offsets, begin, end, [&](int64_t i, int64_t lo, int64_t hi) {
      ScaleInPlace(tensors[i].data<float>() + lo, hi - lo, scale);
    });
  });
}

bool AllFinite(const ExecContext& ctx, absl::Span<const TensorView> tensors) {
  const std::vector<int64_t> offsets = Offsets(tensors);
  std::atomic<bool> found{false};
  ctx.thread_pool().ParallelFor(offsets.back(), kLightGrain, [&](int64_t begin, int64_t end) {
    for (int64_t start = begin; start < end; start += kFiniteTile) {
      if (found.load(std::memory_order_relaxed)) return;
      ForEachSegment(offsets, start, std::min(end, start + kFiniteTile),
                     [&](int64_t i, int64_t lo, int64_t hi) {
                       if (HasNonFinite(tensors[i].data<float>() + lo, hi - lo)) {
                         found.store(true, std::memory_order_relaxed);
                       }
                     });
    }
  });
  return !found.load();
}

absl::Status AdamWMomentsError(std::string_view m_name, std::string_view v_name, int64_t j,
                               float m_j, float v_j) {
  if (!AdamWIsFinite(m_j)) {
    return absl::InvalidArgumentError(absl::StrCat(absl::string_view(m_name.data(), m_name.size()),
                                                   "[", j, "] = ", m_j, " is not finite"));
  }
  return absl::InvalidArgumentError(absl::StrCat(absl::string_view(v_name.data(), v_name.size()),
                                                 "[", j, "] = ", v_j,
                                                 " must be non-negative and finite"));
}

absl::Status CheckAdamWMoments(std::string_view m_name, TensorView m, std::string_view v_name,
                               TensorView v) {
  const float* m_data = m.data<float>();
  const float* v_data = v.data<float>();
  for (int64_t j = 0; j < m.numel(); ++j) {
    if (!AdamWMomentsValid(m_data[j], v_data[j])) {
      return AdamWMomentsError(m_name, v_name, j, m_data[j], v_data[j]);
    }
  }
  return absl::OkStatus();
}

}  // namespace moetrain::cpu
