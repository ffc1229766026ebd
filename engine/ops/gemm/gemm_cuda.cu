// cuBLASLt GEMMs (gemm_cuda.h).
//
// Row-major through a column-major library. cuBLASLt reads a matrix stored row-major (r, c) with
// row stride ld as the column-major (c, r) matrix with leading dimension ld: its transpose, for
// free. So instead of C = op(a)·op(b) (row-major C (m, n)) it computes the column-major
//   Cᵀ (n, m) = op(b)ᵀ (n, k) · op(a)ᵀ (k, m)
// with the operands swapped: cuBLASLt's A is our b, its B our a, and its C/D our c.
//   cuBLASLt A = b:  b not transposed: stored (k, n), ld ldb → read as (n, k) = op(b)ᵀ: OP_N,
//                    layout rows n, cols k.
//                    b transposed: stored (n, k), ld ldb → read as (k, n) = op(b): OP_T,
//                    layout rows k, cols n.
//   cuBLASLt B = a:  a not transposed: stored (m, k), ld lda → read as (k, m) = op(a)ᵀ: OP_N,
//                    layout rows k, cols m.
//                    a transposed: stored (k, m), ld lda → read as (m, k) = op(a): OP_T,
//                    layout rows m, cols k.
//   cuBLASLt C = D = c: stored (m, n), ld ldc → read as (n, m): layout rows n, cols m.
// Every ld is the stored row length, so ld ≥ rows of each column-major layout holds.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/core/status.h"
#include "engine/ops/common/cublaslt_util.h"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/gemm/gemm_cuda.h"

namespace moetrain::ops::cuda {
namespace {

// Everything the choice of algorithm depends on. Not the stream: every stream's workspace has the
// same size, so one plan serves a problem on any of them.
struct PlanKey {
  int device;
  DType dtype;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;
  bool trans_a, trans_b, accumulate;
  uint32_t align_a, align_b, align_c;

  auto operator<=>(const PlanKey&) const = default;
};

// The descriptors and the algorithm of one problem, in cuBLASLt's (column-major, swapped) terms:
// lt_a describes our b, lt_b our a, lt_c our c (see the top of the file). Immutable once built:
// several threads may run matmuls with one plan at once.
struct MatmulPlan : LtMatmulDescriptors {
  cublasLtMatmulAlgo_t algo{};
};

absl::StatusOr<std::shared_ptr<const MatmulPlan>> CreatePlan(cublasLtHandle_t handle,
                                                             const PlanKey& key, const char* op) {
  auto plan = std::make_shared<MatmulPlan>();
  // f32 compute for both input types; for f32 inputs this is true f32, not TF32 (which
  // CUBLAS_COMPUTE_32F_FAST_TF32 would allow).
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t lt_trans_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t lt_trans_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &lt_trans_a,
                                              sizeof(lt_trans_a)));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &lt_trans_b,
                                              sizeof(lt_trans_b)));

  const cudaDataType_t input_type = key.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const uint64_t m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n),
                 k = static_cast<uint64_t>(key.k);
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatrixLayoutCreate(&plan->lt_a, input_type, key.trans_b ? k : n,
                                          key.trans_b ? n : k, key.ldb));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatrixLayoutCreate(&plan->lt_b, input_type, key.trans_a ? m : k,
                                          key.trans_a ? k : m, key.lda));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatrixLayoutCreate(&plan->lt_c, CUDA_R_32F, n, m, key.ldc));

  MOETRAIN_ASSIGN_OR_RETURN(const LtPreference preference,
                            MakeLtPreference(op, key.align_a, key.align_b, key.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(op, Lt().cublasLtMatmulAlgoGetHeuristic(
                                          handle, plan->desc, plan->lt_a, plan->lt_b, plan->lt_c,
                                          plan->lt_c, preference.get(), 1, &result, &returned));
  if (returned < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": cuBLASLt has no algorithm for ", std::string(DTypeName(key.dtype)),
                     " (", key.m, " x ", key.k, ") · (", key.k, " x ", key.n,
                     "), trans_a = ", key.trans_a ? 1 : 0, ", trans_b = ", key.trans_b ? 1 : 0,
                     ", alignments ", key.align_a, "/", key.align_b, "/", key.align_c, " bytes"));
  }
  plan->algo = result.algo;
  return std::shared_ptr<const MatmulPlan>(std::move(plan));
}

