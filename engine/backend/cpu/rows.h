// Helpers of the CPU row kernels (elementwise.cc, engine/model/layers.cc): activations are f32 or
// bf16 ("act"), math is f32, and a bf16 row is widened into (or narrowed from) per-thread scratch.
#ifndef MOETRAIN_ENGINE_BACKEND_CPU_ROWS_H_
#define MOETRAIN_ENGINE_BACKEND_CPU_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/core/dtype.h"
#include "engine/core/fast_math.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

inline bool IsActDType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// A dense f32 or bf16 tensor of `shape` (-1 = any extent), else InvalidArgument naming it.
inline absl::Status CheckAct(const TensorView& t, const char* name,
                             std::initializer_list<int64_t> shape) {
  if (t.empty() || !IsActDType(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected an f32 or bf16 tensor, got ",
                                                   t.empty() ? "none" : t.DebugString()));
  }
  return CheckDenseTensor(t, name, t.dtype(), shape);
}

// Per-thread scratch row `slot` (0..3) of at least n floats.
inline float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  return b.data();
}

// Row r of an act tensor with `cols` columns, as f32: in place, or widened into scratch `slot`.
inline const float* ReadRow(const TensorView& t, int64_t r, int64_t cols, int slot) {
  if (t.dtype() == DType::kF32) return t.data<float>() + r * cols;
  float* tmp = Scratch(slot, cols);
  ConvertBF16ToF32(t.data<BF16>() + r * cols, tmp, cols);
  return tmp;
}

// Where to compute row r of an act output: in place when f32, else in scratch `slot`, which
// FinishRow then narrows into the tensor.
inline float* WriteRow(const TensorView& t, int64_t r, int64_t cols, int slot) {
  return t.dtype() == DType::kF32 ? t.data<float>() + r * cols : Scratch(slot, cols);
}
inline void FinishRow(const TensorView& t, int64_t r, int64_t cols, const float* row) {
  if (t.dtype() == DType::kBF16) ConvertF32ToBF16(row, t.data<BF16>() + r * cols, cols);
}

// Rows per task so that each task touches ~64 KiB.
inline int64_t RowGrain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
}

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_BACKEND_CPU_ROWS_H_
