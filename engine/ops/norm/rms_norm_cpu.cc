#include "engine/ops/norm/rms_norm_cpu.h"

#include <algorithm>
#include <vector>

#include "engine/backend/cpu/rows.h"
#include "engine/core/fast_math.h"
#include "engine/ops/norm/rms_norm_math.h"

namespace moetrain::cpu {
namespace {

// Σ a_i·b_i in the order of rms_norm_math.h: 16 independent partial sums (so the loop
// vectorises), the tail, then the partials in lane order.
MOETRAIN_CLONES float Dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = kRmsNormDotLanes;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = RmsNormDotTerm(lanes[j], a[i + j], b[i + j]);
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum = RmsNormDotTerm(sum, a[i], b[i]);
  for (int j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

MOETRAIN_CLONES void RmsNormRow(const float* x, const float* w, float rstd, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = RmsNormValue(x[i], rstd, w[i]);
}

// d_x (+)= the input gradient; d_w_partial += the weight gradient's terms.
MOETRAIN_CLONES void RmsNormBackwardRow(const float* x, const float* w, const float* dy, float rstd,
                                        int64_t n, bool accumulate, float* scratch, float* d_x,
                                        float* d_w_partial) {
  float* g = scratch;
  for (int64_t i = 0; i < n; ++i) g[i] = dy[i] * w[i];
  const float c = RmsNormGradScale(Dot(g, x, n), rstd, n);
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) d_x[i] += RmsNormInputGrad(x[i], g[i], rstd, c);
  } else {
    for (int64_t i = 0; i < n; ++i) d_x[i] = RmsNormInputGrad(x[i], g[i], rstd, c);
  }
  for (int64_t i = 0; i < n; ++i) d_w_partial[i] += RmsNormWeightGradTerm(dy[i], x[i], rstd);
}

}  // namespace

void RmsNormForward(const ExecContext& ctx, TensorView x, TensorView weight, float eps,
                    TensorView out, TensorView rstd) {
  const int64_t t = x.dim(0), d = x.dim(1);
  const float* w = weight.data<float>();
  ctx.thread_pool().ParallelFor(t, RowGrain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x.data<float>() + r * d;
      const float s = RmsNormRstd(Dot(row, row, d), d, eps);
      rstd.data<float>()[r] = s;
      float* o = WriteRow(out, r, d, 0);
      RmsNormRow(row, w, s, d, o);
      FinishRow(out, r, d, o);
    }
  });
}

void RmsNormBackward(const ExecContext& ctx, const ops::RmsNormBackwardArgs& args) {
  const int64_t t = args.x.dim(0), d = args.x.dim(1);
  if (t == 0) return;
  // The weight gradient sums over tokens: each block of rows sums into its own partial row, and
  // the partials are added in block order (rms_norm_math.h).
  const int64_t block_rows = RmsNormWeightGradBlockRows(t);
  const int64_t blocks = (t + block_rows - 1) / block_rows;
  std::vector<float> partials(blocks * d, 0.0f);
  const float* w = args.weight.data<float>();
  ctx.thread_pool().ParallelFor(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t b = block_begin; b < block_end; ++b) {
      float* partial = partials.data() + b * d;
      for (int64_t r = b * block_rows; r < std::min(t, (b + 1) * block_rows); ++r) {
        const float* dy = ReadRow(args.d_out, r, d, 0);
        RmsNormBackwardRow(args.x.data<float>() + r * d, w, dy, args.rstd.data<float>()[r], d,
                           args.accumulate_d_x, Scratch(1, d), args.d_x.data<float>() + r * d,
                           partial);
      }
    }
  });
  float* d_w = args.d_weight.data<float>();
  ctx.thread_pool().ParallelFor(d, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float sum = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) sum += partials[b * d + i];
      d_w[i] += sum;
    }
  });
}

}  // namespace moetrain::cpu
