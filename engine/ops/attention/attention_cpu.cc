#include "engine/ops/attention/attention_cpu.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/core/fast_math.h"
#include "engine/core/thread_pool.h"

namespace moetrain::cpu {
namespace {

// Queries and keys per tile. Every scratch panel is kBlock floats wide, so the inner loops below
// have a constant trip count and GCC turns them into whole vector registers.
constexpr int64_t kBlock = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// `rows` rows of C += A · B with A(r, t) = a[r·a_row + t·a_col]: the rows' accumulators stay in
// registers (16 zmm for four rows under AVX-512) while B streams through once.
template <int kRows>
inline __attribute__((always_inline)) void PanelRows(const float* a, int64_t a_row, int64_t a_col,
                                                     int64_t depth, const float* b, float* c,
                                                     const float* c_scale) {
  float acc[kRows][kBlock];
  for (int r = 0; r < kRows; ++r) {
    for (int l = 0; l < kBlock; ++l) acc[r][l] = c_scale ? c[r * kBlock + l] * c_scale[l] : 0.0f;
  }
  for (int64_t t = 0; t < depth; ++t) {
    const float* b_row = b + t * kBlock;
    for (int r = 0; r < kRows; ++r) {
      const float a_rt = a[r * a_row + t * a_col];
      for (int l = 0; l < kBlock; ++l) acc[r][l] += a_rt * b_row[l];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int l = 0; l < kBlock; ++l) c[r * kBlock + l] = acc[r][l];
  }
}

// C (rows, kBlock) = [C ⊙ c_scale +] A (rows, depth) · B (depth, kBlock), A strided as in
// PanelRows (a_col = 1 reads rows of a tensor, a_row = 1 its transpose), B and C contiguous
// panels; c_scale (kBlock) scales each column of C, null overwrites C. Every product of the
// attention is one of these, with the tile edge as C's columns: ~150 GFLOPS per AVX-512 core.
MOETRAIN_CLONES void PanelGemm(const float* a, int64_t a_row, int64_t a_col, int rows,
                               int64_t depth, const float* b, float* c, const float* c_scale) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    PanelRows<4>(a + r * a_row, a_row, a_col, depth, b, c + r * kBlock, c_scale);
  }
  for (; r < rows; ++r)
    PanelRows<1>(a + r * a_row, a_row, a_col, depth, b, c + r * kBlock, c_scale);
}

// Column scales of 1, for C += A · B.
const float* Ones() {
  alignas(64) static const std::array<float, kBlock> ones = [] {
    std::array<float, kBlock> a;
    a.fill(1.0f);
    return a;
  }();
  return ones.data();
}

// One online-softmax step over a transposed score tile st (keys j < num_keys, kBlock query lanes
// i): scales the scores, masks keys after the query on the diagonal tile, raises each column's
// running max m, rescales its running sum l and returns the rescale factor in alpha, then turns
// st into e^(s − m) and adds it to l. Columns are lanes, so the reductions over keys are plain
// vector operations, in a fixed order.
MOETRAIN_CLONES void OnlineSoftmaxTile(float* st, int num_keys, bool diagonal, float scale,
                                       float* m, float* l, float* alpha) {
  float new_max[kBlock];
  for (int i = 0; i < kBlock; ++i) new_max[i] = m[i];
  for (int j = 0; j < num_keys; ++j) {
    float* row = st + j * kBlock;
    for (int i = 0; i < kBlock; ++i) {
      const float s = diagonal && j > i ? kNegInf : row[i] * scale;
      row[i] = s;
      new_max[i] = std::max(new_max[i], s);
    }
  }
  for (int i = 0; i < kBlock; ++i) {
    alpha[i] = FastExp(m[i] - new_max[i]);  // m = −inf on the first tile: alpha = 0
    l[i] *= alpha[i];
    m[i] = new_max[i];
  }
  for (int j = 0; j < num_keys; ++j) {
    float* row = st + j * kBlock;
    for (int i = 0; i < kBlock; ++i) {
      row[i] = FastExp(row[i] - m[i]);
      l[i] += row[i];
    }
  }
}

// Backward of the softmax on a tile whose rows are queries (keys are lanes): s ← P = e^(s·scale −
// lse_i), masked after the query on the diagonal; dp ← dS = P ⊙ (dP − D_i).
MOETRAIN_CLONES void SoftmaxGradRows(float* s, float* dp, int rows, bool diagonal, float scale,
                                     const float* lse, const float* dot) {
  for (int i = 0; i < rows; ++i) {
    float* s_row = s + i * kBlock;
    float* dp_row = dp + i * kBlock;
    const float lse_i = lse[i], dot_i = dot[i];  // loaded once: the stores could alias them
    for (int j = 0; j < kBlock; ++j) {
      const float p = diagonal && j > i ? 0.0f : FastExp(s_row[j] * scale - lse_i);
      s_row[j] = p;
      dp_row[j] = p * (dp_row[j] - dot_i);
    }
  }
}

