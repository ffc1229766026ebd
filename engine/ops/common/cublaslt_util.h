// What the ops' cuBLASLt matmuls (gemm_cuda.cu, fp8_gemm_cuda.cu) share: the descriptors' owner,
// the pointer alignment the heuristic is told, and the heuristic's preference. Both files run
// row-major products through the column-major library with the operands swapped (see the top of
// gemm_cuda.cu): cuBLASLt's A is our b, its B our a, and its C = D our c. Included by .cu files
// only.
#ifndef MOETRAIN_ENGINE_OPS_COMMON_CUBLASLT_UTIL_H_
#define MOETRAIN_ENGINE_OPS_COMMON_CUBLASLT_UTIL_H_

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/backend/cuda/cublaslt_api.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"

namespace moetrain::ops::cuda {

using ::moetrain::cuda::Lt;

// The alignment cuBLASLt may assume of a pointer: its largest power-of-two divisor, capped at
// 256 (cuBLASLt's default assumption). A group's rows start at any element, so the heuristic must
// be told, or it may pick a kernel that needs more alignment than the pointer has.
inline uint32_t PointerAlignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lowest = address & (~address + 1);
  return lowest == 0 || lowest > 256 ? 256u : static_cast<uint32_t>(lowest);
}

// The descriptors of one matmul, in cuBLASLt's (column-major, swapped) terms: lt_a describes our
// b, lt_b our a, lt_c our c. Whatever was created is destroyed with it, so a half-built set left
// by an error frees itself.
struct LtMatmulDescriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;
  cublasLtMatrixLayout_t lt_b = nullptr;
  cublasLtMatrixLayout_t lt_c = nullptr;

  LtMatmulDescriptors() = default;
  LtMatmulDescriptors(const LtMatmulDescriptors&) = delete;
  LtMatmulDescriptors& operator=(const LtMatmulDescriptors&) = delete;
  ~LtMatmulDescriptors() {
    // Destroying a descriptor only frees host memory (cuBLASLt has copied what a queued matmul
    // needs); nothing to report.
    if (lt_c != nullptr) Lt().cublasLtMatrixLayoutDestroy(lt_c);
    if (lt_b != nullptr) Lt().cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a != nullptr) Lt().cublasLtMatrixLayoutDestroy(lt_a);
    if (desc != nullptr) Lt().cublasLtMatmulDescDestroy(desc);
  }
};

struct LtPreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const {
    Lt().cublasLtMatmulPreferenceDestroy(p);
  }
};
using LtPreference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, LtPreferenceDeleter>;

// The heuristic's preference for a product whose a, b and c (our terms) have these alignments:
// at most one stream's workspace (every stream's has the same size), and kernels that need no more
// alignment than the pointers have. Errors name `op`.
inline absl::StatusOr<LtPreference> MakeLtPreference(const char* op, uint32_t align_a,
                                                     uint32_t align_b, uint32_t align_c) {
  cublasLtMatmulPreference_t raw_preference = nullptr;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(op, Lt().cublasLtMatmulPreferenceCreate(&raw_preference));
  LtPreference preference(raw_preference);
  const uint64_t workspace_bytes = ::moetrain::cuda::CudaContext::kCublasWorkspaceBytes;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatmulPreferenceSetAttribute(preference.get(),
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  // cuBLASLt's A is our b and its B our a.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c},
  };
  for (const auto& [attribute, bytes] : alignments) {
    MOETRAIN_CUBLAS_RETURN_IF_ERROR(op, Lt().cublasLtMatmulPreferenceSetAttribute(
                                            preference.get(), attribute, &bytes, sizeof(bytes)));
  }
  return preference;
}

}  // namespace moetrain::ops::cuda

#endif  // MOETRAIN_ENGINE_OPS_COMMON_CUBLASLT_UTIL_H_
