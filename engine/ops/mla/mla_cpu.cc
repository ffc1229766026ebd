#include "engine/ops/mla/mla_cpu.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/ops/mla/mla_math.h"
#include "engine/ops/rope/rope_table.h"

namespace moetrain::cpu {
namespace {

// Tokens per task: about 16K elements of work.
int64_t Grain(int64_t row_elements) { return std::max<int64_t>(1, 16384 / row_elements); }

}  // namespace

void MlaQkvForward(const ExecContext& ctx, const ops::MlaShape& shape, float theta,
                   TensorView q_full, TensorView k_rope, TensorView kv, TensorView q, TensorView k,
                   TensorView v) {
  const int64_t heads = shape.num_heads, nope = shape.qk_nope, rope = shape.qk_rope;
  const int64_t dqk = shape.qk_head_dim(), dv = shape.v_head_dim, kv_width = nope + dv;
  const int64_t half = rope / 2;
  const std::shared_ptr<const ops::RopeTable> table =
      ops::CachedRopeTable(shape.seq_len, rope, theta);
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = &table->cos[t % shape.seq_len * half];
      const float* sin = &table->sin[t % shape.seq_len * half];
      const float* shared_key = k_rope.data<float>() + t * rope;
      for (int64_t h = 0; h < heads; ++h) {
        const float* q_in = q_full.data<float>() + (t * heads + h) * dqk;
        const float* kv_in = kv.data<float>() + (t * heads + h) * kv_width;
        float* q_out = q.data<float>() + (t * heads + h) * dqk;
        float* k_out = k.data<float>() + (t * heads + h) * dqk;
        float* v_out = v.data<float>() + (t * heads + h) * dqk;
        std::memcpy(q_out, q_in, nope * sizeof(float));
        std::memcpy(k_out, kv_in, nope * sizeof(float));
        for (int64_t r = 0; r < rope; ++r) {
          q_out[nope + r] = MlaRopeFeature(q_in + nope, r, half, cos, sin);
          k_out[nope + r] = MlaRopeFeature(shared_key, r, half, cos, sin);
        }
        std::memcpy(v_out, kv_in + nope, dv * sizeof(float));
        std::fill(v_out + dv, v_out + dqk, 0.0f);
      }
    }
  };
  ctx.thread_pool().ParallelFor(shape.tokens(), Grain(3 * heads * dqk), rows);
}

void MlaQkvBackward(const ExecContext& ctx, const ops::MlaShape& shape, float theta, TensorView d_q,
                    TensorView d_k, TensorView d_v, TensorView d_q_full, TensorView d_k_rope,
                    TensorView d_kv) {
  const int64_t heads = shape.num_heads, nope = shape.qk_nope, rope = shape.qk_rope;
  const int64_t dqk = shape.qk_head_dim(), dv = shape.v_head_dim, kv_width = nope + dv;
  const int64_t half = rope / 2;
  const std::shared_ptr<const ops::RopeTable> table =
      ops::CachedRopeTable(shape.seq_len, rope, theta);
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = &table->cos[t % shape.seq_len * half];
      const float* sin = &table->sin[t % shape.seq_len * half];
      const float* d_k_row = d_k.data<float>() + t * heads * dqk;
      for (int64_t h = 0; h < heads; ++h) {
        const float* dq_in = d_q.data<float>() + (t * heads + h) * dqk;
        const float* dk_in = d_k_row + h * dqk;
        const float* dv_in = d_v.data<float>() + (t * heads + h) * dqk;
        float* dq_out = d_q_full.data<float>() + (t * heads + h) * dqk;
        float* dkv_out = d_kv.data<float>() + (t * heads + h) * kv_width;
        std::memcpy(dq_out, dq_in, nope * sizeof(float));
        for (int64_t m = 0; m < rope; ++m) {
          dq_out[nope + m] = MlaRopeFeatureGrad(dq_in + nope, m, half, cos, sin);
        }
        std::memcpy(dkv_out, dk_in, nope * sizeof(float));
        std::memcpy(dkv_out + nope, dv_in, dv * sizeof(float));
      }
      float* dk_rope_out = d_k_rope.data<float>() + t * rope;
      for (int64_t m = 0; m < rope; ++m) {
        dk_rope_out[m] = MlaSharedKeyGrad(d_k_row, heads, dqk, nope, m, half, cos, sin);
      }
    }
  };
  ctx.thread_pool().ParallelFor(shape.tokens(), Grain(3 * heads * dqk), rows);
}

void MlaCopyHeads(const ExecContext& ctx, const ops::MlaShape& shape, TensorView wide,
                  TensorView narrow, bool widen) {
  const int64_t heads = shape.num_heads, dqk = shape.qk_head_dim(), dv = shape.v_head_dim;
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin * heads; row < end * heads; ++row) {  // (token, head)
      float* w = wide.data<float>() + row * dqk;
      float* n = narrow.data<float>() + row * dv;
      if (widen) {
        std::memcpy(w, n, dv * sizeof(float));
        std::fill(w + dv, w + dqk, 0.0f);
      } else {
        std::memcpy(n, w, dv * sizeof(float));
      }
    }
  };
  ctx.thread_pool().ParallelFor(shape.tokens(), Grain(heads * dqk), rows);
}

}  // namespace moetrain::cpu
