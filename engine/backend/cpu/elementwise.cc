#include "engine/backend/cpu/elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/rows.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"

namespace moetrain::cpu {
namespace {

inline float Sigmoid(float x) { return 1.0f / (1.0f + FastExp(-x)); }

MOETRAIN_CLONES void SwigluRow(const float* gate, const float* up, float* out, int64_t f) {
  for (int64_t i = 0; i < f; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

// silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
MOETRAIN_CLONES void SwigluRowBackward(const float* gate, const float* up, const float* d,
                                       float* d_gate, float* d_up, int64_t f) {
  for (int64_t i = 0; i < f; ++i) {
    const float s = Sigmoid(gate[i]);
    d_up[i] = d[i] * gate[i] * s;
    d_gate[i] = d[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
  }
}

// out += w·y.
MOETRAIN_CLONES void AxpyRow(float w, const float* y, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += w * y[i];
}

// d_y = w·g, and returns ⟨g, y⟩, summed in 16 interleaved partial sums: a fixed order (the
// same result on every run and thread count), and one that vectorises without -ffast-math.
MOETRAIN_CLONES float ScaleAndDotRow(float w, const float* g, const float* y, float* d_y,
                                     int64_t n) {
  constexpr int kLanes = 16;
  float partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      partial[l] += g[i + l] * y[i + l];
      d_y[i + l] = w * g[i + l];
    }
  }
  for (; i < n; ++i) {
    partial[0] += g[i] * y[i];
    d_y[i] = w * g[i];
  }
  float dot = 0.0f;
  for (int l = 0; l < kLanes; ++l) dot += partial[l];
  return dot;
}

}  // namespace

absl::Status SwigluForward(TensorView gate_up, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (gate_up.dim(1) != 2 * f) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu gate_up: ", gate_up.dim(1), " columns is not even"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "swiglu out", {rows, f}));
  DefaultThreadPool().ParallelFor(rows, RowGrain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      float* o = WriteRow(out, r, f, 0);
      SwigluRow(gate, up, o, f);
      FinishRow(out, r, f, o);
    }
  });
  return absl::OkStatus();
}

absl::Status SwigluBackward(TensorView gate_up, TensorView d_out, TensorView d_gate_up) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(d_out, "swiglu d_out", DType::kF32, {rows, f}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_gate_up, "swiglu d_gate_up", {rows, 2 * f}));
  DefaultThreadPool().ParallelFor(rows, RowGrain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      const float* d = d_out.data<float>() + r * f;
      float* dg = WriteRow(d_gate_up, r, 2 * f, 0);
      SwigluRowBackward(gate, up, d, dg, dg + f, f);
      FinishRow(d_gate_up, r, 2 * f, dg);
    }
  });
  return absl::OkStatus();
}

absl::Status GatherRows(TensorView src, TensorView index, TensorView dst) {
  MOETRAIN_RETURN_IF_ERROR(CheckAct(src, "gather src", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(index, "gather index", DType::kI32, {-1}));
  const int64_t rows = index.dim(0), cols = src.dim(1), tokens = src.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(dst, "gather dst", src.dtype(), {rows, cols}));
  const size_t row_bytes = cols * DTypeSize(src.dtype());
  const int32_t* idx = index.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (idx[r] < 0 || idx[r] >= tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather index[", r, "] = ", idx[r], " is outside [0, ", tokens, ")"));
    }
  }
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  DefaultThreadPool().ParallelFor(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::memcpy(d + r * row_bytes, s + idx[r] * row_bytes, row_bytes);
  });
  return absl::OkStatus();
}

namespace {

// Checks pair_row (T, k) i32 against R rows.
absl::Status CheckPairRows(const TensorView& pair_row, int64_t rows) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(pair_row, "pair_row", DType::kI32, {-1, -1}));
  const int32_t* p = pair_row.data<int32_t>();
  for (int64_t i = 0; i < pair_row.numel(); ++i) {
    if (p[i] < -1 || p[i] >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("pair_row[", i, "] = ", p[i], " is outside [-1, ", rows, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CombineRows(TensorView rows, TensorView pair_row, TensorView weights, TensorView extra,
                         TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  if (!extra.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(extra, "combine extra", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "combine out", {tokens, d}));
  DefaultThreadPool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = WriteRow(out, t, d, 0);
      if (extra.empty()) {
        std::memset(o, 0, d * sizeof(float));
      } else {
        std::memcpy(o, extra.data<float>() + t * d, d * sizeof(float));
      }
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) continue;
        AxpyRow(weights.data<float>()[t * k + j], rows.data<float>() + row * d, o, d);
      }
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status CombineRowsBackward(TensorView d_out, TensorView rows, TensorView pair_row,
                                 TensorView weights, TensorView d_rows, TensorView d_weights) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_out, "combine d_out", {tokens, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_rows, "combine d_rows", {rows.dim(0), d}));
  MOETRAIN_RETURN_IF_ERROR(
      CheckDenseTensor(d_weights, "combine d_weights", DType::kF32, {tokens, k}));
  DefaultThreadPool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* g = ReadRow(d_out, t, d, 0);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) {
          d_weights.data<float>()[t * k + j] = 0.0f;
          continue;
        }
        const float w = weights.data<float>()[t * k + j];
        const float* y = rows.data<float>() + row * d;
        float* dy = WriteRow(d_rows, row, d, 1);
        d_weights.data<float>()[t * k + j] = ScaleAndDotRow(w, g, y, dy, d);
        FinishRow(d_rows, row, d, dy);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status SumPairRows(TensorView rows, TensorView pair_row, absl::Span<const TensorView> addends,
                         TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(rows, "sum rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  for (const TensorView& a : addends) {
    MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(a, "sum addend", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "sum out", {tokens, d}));
  DefaultThreadPool().ParallelFor(tokens, RowGrain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = WriteRow(out, t, d, 0);
      std::memset(o, 0, d * sizeof(float));
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) continue;
        AxpyRow(1.0f, rows.data<float>() + row * d, o, d);
      }
      for (const TensorView& a : addends) AxpyRow(1.0f, a.data<float>() + t * d, o, d);
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status ConvertTensor(TensorView src, TensorView dst) {
  if (src.empty() || dst.empty() || !IsActDType(src.dtype()) || !IsActDType(dst.dtype()) ||
      src.shape() != dst.shape() || !src.is_contiguous() || !dst.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("convert: cannot convert ", src.empty() ? "none" : src.DebugString(), " into ",
                     dst.empty() ? "none" : dst.DebugString()));
  }
  const int64_t n = src.numel();
  DefaultThreadPool().ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) {
    if (src.dtype() == dst.dtype()) {
      const size_t size = DTypeSize(src.dtype());
      std::memcpy(static_cast<char*>(dst.raw()) + begin * size,
                  static_cast<const char*>(src.raw()) + begin * size, (end - begin) * size);
    } else if (src.dtype() == DType::kF32) {
      ConvertF32ToBF16(src.data<float>() + begin, dst.data<BF16>() + begin, end - begin);
    } else {
      ConvertBF16ToF32(src.data<BF16>() + begin, dst.data<float>() + begin, end - begin);
    }
  });
  return absl::OkStatus();
}

}  // namespace moetrain::cpu