// The same on a transposed tile (rows are keys, queries are lanes, lse and D per lane).
MOETRAIN_CLONES void SoftmaxGradCols(float* st, float* dpt, int rows, bool diagonal, float scale,
                                     const float* lse, const float* dot) {
  for (int j = 0; j < rows; ++j) {
    float* s_row = st + j * kBlock;
    float* dp_row = dpt + j * kBlock;
    for (int i = 0; i < kBlock; ++i) {
      const float p = diagonal && j > i ? 0.0f : FastExp(s_row[i] * scale - lse[i]);
      s_row[i] = p;
      dp_row[i] = p * (dp_row[i] - dot[i]);
    }
  }
}

// A (rows, Dh) block of a tensor with row stride ld, transposed into a (Dh, kBlock) panel;
// columns from `rows` on are zero, so that lanes past the sequence stay finite.
// (GCC does not vectorise these strided copies; they run once per task, not per tile.)
void LoadTransposed(const float* src, int64_t ld, int64_t rows, int64_t head_dim, float* panel) {
  if (rows < kBlock) std::memset(panel, 0, sizeof(float) * head_dim * kBlock);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < head_dim; ++d) panel[d * kBlock + r] = src[r * ld + d];
  }
}

// The inverse: rows [0, rows) of dst (row stride ld) = scale · panelᵀ.
void StoreTransposed(const float* panel, int64_t rows, int64_t head_dim, float scale, float* dst,
                     int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < head_dim; ++d) dst[r * ld + d] = panel[d * kBlock + r] * scale;
  }
}

// Task t of n in the order 0, n−1, 1, n−2, …: under the causal triangle block b costs ~b + 1 (or
// ~n − b), so any run of consecutive tasks, as ParallelFor hands them out, costs about the same.
int64_t Interleaved(int64_t t, int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// Per-thread scratch, 64-byte aligned.
class Scratch {
 public:
  explicit Scratch(int64_t floats) : buffer_(Tensor::Empty(DType::kF32, {floats})) {}
  float* Take(int64_t floats) {
    float* p = buffer_.data<float>() + used_;
    used_ += (floats + 15) / 16 * 16;
    return p;
  }

 private:
  Tensor buffer_;
  int64_t used_ = 0;
};


// Extents and row strides shared by the forward and backward tasks.
struct Layout {
  int64_t batch, seq_len, heads, kv_heads, head_dim;  // as in AttentionShape
  int64_t group = heads / kv_heads;
  int64_t q_ld = heads * head_dim, kv_ld = kv_heads * head_dim;  // row strides of q and k, v
  int64_t blocks = (seq_len + kBlock - 1) / kBlock;
  float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  int BlockRows(int64_t block) const {
    return static_cast<int>(std::min(kBlock, seq_len - block * kBlock));
  }
  // Row `block`·kBlock of sequence b, head h, in a tensor of row stride ld.
  int64_t Offset(int64_t b, int64_t block, int64_t h, int64_t ld) const {
    return (b * seq_len + block * kBlock) * ld + h * head_dim;
  }
  // Position `block`·kBlock of (b, h) in a (B, H, S) tensor.
  int64_t RowStat(int64_t b, int64_t h, int64_t block) const {
    return (b * heads + h) * seq_len + block * kBlock;
  }
};

Layout LayoutOf(const ops::AttentionShape& s) {
  return {s.batch, s.seq_len, s.num_heads, s.num_kv_heads, s.head_dim};
}

}  // namespace

