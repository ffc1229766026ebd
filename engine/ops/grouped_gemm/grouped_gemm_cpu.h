// The CPU side of grouped_gemm.h; arguments arrive validated.
#ifndef MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CPU_H_
#define MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CPU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/core/tensor.h"

namespace moetrain::cpu {

absl::Status GroupedGemmForward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                                TensorView y);
absl::Status GroupedGemmBackwardData(TensorView dy, TensorView w, absl::Span<const int64_t> offsets,
                                     TensorView dx);
absl::Status GroupedGemmBackwardWeight(TensorView dy, TensorView x,
                                       absl::Span<const int64_t> offsets, TensorView dw,
                                       bool accumulate);

}  // namespace moetrain::cpu

#endif  // MOETRAIN_ENGINE_OPS_GROUPED_GEMM_GROUPED_GEMM_CPU_H_