// The plans of every problem seen, for every device: a heuristic query costs far more than the
// matmul launch it serves. Entries are shared_ptrs so that a thread still launching with a plan
// keeps it alive if the cache is cleared meanwhile.
class PlanCache {
 public:
  absl::StatusOr<std::shared_ptr<const MatmulPlan>> Get(cublasLtHandle_t handle, const PlanKey& key,
                                                        const char* op) {
    {
      absl::MutexLock lock(&mu_);
      const auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    // The heuristic runs unlocked, so other problems need not wait for it. Two threads that miss
    // the same key both build a plan, and both use whichever was stored first.
    MOETRAIN_ASSIGN_OR_RETURN(std::shared_ptr<const MatmulPlan> plan, CreatePlan(handle, key, op));
    absl::MutexLock lock(&mu_);
    // Ragged expert batches give a new row count most steps, so the cache would grow without
    // bound; starting over now and then costs one heuristic query per problem.
    if (plans_.size() >= kMaxPlans) plans_.clear();
    return plans_.try_emplace(key, std::move(plan)).first->second;
  }

 private:
  static constexpr size_t kMaxPlans = size_t{1} << 14;
  absl::Mutex mu_;
  std::map<PlanKey, std::shared_ptr<const MatmulPlan>> plans_ ABSL_GUARDED_BY(mu_);
};

PlanCache& Plans() {
  // Never destroyed: a thread may still run a GEMM while the process exits.
  static PlanCache* const plans = new PlanCache;
  return *plans;
}

}  // namespace

absl::Status RunDeviceGemm(CudaContext& context, int stream_index, const DeviceGemm& gemm,
                           const char* op) {
  if (stream_index < 0 || stream_index > CudaContext::kNumSideStreams) {
    return absl::InternalError(absl::StrCat(op, ": stream index ", stream_index,
                                            " is out of range [0, ", CudaContext::kNumSideStreams,
                                            "]"));
  }
  const PlanKey key{.device = context.ordinal(),
                    .dtype = gemm.dtype,
                    .m = gemm.m,
                    .n = gemm.n,
                    .k = gemm.k,
                    .lda = gemm.lda,
                    .ldb = gemm.ldb,
                    .ldc = gemm.ldc,
                    .trans_a = gemm.trans_a,
                    .trans_b = gemm.trans_b,
                    .accumulate = gemm.accumulate,
                    .align_a = PointerAlignment(gemm.a),
                    .align_b = PointerAlignment(gemm.b),
                    .align_c = PointerAlignment(gemm.c)};
  MOETRAIN_ASSIGN_OR_RETURN(const std::shared_ptr<const MatmulPlan> plan,
                            Plans().Get(context.cublaslt(), key, op));
  const cudaStream_t stream =
      stream_index == 0 ? context.compute_stream() : context.side_stream(stream_index - 1);
  const float alpha = 1.0f;
  // beta = 0: cuBLASLt does not read c, so an uninitialised (even NaN) c is fine.
  const float beta = gemm.accumulate ? 1.0f : 0.0f;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      op, Lt().cublasLtMatmul(context.cublaslt(), plan->desc, &alpha, gemm.b, plan->lt_a, gemm.a,
                              plan->lt_b, &beta, gemm.c, plan->lt_c, gemm.c, plan->lt_c,
                              &plan->algo, context.cublas_workspace(stream_index),
                              CudaContext::kCublasWorkspaceBytes, stream));
  return absl::OkStatus();
}

absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args, int64_t m, int64_t n, int64_t k) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "gemm"));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    // Every element is an empty sum: zero, or unchanged when accumulating.
    if (!args.accumulate) {
      MOETRAIN_CUDA_RETURN_IF_ERROR(
          "gemm", cudaMemsetAsync(args.c.raw(), 0,
                                  static_cast<size_t>(m) * static_cast<size_t>(n) * sizeof(float),
                                  op.stream));
    }
    return absl::OkStatus();
  }
  // a, b and c are dense (checked by the op): each leading dimension is the stored row length.
  return RunDeviceGemm(*op.context, /*stream_index=*/0,
                       {.dtype = args.a.dtype(),
                        .a = args.a.raw(),
                        .b = args.b.raw(),
                        .c = static_cast<float*>(args.c.raw()),
                        .m = m,
                        .n = n,
                        .k = k,
                        .lda = args.a.dim(1),
                        .ldb = args.b.dim(1),
                        .ldc = n,
                        .trans_a = args.trans_a,
                        .trans_b = args.trans_b,
                        .accumulate = args.accumulate},
                       "gemm");
}

}  // namespace moetrain::ops::cuda
