// Helpers of the CPU row kernels (engine/ops/*/..._cpu.cc): activations are f32 or bf16 ("act"),
// math is f32, and a bf16 row is widened into (or narrowed from) per-thread scratch.
#ifndef MOETRAIN_ENGINE_BACKEND_CPU_ROWS_H_
#define MOETRAIN_ENGINE_BACKEND_CPU_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

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
