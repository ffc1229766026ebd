#include "engine/backend/cpu/elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"

namespace moetrain::cpu {
namespace {

bool IsAct(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

absl::Status CheckAct(const TensorView& t, const char* name, std::initializer_list<int64_t> shape) {
  if (t.empty() || !IsAct(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": expected an f32 or bf16 tensor, got ", t.empty() ? "none" : t.DebugString()));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(t, name, t.dtype(), shape));
  if (!t.is_contiguous()) return absl::InvalidArgumentError(absl::StrCat(name, ": not contiguous"));
  return absl::OkStatus();
}

// Per-thread scratch rows for widening bf16 inputs and narrowing f32 results.
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  return b.data();
}

// Row r of an act tensor with `cols` columns, as f32 (widened into scratch `slot` if bf16).
const float* ReadRow(const TensorView& t, int64_t r, int64_t cols, int slot) {
  if (t.dtype() == DType::kF32) return t.data<float>() + r * cols;
  float* tmp = Scratch(slot, cols);
  ConvertBF16ToF32(t.data<BF16>() + r * cols, tmp, cols);
  return tmp;
}

// Where to compute row r of an act output: in place when f32, else in scratch `slot`, which
// FinishRow then narrows into the tensor.
float* WriteRow(const TensorView& t, int64_t r, int64_t cols, int slot) {
  return t.dtype() == DType::kF32 ? t.data<float>() + r * cols : Scratch(slot, cols);
}
void FinishRow(const TensorView& t, int64_t r, int64_t cols, const float* row) {
  if (t.dtype() == DType::kBF16) ConvertF32ToBF16(row, t.data<BF16>() + r * cols, cols);
}

// Rows per task so that each task touches ~64 KiB.
int64_t Grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

absl::Status SwigluForward(TensorView gate_up, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  if (gate_up.dim(1) != 2 * f) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu gate_up: ", gate_up.dim(1), " columns is not even"));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "swiglu out", {rows, f}));
  DefaultThreadPool().ParallelFor(rows, Grain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      float* o = WriteRow(out, r, f, 0);
      for (int64_t i = 0; i < f; ++i) o[i] = gate[i] * Sigmoid(gate[i]) * up[i];
      FinishRow(out, r, f, o);
    }
  });
  return absl::OkStatus();
}

absl::Status SwigluBackward(TensorView gate_up, TensorView d_out, TensorView d_gate_up) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(gate_up, "swiglu gate_up", DType::kF32, {-1, -1}));
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_out, "swiglu d_out", DType::kF32, {rows, f}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_gate_up, "swiglu d_gate_up", {rows, 2 * f}));
  DefaultThreadPool().ParallelFor(rows, Grain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      const float* d = d_out.data<float>() + r * f;
      float* dg = WriteRow(d_gate_up, r, 2 * f, 0);
      float* du = dg + f;
      for (int64_t i = 0; i < f; ++i) {
        // silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
        const float s = Sigmoid(gate[i]);
        const float silu = gate[i] * s;
        du[i] = d[i] * silu;
        dg[i] = d[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
      }
      FinishRow(d_gate_up, r, 2 * f, dg);
    }
  });
  return absl::OkStatus();
}

absl::Status GatherRows(TensorView src, TensorView index, TensorView dst) {
  MOETRAIN_RETURN_IF_ERROR(CheckAct(src, "gather src", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(index, "gather index", DType::kI32, {-1}));
  const int64_t rows = index.dim(0), cols = src.dim(1), tokens = src.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(dst, "gather dst", src.dtype(), {rows, cols}));
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
  DefaultThreadPool().ParallelFor(rows, Grain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) std::memcpy(d + r * row_bytes, s + idx[r] * row_bytes, row_bytes);
  });
  return absl::OkStatus();
}

namespace {

// Checks pair_row (T, k) i32 against R rows.
absl::Status CheckPairRows(const TensorView& pair_row, int64_t rows) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(pair_row, "pair_row", DType::kI32, {-1, -1}));
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

absl::Status CombineRows(TensorView rows, TensorView pair_row, TensorView weights,
                         TensorView extra, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  if (!extra.empty()) {
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(extra, "combine extra", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "combine out", {tokens, d}));
  DefaultThreadPool().ParallelFor(tokens, Grain(d * k), [&](int64_t begin, int64_t end) {
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
        const float w = weights.data<float>()[t * k + j];
        const float* y = rows.data<float>() + row * d;
        for (int64_t i = 0; i < d; ++i) o[i] += w * y[i];
      }
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status CombineRowsBackward(TensorView d_out, TensorView rows, TensorView pair_row,
                                 TensorView weights, TensorView d_rows, TensorView d_weights) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(rows, "combine rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_out, "combine d_out", {tokens, d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(weights, "combine weights", DType::kF32, {tokens, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(d_rows, "combine d_rows", {rows.dim(0), d}));
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(d_weights, "combine d_weights", DType::kF32, {tokens, k}));
  DefaultThreadPool().ParallelFor(tokens, Grain(d * k), [&](int64_t begin, int64_t end) {
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
        float dot = 0.0f;
        for (int64_t i = 0; i < d; ++i) {
          dot += g[i] * y[i];
          dy[i] = w * g[i];
        }
        d_weights.data<float>()[t * k + j] = dot;
        FinishRow(d_rows, row, d, dy);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status SumPairRows(TensorView rows, TensorView pair_row,
                         absl::Span<const TensorView> addends, TensorView out) {
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(rows, "sum rows", DType::kF32, {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckPairRows(pair_row, rows.dim(0)));
  const int64_t tokens = pair_row.dim(0), k = pair_row.dim(1), d = rows.dim(1);
  for (const TensorView& a : addends) {
    MOETRAIN_RETURN_IF_ERROR(CheckTensor(a, "sum addend", DType::kF32, {tokens, d}));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckAct(out, "sum out", {tokens, d}));
  DefaultThreadPool().ParallelFor(tokens, Grain(d * k), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* o = WriteRow(out, t, d, 0);
      std::memset(o, 0, d * sizeof(float));
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = pair_row.data<int32_t>()[t * k + j];
        if (row < 0) continue;
        const float* y = rows.data<float>() + row * d;
        for (int64_t i = 0; i < d; ++i) o[i] += y[i];
      }
      for (const TensorView& a : addends) {
        const float* y = a.data<float>() + t * d;
        for (int64_t i = 0; i < d; ++i) o[i] += y[i];
      }
      FinishRow(out, t, d, o);
    }
  });
  return absl::OkStatus();
}

absl::Status ConvertTensor(TensorView src, TensorView dst) {
  if (src.empty() || dst.empty() || !IsAct(src.dtype()) || !IsAct(dst.dtype()) ||
      src.numel() != dst.numel() || !src.is_contiguous() || !dst.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "convert: cannot convert ", src.empty() ? "none" : src.DebugString(), " into ",
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
