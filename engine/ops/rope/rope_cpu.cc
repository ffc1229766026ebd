#include "engine/ops/rope/rope_cpu.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/fast_math.h"
#include "engine/ops/rope/rope_math.h"

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

// cos and sin of p·θ^(−2i/Dh) for p < S, i < Dh/2, (S, Dh/2) row-major, computed in double.
struct RopeTable {
  int64_t seq_len;
  int64_t head_dim;
  float theta;
  std::vector<float> cos;
  std::vector<float> sin;
};

// The tables of the last few (S, Dh, θ): a model asks for the same one in every layer.
class RopeCache {
 public:
  std::shared_ptr<const RopeTable> Get(int64_t seq_len, int64_t head_dim, float theta) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& table : tables_) {
      if (table->seq_len == seq_len && table->head_dim == head_dim && table->theta == theta) {
        return table;
      }
    }
    auto table = std::make_shared<RopeTable>();
    *table = {seq_len, head_dim, theta, {}, {}};
    const int64_t half = head_dim / 2;
    table->cos.resize(seq_len * half);
    table->sin.resize(seq_len * half);
    for (int64_t p = 0; p < seq_len; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = RopeAngle(p, i, head_dim, theta);
        table->cos[p * half + i] = static_cast<float>(std::cos(angle));
        table->sin[p * half + i] = static_cast<float>(std::sin(angle));
      }
    }
    if (tables_.size() >= kMaxTables) tables_.erase(tables_.begin());
    tables_.push_back(table);
    return table;
  }

 private:
  static constexpr size_t kMaxTables = 8;
  std::mutex mu_;
  std::vector<std::shared_ptr<const RopeTable>> tables_ ABSL_GUARDED_BY(mu_);  // oldest first
};

}  // namespace

void ApplyRope(const ExecContext& ctx, const ops::AttentionShape& shape, float theta, bool inverse,
               TensorView x) {
  const int64_t cols = x.dim(1);
  static RopeCache* cache = new RopeCache();
  const std::shared_ptr<const RopeTable> table = cache->Get(shape.seq_len, shape.head_dim, theta);
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
