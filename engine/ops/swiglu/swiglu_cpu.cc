#include "engine/ops/swiglu/swiglu_cpu.h"

#include "engine/backend/cpu/rows.h"
#include "engine/core/fast_math.h"
#include "engine/ops/swiglu/swiglu_math.h"

namespace moetrain::cpu {
namespace {

MOETRAIN_CLONES void SwigluRow(const float* gate, const float* up, float* out, int64_t f) {
  for (int64_t i = 0; i < f; ++i) out[i] = SwigluForwardValue(gate[i], up[i]);
}

MOETRAIN_CLONES void SwigluRowBackward(const float* gate, const float* up, const float* d,
                                       float* d_gate, float* d_up, int64_t f) {
  for (int64_t i = 0; i < f; ++i) SwigluBackwardValue(gate[i], up[i], d[i], &d_gate[i], &d_up[i]);
}

}  // namespace

void SwigluForward(const ExecContext& ctx, TensorView gate_up, TensorView out) {
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  ctx.thread_pool().ParallelFor(rows, RowGrain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      float* o = WriteRow(out, r, f, 0);
      SwigluRow(gate, up, o, f);
      FinishRow(out, r, f, o);
    }
  });
}

void SwigluBackward(const ExecContext& ctx, TensorView gate_up, TensorView d_out,
                    TensorView d_gate_up) {
  const int64_t rows = gate_up.dim(0), f = gate_up.dim(1) / 2;
  ctx.thread_pool().ParallelFor(rows, RowGrain(2 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gate_up.data<float>() + r * 2 * f;
      const float* up = gate + f;
      const float* d = d_out.data<float>() + r * f;
      float* dg = WriteRow(d_gate_up, r, 2 * f, 0);
      SwigluRowBackward(gate, up, d, dg, dg + f, f);
      FinishRow(d_gate_up, r, 2 * f, dg);
    }
  });
}

}  // namespace moetrain::cpu