// Forward task (b, h, query block): Qᵀ in a panel, then for each key block up to the diagonal
// the transposed score tile Sᵀ = K·Qᵀ, an online-softmax step, and Oᵀ = alpha ⊙ Oᵀ + Vᵀ·Pᵀ.
void CausalAttentionForward(const ExecContext& ctx, const ops::AttentionShape& shape, TensorView q,
                            TensorView k, TensorView v, TensorView out, TensorView lse) {
  const Layout ly = LayoutOf(shape);
  const int64_t panel = ly.head_dim * kBlock;
  ctx.thread_pool().ParallelFor(
      ly.batch * ly.heads * ly.blocks, 1, [&](int64_t begin, int64_t end) {
        Scratch scratch(2 * panel + kBlock * kBlock + 3 * kBlock + 64);
        float* qt = scratch.Take(panel);            // (Dh, kBlock) Qᵀ
        float* ot = scratch.Take(panel);            // (Dh, kBlock) unnormalised Oᵀ
        float* st = scratch.Take(kBlock * kBlock);  // (keys, queries) score tile, then Pᵀ
        float* m = scratch.Take(kBlock);            // running max per query
        float* l = scratch.Take(kBlock);            // running sum per query
        float* alpha = scratch.Take(kBlock);
        for (int64_t task = begin; task < end; ++task) {
          const int64_t b = task / (ly.heads * ly.blocks);
          const int64_t h = task / ly.blocks % ly.heads;
          const int64_t qb = Interleaved(task % ly.blocks, ly.blocks);
          const int64_t hk = h / ly.group;
          const int num_queries = ly.BlockRows(qb);
          LoadTransposed(q.data<float>() + ly.Offset(b, qb, h, ly.q_ld), ly.q_ld, num_queries,
                         ly.head_dim, qt);
          std::fill(ot, ot + panel, 0.0f);
          std::fill(m, m + kBlock, kNegInf);
          std::fill(l, l + kBlock, 0.0f);
          for (int64_t kb = 0; kb <= qb; ++kb) {
            const float* k_rows = k.data<float>() + ly.Offset(b, kb, hk, ly.kv_ld);
            const float* v_rows = v.data<float>() + ly.Offset(b, kb, hk, ly.kv_ld);
            const int num_keys = ly.BlockRows(kb);
            PanelGemm(k_rows, ly.kv_ld, 1, num_keys, ly.head_dim, qt, st, nullptr);
            OnlineSoftmaxTile(st, num_keys, kb == qb, ly.scale, m, l, alpha);
            PanelGemm(v_rows, 1, ly.kv_ld, static_cast<int>(ly.head_dim), num_keys, st, ot, alpha);
          }
          float* out_rows = out.data<float>() + ly.Offset(b, qb, h, ly.q_ld);
          float* lse_row = lse.data<float>() + ly.RowStat(b, h, qb);
          for (int i = 0; i < num_queries; ++i) {
            const float inv_l = 1.0f / l[i];
            for (int64_t d = 0; d < ly.head_dim; ++d) {
              out_rows[i * ly.q_ld + d] = ot[d * kBlock + i] * inv_l;
            }
            lse_row[i] = m[i] + std::log(l[i]);
          }
        }
      });
}

