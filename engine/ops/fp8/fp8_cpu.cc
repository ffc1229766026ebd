#include "engine/ops/fp8/fp8_cpu.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/backend/cpu/rows.h"
#include "engine/core/dtype_math.h"
#include "engine/core/fast_math.h"
#include "engine/core/fp8_math.h"

namespace moetrain::cpu {
namespace {

using ops::Fp8Scaling;
using ops::Fp8Tensor;

constexpr int64_t kBlock = 128;   // kBlock1x128 and kBlock128x128
constexpr int64_t kMxBlock = 32;  // kMx1x32

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t Pad4(int64_t n) { return (n + 3) / 4 * 4; }

// The largest finite value of the source dtype: the block scalings' value_for_inf, as TE's
// blockwise kernels take it from their input type.
float MaxFiniteOf(DType dtype) { return dtype == DType::kBF16 ? BF16BitsToFloat(0x7F7F) : FLT_MAX; }

// Row i of the quantised tensor as f32: src row i, or with transpose src column i (gathered).
// In place when f32 and not transposed, else in per-thread scratch `slot`.
const float* SourceRow(const TensorView& src, bool transpose, int64_t i, int64_t cols, int slot) {
  if (!transpose) return ReadRow(src, i, cols, slot);
  const int64_t src_cols = src.dim(1);
  float* row = Scratch(slot, cols);
  if (src.dtype() == DType::kF32) {
    const float* p = src.data<float>() + i;
    for (int64_t j = 0; j < cols; ++j) row[j] = p[j * src_cols];
  } else {
    const BF16* p = src.data<BF16>() + i;
    for (int64_t j = 0; j < cols; ++j) row[j] = BF16BitsToFloat(p[j * src_cols].bits);
  }
  return row;
}

MOETRAIN_CLONES float SpanAmax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = Fp8AmaxFold(amax, x[j]);
  return amax;
}

// q[j] = QuantizeFp8(x[j] · multiplier); returns how many scaled values saturated.
MOETRAIN_CLONES int64_t QuantizeSpan(const float* x, int64_t n, float multiplier, Fp8Format format,
                                     uint8_t* q) {
  int64_t saturated = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float y = x[j] * multiplier;
    q[j] = QuantizeFp8(y, format);
    saturated += Fp8Saturates(y, format) ? 1 : 0;
  }
  return saturated;
}

// Row i of the FP8 data, its padding columns zeroed.
uint8_t* DataRow(const Fp8Tensor& t, int64_t i) {
  const int64_t padded = ops::Fp8PaddedCols(t.cols);
  uint8_t* row = static_cast<uint8_t*>(t.data.raw()) + i * padded;
  std::memset(row + t.cols, 0, static_cast<size_t>(padded - t.cols));
  return row;
}

// Per-row statistics, reduced in row order at the end (max and integer sum: any order gives
// the same result, so the thread count does not matter).
struct RowStats {
  explicit RowStats(int64_t rows) : amax(rows, 0.0f), saturated(rows, 0) {}
  void Write(const ops::Fp8QuantizeArgs& args) const {
    float total_amax = 0.0f;
    int64_t total_saturated = 0;
    for (size_t i = 0; i < amax.size(); ++i) {
      total_amax = Fp8AmaxFold(total_amax, amax[i]);
      total_saturated += saturated[i];
    }
    if (!args.amax.empty()) {
      float* a = args.amax.data<float>();
      a[0] = Fp8AmaxFold(a[0], total_amax);
    }
    if (!args.saturated.empty()) args.saturated.data<int64_t>()[0] += total_saturated;
  }
  std::vector<float> amax;
  std::vector<int64_t> saturated;
};

void QuantizeTensorScaling(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args,
                           RowStats* stats) {
  const Fp8Tensor& out = args.out;
  const int64_t rows = out.rows, cols = out.cols;
  const float fp8_max = Fp8Max(out.format);
  float scale;
  if (args.compute_scale) {
    // Current scaling: the scale of the whole source's amax, then the quantisation with it.
    std::vector<float> row_amax(rows, 0.0f);
    ctx.thread_pool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        row_amax[i] = SpanAmax(SourceRow(args.src, args.transpose, i, cols, 0), cols);
      }
    });
    float amax = 0.0f;
    for (float a : row_amax) amax = Fp8AmaxFold(amax, a);
    scale = ScaleFromAmax(amax, fp8_max, args.pow2_scales, args.amax_epsilon, FLT_MAX);
    args.scale.data<float>()[0] = scale;
  } else {
    scale = args.scale.data<float>()[0];
  }
  out.scale_inv.data<float>()[0] = Fp8ScaleInv(scale);
  ctx.thread_pool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* x = SourceRow(args.src, args.transpose, i, cols, 0);
      stats->amax[i] = SpanAmax(x, cols);
      stats->saturated[i] = QuantizeSpan(x, cols, scale, out.format, DataRow(out, i));
    }
  });
}

