// The CPU side of the GEMM ops (gemm.h, grouped_gemm/grouped_gemm.h): one oneDNN matmul per
// product, from a cache of primitives. Arguments arrive validated by the ops.
#ifndef MOETRAIN_ENGINE_OPS_GEMM_GEMM_CPU_H_
#define MOETRAIN_ENGINE_OPS_GEMM_GEMM_CPU_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/core/dtype.h"
#include "engine/ops/gemm/gemm.h"

namespace moetrain::cpu {

// Which dimension of a GEMM varies from call to call: the rows of a ragged expert batch are M in
// the forward and backward-data products and K in the weight gradient. oneDNN's jit GEMM keeps
// full speed with that one dimension (and the strides that follow from it) given only at
// execution time, so each weight shape needs one primitive however the tokens fall; with every
// dimension left open it falls back to a reference kernel, so the rest stays fixed.
enum class RuntimeDim { kNone, kM, kK };

// c (m, n) [+]= op(a) (m, k) · op(b) (k, n), raw host pointers with leading dimensions of the
// stored (row-major) matrices.
struct RawGemm {
  DType dtype;
  const void* a;
  const void* b;
  float* c;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
  bool trans_a, trans_b, accumulate;
  RuntimeDim runtime_dim;
};

// ops::Gemm of (m, k) × (k, n).
absl::Status Gemm(const ops::GemmArgs& args, int64_t m, int64_t n, int64_t k);

// One product; k = 0 writes zeros (or leaves c when accumulating). Never throws: oneDNN's errors
// become a Status (Unimplemented for a dtype this CPU lacks, e.g. bf16 without AVX-512).
absl::Status RunGemm(const RawGemm& g);

// Runs the GEMM of each group g of `offsets` (G + 1), as make(g) describes it. With many
// non-empty groups, whole groups go to the threads of the OpenMP team, each GEMM single-threaded
// inside the parallel region: a small expert GEMM split over threads spends much of its time
// synchronising, while whole groups balance well once there are several per thread. With few
// groups, each GEMM uses every thread instead. Either way each group's result depends only on its
// own inputs.
absl::Status RunGroupedGemms(absl::Span<const int64_t> offsets,
                             absl::FunctionRef<RawGemm(int64_t)> make);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_GEMM_GEMM_CPU_H_
