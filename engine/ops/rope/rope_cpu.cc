#include "engine/ops/rope/rope_cpu.h"

#include <algorithm>
#include <memory>

#include "engine/core/fast_math.h"
#include "engine/ops/rope/rope_math.h"
#include "engine/ops/rope/rope_table.h"

namespace moetrain::cpu {
namespace {

// RoPE on one head: (x_i, x_{i+half}) rotated by the angle whose cos and sin are given;
// sign = −1 rotates back.
MOETRAIN_CLONES void RotateHead(float* x, const float* cos, const float* sin, int64_t half,
                                float sign) {
  for (int64_t i = 0; i < half; ++i) {
    RopeRotate(x[i], x[i + half], cos[i], sign * sin[i], &x[i], &x[i + half]);
  }
}

}  // namespace

void ApplyRope(const ExecContext& ctx, const ops::AttentionShape& shape, float theta, bool inverse,
               TensorView x) {
  const int64_t cols = x.dim(1);
  const std::shared_ptr<const ops::RopeTable> table =
      ops::CachedRopeTable(shape.seq_len, shape.head_dim, theta);
  const int64_t half = shape.head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  auto rotate_rows = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t at = row % shape.seq_len * half;  // the position's angles
      for (int64_t c = 0; c < cols; c += shape.head_dim) {
        RotateHead(x.data<float>() + row * cols + c, &table->cos[at], &table->sin[at], half, sign);
      }
    }
  };
  ctx.thread_pool().ParallelFor(x.dim(0), std::max<int64_t>(1, 16384 / cols), rotate_rows);
}

}  // namespace moetrain::cpu