// Quantises every row of args.out in blocks of `block` columns (the last one maybe shorter), rows
// in parallel: block b of row i, of amax `amax`, is multiplied by block_multiplier(i, b, amax),
// which also stores the block's scale_inv. Records each row's amax and saturated count in stats.
template <typename BlockMultiplier>
void QuantizeRowsInBlocks(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args, int64_t block,
                          const BlockMultiplier& block_multiplier, RowStats* stats) {
  const Fp8Tensor& out = args.out;
  const int64_t rows = out.rows, cols = out.cols, blocks = CeilDiv(cols, block);
  ctx.thread_pool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* x = SourceRow(args.src, args.transpose, i, cols, 0);
      uint8_t* q = DataRow(out, i);
      float row_amax = 0.0f;
      int64_t saturated = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t j0 = b * block, n = std::min(block, cols - j0);
        const float amax = SpanAmax(x + j0, n);
        const float multiplier = block_multiplier(i, b, amax);
        saturated += QuantizeSpan(x + j0, n, multiplier, out.format, q + j0);
        row_amax = Fp8AmaxFold(row_amax, amax);
      }
      stats->amax[i] = row_amax;
      stats->saturated[i] = saturated;
    }
  });
}

void QuantizeBlock1x128(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args, RowStats* stats) {
  const Fp8Tensor& out = args.out;
  const int64_t rows = out.rows, cols = out.cols;
  const int64_t blocks = CeilDiv(cols, kBlock), padded_rows = Pad4(rows);
  const float fp8_max = Fp8Max(out.format), value_for_inf = MaxFiniteOf(args.src.dtype());
  float* scale_inv = out.scale_inv.data<float>();
  QuantizeRowsInBlocks(
      ctx, args, kBlock,
      [&](int64_t i, int64_t b, float amax) {
        const float scale =
            ScaleFromAmax(amax, fp8_max, args.pow2_scales, args.amax_epsilon, value_for_inf);
        // [block][padded_rows]: the rows of one block are contiguous (GEMM-ready, transposed).
        scale_inv[b * padded_rows + i] = Fp8ScaleInv(scale);
        return scale;
      },
      stats);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t i = rows; i < padded_rows; ++i) scale_inv[b * padded_rows + i] = 0.0f;
  }
}

void QuantizeBlock128x128(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args,
                          RowStats* stats) {
  const Fp8Tensor& out = args.out;
  const int64_t rows = out.rows, cols = out.cols;
  const int64_t row_blocks = CeilDiv(rows, kBlock), col_blocks = CeilDiv(cols, kBlock);
  const int64_t padded_col_blocks = Pad4(col_blocks);
  const float fp8_max = Fp8Max(out.format), value_for_inf = MaxFiniteOf(args.src.dtype());
  float* scale_inv = out.scale_inv.data<float>();
  // One task per band of 128 rows: a tile's scale needs all its rows' amaxes first.
  ctx.thread_pool().ParallelFor(row_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scales(col_blocks);
    for (int64_t rb = begin; rb < end; ++rb) {
      const int64_t i0 = rb * kBlock, i1 = std::min(rows, i0 + kBlock);
      std::vector<float> amax(col_blocks, 0.0f);
      for (int64_t i = i0; i < i1; ++i) {
        const float* x = SourceRow(args.src, args.transpose, i, cols, 0);
        float row_amax = 0.0f;
        for (int64_t b = 0; b < col_blocks; ++b) {
          const int64_t j0 = b * kBlock, n = std::min(kBlock, cols - j0);
          const float a = SpanAmax(x + j0, n);
          amax[b] = Fp8AmaxFold(amax[b], a);
          row_amax = Fp8AmaxFold(row_amax, a);
        }
        stats->amax[i] = row_amax;
      }
      float* band_scale_inv = scale_inv + rb * padded_col_blocks;
      for (int64_t b = 0; b < col_blocks; ++b) {
        scales[b] =
            ScaleFromAmax(amax[b], fp8_max, args.pow2_scales, args.amax_epsilon, value_for_inf);
        band_scale_inv[b] = Fp8ScaleInv(scales[b]);
      }
      for (int64_t b = col_blocks; b < padded_col_blocks; ++b) band_scale_inv[b] = 0.0f;
      for (int64_t i = i0; i < i1; ++i) {
        const float* x = SourceRow(args.src, args.transpose, i, cols, 0);
        uint8_t* q = DataRow(out, i);
        int64_t saturated = 0;
        for (int64_t b = 0; b < col_blocks; ++b) {
          const int64_t j0 = b * kBlock, n = std::min(kBlock, cols - j0);
          saturated += QuantizeSpan(x + j0, n, scales[b], out.format, q + j0);
        }
        stats->saturated[i] = saturated;
      }
    }
  });
}