// Backward in two passes, each writing disjoint outputs, so no reduction depends on timing:
//   d_k, d_v per (b, kv head, key block): over the group's query heads and the query blocks from
//     the diagonal on, P and dS tiles (queries × keys), dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS;
//   d_q per (b, head, query block): over key blocks to the diagonal, Pᵀ and dSᵀ tiles (keys ×
//     queries), dQᵀ += Kᵀ·dSᵀ.
// The second pass recomputes S and dP (seven tile products instead of five) so that neither pass
// needs atomics or per-thread copies of d_q.
void CausalAttentionBackward(const ExecContext& ctx, const ops::AttentionShape& shape,
                             TensorView q, TensorView k, TensorView v, TensorView out,
                             TensorView lse, TensorView d_out, TensorView d_q, TensorView d_k,
                             TensorView d_v) {
  const Layout ly = LayoutOf(shape);
  const int64_t rows = ly.batch * ly.seq_len;
  ThreadPool& pool = ctx.thread_pool();

  // D_i = ⟨dO_i, O_i⟩ = Σ_j P_ij·dP_ij (B, H, S), summed in double.
  Tensor dot = Tensor::Empty(DType::kF32, {ly.batch, ly.heads, ly.seq_len});
  pool.ParallelFor(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / ly.seq_len;
      const int64_t pos = row % ly.seq_len;
      for (int64_t h = 0; h < ly.heads; ++h) {
        const float* o = out.data<float>() + row * ly.q_ld + h * ly.head_dim;
        const float* g = d_out.data<float>() + row * ly.q_ld + h * ly.head_dim;
        double sum = 0.0;
        for (int64_t d = 0; d < ly.head_dim; ++d) sum += static_cast<double>(o[d]) * g[d];
        dot.data<float>()[(b * ly.heads + h) * ly.seq_len + pos] = static_cast<float>(sum);
      }
    }
  });

  const int64_t panel = ly.head_dim * kBlock;
  const int64_t tile = kBlock * kBlock;
  pool.ParallelFor(ly.batch * ly.kv_heads * ly.blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(4 * panel + 2 * tile + 64);
    float* kt = scratch.Take(panel);   // (Dh, keys) Kᵀ
    float* vt = scratch.Take(panel);   // (Dh, keys) Vᵀ
    float* dkt = scratch.Take(panel);  // (Dh, keys) dKᵀ / scale
    float* dvt = scratch.Take(panel);  // (Dh, keys) dVᵀ
    float* s = scratch.Take(tile);     // (queries, keys) S, then P
    float* dp = scratch.Take(tile);    // (queries, keys) dP, then dS
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (ly.kv_heads * ly.blocks);
      const int64_t hk = task / ly.blocks % ly.kv_heads;
      const int64_t kb = Interleaved(task % ly.blocks, ly.blocks);
      const int num_keys = ly.BlockRows(kb);
      const int64_t kv_offset = ly.Offset(b, kb, hk, ly.kv_ld);
      LoadTransposed(k.data<float>() + kv_offset, ly.kv_ld, num_keys, ly.head_dim, kt);
      LoadTransposed(v.data<float>() + kv_offset, ly.kv_ld, num_keys, ly.head_dim, vt);
      std::fill(dkt, dkt + panel, 0.0f);
      std::fill(dvt, dvt + panel, 0.0f);
      for (int64_t h = hk * ly.group; h < (hk + 1) * ly.group; ++h) {
        for (int64_t qb = kb; qb < ly.blocks; ++qb) {
          const float* q_rows = q.data<float>() + ly.Offset(b, qb, h, ly.q_ld);
          const float* g_rows = d_out.data<float>() + ly.Offset(b, qb, h, ly.q_ld);
          const int num_queries = ly.BlockRows(qb);
          const int dh = static_cast<int>(ly.head_dim);
          PanelGemm(q_rows, ly.q_ld, 1, num_queries, ly.head_dim, kt, s, nullptr);
          PanelGemm(g_rows, ly.q_ld, 1, num_queries, ly.head_dim, vt, dp, nullptr);
          SoftmaxGradRows(s, dp, num_queries, qb == kb, ly.scale,
                          lse.data<float>() + ly.RowStat(b, h, qb),
                          dot.data<float>() + ly.RowStat(b, h, qb));
          PanelGemm(g_rows, 1, ly.q_ld, dh, num_queries, s, dvt, Ones());
          PanelGemm(q_rows, 1, ly.q_ld, dh, num_queries, dp, dkt, Ones());
        }
      }
      StoreTransposed(dkt, num_keys, ly.head_dim, ly.scale, d_k.data<float>() + kv_offset,
                      ly.kv_ld);
      StoreTransposed(dvt, num_keys, ly.head_dim, 1.0f, d_v.data<float>() + kv_offset, ly.kv_ld);
    }
  });

  pool.ParallelFor(ly.batch * ly.heads * ly.blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch(3 * panel + 2 * tile + 2 * kBlock + 64);
    float* qt = scratch.Take(panel);   // (Dh, queries) Qᵀ
    float* gt = scratch.Take(panel);   // (Dh, queries) dOᵀ
    float* dqt = scratch.Take(panel);  // (Dh, queries) dQᵀ / scale
    float* st = scratch.Take(tile);    // (keys, queries) Sᵀ, then Pᵀ
    float* dpt = scratch.Take(tile);   // (keys, queries) dPᵀ, then dSᵀ
    float* lse_lanes = scratch.Take(kBlock);
    float* dot_lanes = scratch.Take(kBlock);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (ly.heads * ly.blocks);
      const int64_t h = task / ly.blocks % ly.heads;
      const int64_t qb = Interleaved(task % ly.blocks, ly.blocks);
      const int64_t hk = h / ly.group;
      const int num_queries = ly.BlockRows(qb);
      const int64_t q_offset = ly.Offset(b, qb, h, ly.q_ld);
      LoadTransposed(q.data<float>() + q_offset, ly.q_ld, num_queries, ly.head_dim, qt);
      LoadTransposed(d_out.data<float>() + q_offset, ly.q_ld, num_queries, ly.head_dim, gt);
      std::fill(dqt, dqt + panel, 0.0f);
      std::fill(lse_lanes, lse_lanes + kBlock, 0.0f);
      std::fill(dot_lanes, dot_lanes + kBlock, 0.0f);
      std::copy_n(lse.data<float>() + ly.RowStat(b, h, qb), num_queries, lse_lanes);
      std::copy_n(dot.data<float>() + ly.RowStat(b, h, qb), num_queries, dot_lanes);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const float* k_rows = k.data<float>() + ly.Offset(b, kb, hk, ly.kv_ld);
        const float* v_rows = v.data<float>() + ly.Offset(b, kb, hk, ly.kv_ld);
        const int num_keys = ly.BlockRows(kb);
        PanelGemm(k_rows, ly.kv_ld, 1, num_keys, ly.head_dim, qt, st, nullptr);
        PanelGemm(v_rows, ly.kv_ld, 1, num_keys, ly.head_dim, gt, dpt, nullptr);
        SoftmaxGradCols(st, dpt, num_keys, kb == qb, ly.scale, lse_lanes, dot_lanes);
        PanelGemm(k_rows, 1, ly.kv_ld, static_cast<int>(ly.head_dim), num_keys, dpt, dqt, Ones());
      }
      StoreTransposed(dqt, num_queries, ly.head_dim, ly.scale, d_q.data<float>() + q_offset,
                      ly.q_ld);
    }
  });
}

}  // namespace moetrain::cpu
