// The grouped GEMMs on the CPU: one oneDNN matmul per group (ops/gemm/gemm_cpu.h).
#include "engine/ops/grouped_gemm/grouped_gemm_cpu.h"

#include "engine/ops/gemm/gemm_cpu.h"

namespace moetrain::cpu {
namespace {

char* RowPtr(const TensorView& t, int64_t row, int64_t row_elems) {
  return static_cast<char*>(t.raw()) + row * row_elems * DTypeSize(t.dtype());
}

}  // namespace

absl::Status GroupedGemmForward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                                TensorView y) {
  const int64_t n = w.dim(1), k = w.dim(2);
  return RunGroupedGemms(offsets, [&](int64_t g) -> RawGemm {
    return {x.dtype(),
            RowPtr(x, offsets[g], k),
            RowPtr(w, g * n, k),
            y.data<float>() + offsets[g] * n,
            offsets[g + 1] - offsets[g],
            n,
            k,
            k,
            k,
            n,
            /*trans_a=*/false,
            /*trans_b=*/true,
            /*accumulate=*/false,
            RuntimeDim::kM};
  });
}

absl::Status GroupedGemmBackwardData(TensorView dy, TensorView w, absl::Span<const int64_t> offsets,
                                     TensorView dx) {
  const int64_t n = w.dim(1), k = w.dim(2);
  return RunGroupedGemms(offsets, [&](int64_t g) -> RawGemm {
    return {dy.dtype(),
            RowPtr(dy, offsets[g], n),
            RowPtr(w, g * n, k),
            dx.data<float>() + offsets[g] * k,
            offsets[g + 1] - offsets[g],
            k,
            n,
            n,
            k,
            k,
            /*trans_a=*/false,
            /*trans_b=*/false,
            /*accumulate=*/false,
            RuntimeDim::kM};
  });
}

absl::Status GroupedGemmBackwardWeight(TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate) {
  const int64_t n = dy.dim(1), k = x.dim(1);
  // dw_g (n, k) = dy_gᵀ (n, rows_g) · x_g (rows_g, k); a group with no rows contributes zero.
  return RunGroupedGemms(offsets, [&](int64_t g) -> RawGemm {
    return {dy.dtype(),
            RowPtr(dy, offsets[g], n),
            RowPtr(x, offsets[g], k),
            dw.data<float>() + g * n * k,
            n,
            k,
            offsets[g + 1] - offsets[g],
            n,
            k,
            k,
            /*trans_a=*/true,
            /*trans_b=*/false,
            accumulate,
            RuntimeDim::kK};
  });
}

}  // namespace moetrain::cpu