void QuantizeMx1x32(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args, RowStats* stats) {
  const Fp8Tensor& out = args.out;
  const int64_t blocks = CeilDiv(out.cols, kMxBlock);
  const float fp8_max = Fp8Max(out.format);
  float* scale_inv = out.scale_inv.data<float>();
  QuantizeRowsInBlocks(
      ctx, args, kMxBlock,
      [&](int64_t i, int64_t b, float amax) {
        const uint8_t e = E8M0FromAmax(amax, fp8_max);
        scale_inv[i * blocks + b] = E8M0ScaleInv(e);
        return E8M0QuantMultiplier(e);
      },
      stats);
}

// Fp8ToFloat of every code of a format: dequantising is then a load and a multiply per element.
struct Fp8Values {
  float value[256];
};
const Fp8Values& ValuesOf(Fp8Format format) {
  static const auto make = [](Fp8Format f) {
    Fp8Values values;
    for (int code = 0; code < 256; ++code) {
      values.value[code] = Fp8ToFloat(static_cast<uint8_t>(code), f);
    }
    return values;
  };
  static const Fp8Values e4m3 = make(Fp8Format::kE4M3), e5m2 = make(Fp8Format::kE5M2);
  return format == Fp8Format::kE4M3 ? e4m3 : e5m2;
}

// out[j] = Fp8ToFloat(q[j]) · scale_inv.
MOETRAIN_CLONES void DequantizeSpan(const uint8_t* q, int64_t n, float scale_inv,
                                    const Fp8Values& values, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = values.value[q[j]] * scale_inv;
}

}  // namespace

void Fp8Quantize(const ExecContext& ctx, const ops::Fp8QuantizeArgs& args) {
  RowStats stats(args.out.rows);
  switch (args.out.scaling) {
    case Fp8Scaling::kTensor:
      QuantizeTensorScaling(ctx, args, &stats);
      break;
    case Fp8Scaling::kBlock1x128:
      QuantizeBlock1x128(ctx, args, &stats);
      break;
    case Fp8Scaling::kBlock128x128:
      QuantizeBlock128x128(ctx, args, &stats);
      break;
    case Fp8Scaling::kMx1x32:
      QuantizeMx1x32(ctx, args, &stats);
      break;
  }
  stats.Write(args);
}

void Fp8Dequantize(const ExecContext& ctx, const ops::Fp8Tensor& src, TensorView dst) {
  const int64_t rows = src.rows, cols = src.cols, padded = ops::Fp8PaddedCols(cols);
  const uint8_t* data = static_cast<const uint8_t*>(src.data.raw());
  const float* scale_inv = src.scale_inv.data<float>();
  // Each row is a run of blocks sharing one factor: the whole row (kTensor), 128 or 32 columns.
  const int64_t block = src.scaling == Fp8Scaling::kTensor   ? (cols > 0 ? cols : 1)
                        : src.scaling == Fp8Scaling::kMx1x32 ? kMxBlock
                                                             : kBlock;
  const int64_t blocks = CeilDiv(cols, block);
  const Fp8Values& values = ValuesOf(src.format);
  ctx.thread_pool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* q = data + i * padded;
      float* o = WriteRow(dst, i, cols, 0);
      for (int64_t b = 0; b < blocks; ++b) {
        float s = 0.0f;
        switch (src.scaling) {
          case Fp8Scaling::kTensor:
            s = scale_inv[0];
            break;
          case Fp8Scaling::kBlock1x128:
            s = scale_inv[b * Pad4(rows) + i];
            break;
          case Fp8Scaling::kBlock128x128:
            s = scale_inv[(i / kBlock) * Pad4(CeilDiv(cols, kBlock)) + b];
            break;
          case Fp8Scaling::kMx1x32:
            s = scale_inv[i * blocks + b];
            break;
        }
        const int64_t j0 = b * block;
        DequantizeSpan(q + j0, std::min(block, cols - j0), s, values, o + j0);
      }
      FinishRow(dst, i, cols, o);
    }
  });
}

bool Fp8ValuesExactInBf16(const ops::Fp8Tensor& t) {
  const float* scale_inv = t.scale_inv.data<float>();
  for (int64_t i = 0; i < t.scale_inv.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &scale_inv[i], sizeof(bits));
    const uint32_t exponent = (bits >> 23) & 0xFFu;
    if ((bits & 0x7FFFFFFFu) == 0) continue;
    if ((bits & 0x807FFFFFu) != 0 || exponent < 127 - 100 || exponent > 127 + 100) return false;
  }
  return true;
}

void ScaleProducts(const ExecContext& ctx, TensorView products, float factor, bool accumulate,
                   TensorView c) {
  const float* p = products.data<float>();
  float* out = c.data<float>();
  const int64_t cols = c.dim(1);
  ctx.thread_pool().ParallelFor(c.dim(0), RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * cols; i < end * cols; ++i) {
      const float scaled = factor * p[i];
      out[i] = accumulate ? out[i] + scaled : scaled;
    }
  });
}

}  // namespace moetrain::cpu
