// The CUDA FP8 GEMM of fp8.h (fp8_cuda.h): cuBLASLt's FP8 matmul with per-tensor or block
// scales, or the dense GEMM of the dequantised values where Hopper's cuBLASLt cannot multiply the
// pair (fp8_gemm_path.h). Its mapping onto cuBLASLt is described below.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_context.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/ops/common/cublaslt_util.h"
#include "engine/ops/common/cuda_launch.h"
#include "engine/ops/fp8/fp8.h"
#include "engine/ops/fp8/fp8_cuda.h"
#include "engine/ops/fp8/fp8_gemm_path.h"
#include "engine/ops/gemm/gemm_cuda.h"

namespace moetrain::ops::cuda {
namespace {

// c (M, N) row-major [+]= a (M, K) · bᵀ, a and b stored row-major with row stride
// Pc = Fp8PaddedCols(K) bytes. cuBLASLt is column-major: a row-major (r, c) matrix with row
// stride ld is, to it, the column-major (c, r) matrix with leading dimension ld (gemm_cuda.cu). So
// it computes the column-major cᵀ (N, M) = b (N, K) · aᵀ (K, M), with
//   cuBLASLt A = our b: stored (N, Pc) → column-major (Pc, N), ld Pc, CUBLAS_OP_T → (N, Pc);
//   cuBLASLt B = our a: stored (M, Pc) → column-major (Pc, M), ld Pc, CUBLAS_OP_N;
//   cuBLASLt C = D = our c: stored (M, N), ld N → column-major (N, M), CUDA_R_32F;
//   cuBLASLt's m = N, n = M, k = Pc.
// That is TN (A transposed, B not, both K-contiguous), the one FP8 layout Hopper's cuBLASLt runs.
// k is Pc rather than K: both operands' padding columns are zero, so they add nothing, and k is a
// multiple of 16 like the leading dimensions; Pc ≤ K rounded up to 128, so the block scales cover
// it.
// Scales (each operand's scale_inv: "convert the stored data to the compute range"):
//   A_SCALE_POINTER = b.scale_inv, B_SCALE_POINTER = a.scale_inv;
//   per-tensor: the default SCALAR_32F mode, one f32 each;
//   block: A_SCALE_MODE / B_SCALE_MODE = VEC128_32F for kBlock1x128, whose scale_inv
//   [ceil(K/128)][pad4(rows)] is cuBLASLt's [ceil(k/128)] × m (or × n) with the rows contiguous,
//   and BLK128x128_32F for kBlock128x128, [ceil(rows/128)][pad4(ceil(K/128))] with the K blocks
//   contiguous (the "GEMM-ready" layouts of GPU-NOTES.md §2).
// Split accumulation (FAST_ACCUM 0: partial sums promoted to f32 periodically), as Transformer
// Engine forces for block scaling and uses for its gradient GEMMs. accumulate: beta = 1 with
// C = D = c.

cudaDataType_t Fp8CudaType(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

int32_t CublasScaleMode(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kBlock1x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Scaling::kBlock128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

// Everything cuBLASLt's choice of algorithm depends on, in our terms (a, b, c).
struct Fp8PlanKey {
  int device;
  Fp8Format format_a, format_b;
  Fp8Scaling scaling_a, scaling_b;
  int64_t m, n, k;  // M, N, Pc
  int64_t lda, ldb, ldc;
  bool accumulate;
  uint32_t align_a, align_b, align_c;

  auto operator<=>(const Fp8PlanKey&) const = default;
};

// The descriptors of one call. Made per call, because they hold the scale pointers (host memory
// only, microseconds); the heuristic's algorithm, which is what costs, is cached.
using Fp8Matmul = LtMatmulDescriptors;

absl::Status DescribeFp8Matmul(const Fp8PlanKey& key, const void* a_scale_inv,
                               const void* b_scale_inv, Fp8Matmul& mm) {
  constexpr const char* kOp = "fp8 gemm";
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescCreate(&mm.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                               sizeof(trans_a)));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                               sizeof(trans_b)));
  const int8_t fast_accum = 0;
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                               &fast_accum, sizeof(fast_accum)));
  // cuBLASLt's A is our b, its B our a.
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &b_scale_inv, sizeof(b_scale_inv)));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &a_scale_inv, sizeof(a_scale_inv)));
  if (key.scaling_a != Fp8Scaling::kTensor) {
    const int32_t mode_a = CublasScaleMode(key.scaling_b), mode_b = CublasScaleMode(key.scaling_a);
    MOETRAIN_CUBLAS_RETURN_IF_ERROR(
        kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                 &mode_a, sizeof(mode_a)));
    MOETRAIN_CUBLAS_RETURN_IF_ERROR(
        kOp, Lt().cublasLtMatmulDescSetAttribute(mm.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                 &mode_b, sizeof(mode_b)));
  }
  const uint64_t m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n),
                 k = static_cast<uint64_t>(key.k);
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatrixLayoutCreate(&mm.lt_a, Fp8CudaType(key.format_b), k, n, key.ldb));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatrixLayoutCreate(&mm.lt_b, Fp8CudaType(key.format_a), k, m, key.lda));
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(
      kOp, Lt().cublasLtMatrixLayoutCreate(&mm.lt_c, CUDA_R_32F, n, m, key.ldc));
  return absl::OkStatus();
}

// The heuristic's algorithm for a problem, or none (found false) when cuBLASLt has none.
struct Fp8Algo {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

absl::StatusOr<Fp8Algo> QueryFp8Algo(cublasLtHandle_t handle, const Fp8PlanKey& key,
                                     const Fp8Matmul& mm) {
  constexpr const char* kOp = "fp8 gemm";
  MOETRAIN_ASSIGN_OR_RETURN(const LtPreference preference,
                            MakeLtPreference(kOp, key.align_a, key.align_b, key.align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = Lt().cublasLtMatmulAlgoGetHeuristic(
      handle, mm.desc, mm.lt_a, mm.lt_b, mm.lt_c, mm.lt_c, preference.get(), 1, &result, &returned);
  // NOT_SUPPORTED (or no result) means no kernel for this problem: the caller falls back.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return Fp8Algo{};
  MOETRAIN_CUBLAS_RETURN_IF_ERROR(kOp, status);
  if (returned < 1 || result.state != CUBLAS_STATUS_SUCCESS) return Fp8Algo{};
  return Fp8Algo{.found = true, .algo = result.algo};
}

// The algorithms of every problem seen (identical calls run the same kernel: identical bits).
class Fp8AlgoCache {
 public:
  absl::StatusOr<Fp8Algo> Get(cublasLtHandle_t handle, const Fp8PlanKey& key, const Fp8Matmul& mm) {
    {
      absl::MutexLock lock(&mu_);
      const auto it = algos_.find(key);
      if (it != algos_.end()) return it->second;
    }
    MOETRAIN_ASSIGN_OR_RETURN(const Fp8Algo algo, QueryFp8Algo(handle, key, mm));
    absl::MutexLock lock(&mu_);
    // Ragged expert batches make new shapes; starting over now and then bounds the map.
    if (algos_.size() >= kMaxAlgos) algos_.clear();
    return algos_.try_emplace(key, algo).first->second;
  }

 private:
  static constexpr size_t kMaxAlgos = size_t{1} << 14;
  absl::Mutex mu_;
  std::map<Fp8PlanKey, Fp8Algo> algos_ ABSL_GUARDED_BY(mu_);
};

Fp8AlgoCache& Fp8Algos() {
  // Never destroyed: a thread may still run a GEMM while the process exits.
  static Fp8AlgoCache* const algos = new Fp8AlgoCache;
  return *algos;
}

// cuBLASLt's FP8 GEMM; *ran false (nothing queued) when cuBLASLt has no algorithm for it.
absl::Status RunCublasLtFp8(const CudaOp& op, const Fp8GemmArgs& args, bool* ran) {
  *ran = false;
  const Fp8PlanKey key{.device = op.context->ordinal(),
                       .format_a = args.a.format,
                       .format_b = args.b.format,
                       .scaling_a = args.a.scaling,
                       .scaling_b = args.b.scaling,
                       .m = args.a.rows,
                       .n = args.b.rows,
                       .k = Fp8PaddedCols(args.a.cols),
                       .lda = args.a.data.dim(1),
                       .ldb = args.b.data.dim(1),
                       .ldc = args.c.dim(1),
                       .accumulate = args.accumulate,
                       .align_a = PointerAlignment(args.a.data.raw()),
                       .align_b = PointerAlignment(args.b.data.raw()),
                       .align_c = PointerAlignment(args.c.raw())};
  Fp8Matmul mm;
  MOETRAIN_RETURN_IF_ERROR(
      DescribeFp8Matmul(key, args.a.scale_inv.raw(), args.b.scale_inv.raw(), mm));
  MOETRAIN_ASSIGN_OR_RETURN(const Fp8Algo algo, Fp8Algos().Get(op.context->cublaslt(), key, mm));
  if (!algo.found) return absl::OkStatus();
  const float alpha = 1.0f;
  // beta = 0: cuBLASLt does not read c, so an uninitialised (even NaN) c is fine.
  const float beta = args.accumulate ? 1.0f : 0.0f;
  void* c = args.c.raw();
  const cublasStatus_t status = Lt().cublasLtMatmul(
      op.context->cublaslt(), mm.desc, &alpha, args.b.data.raw(), mm.lt_a, args.a.data.raw(),
      mm.lt_b, &beta, c, mm.lt_c, c, mm.lt_c, &algo.algo, op.context->cublas_workspace(0),
      CudaContext::kCublasWorkspaceBytes, op.stream);
  // NOT_SUPPORTED is decided before anything is queued: the caller falls back.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return absl::OkStatus();
  MOETRAIN_CUBLAS_RETURN_IF_ERROR("fp8 gemm", status);
  *ran = true;
  return absl::OkStatus();
}

// Dequantises a and b to `dtype` (f32 or bf16) temporaries and runs the dense GEMM
// c [+]= a · bᵀ on them.
absl::Status DequantizedGemm(const ExecContext& ctx, const CudaOp& op, const Fp8GemmArgs& args,
                             DType dtype) {
  const int64_t m = args.a.rows, n = args.b.rows, k = args.a.cols;
  // Freed on return while the GEMM may still run: reuse is ordered on the compute stream.
  MOETRAIN_ASSIGN_OR_RETURN(Tensor a, Tensor::Allocate(ctx.allocator(), dtype, {m, k}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor b, Tensor::Allocate(ctx.allocator(), dtype, {n, k}));
  MOETRAIN_RETURN_IF_ERROR(cuda::Fp8Dequantize(ctx, args.a, a.view()));
  MOETRAIN_RETURN_IF_ERROR(cuda::Fp8Dequantize(ctx, args.b, b.view()));
  return RunDeviceGemm(*op.context, /*stream_index=*/0,
                       {.dtype = dtype,
                        .a = a.view().raw(),
                        .b = b.view().raw(),
                        .c = static_cast<float*>(args.c.raw()),
                        .m = m,
                        .n = n,
                        .k = k,
                        .lda = k,
                        .ldb = k,
                        .ldc = args.c.dim(1),
                        .trans_a = false,
                        .trans_b = true,
                        .accumulate = args.accumulate},
                       "fp8 gemm");
}

const char* ScalingName(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::kTensor:
      return "per-tensor";
    case Fp8Scaling::kBlock1x128:
      return "1x128";
    case Fp8Scaling::kBlock128x128:
      return "128x128";
    case Fp8Scaling::kMx1x32:
      return "MXFP8 1x32";
  }
  return "?";
}

const char* FormatName(Fp8Format format) { return format == Fp8Format::kE4M3 ? "E4M3" : "E5M2"; }

}  // namespace

absl::Status Fp8Gemm(const ExecContext& ctx, const Fp8GemmArgs& args) {
  MOETRAIN_ASSIGN_OR_RETURN(const CudaOp op, BeginCudaOp(ctx, "fp8 gemm"));
  const int64_t m = args.a.rows, n = args.b.rows, k = args.a.cols;
  Fp8GemmPath path =
      ChooseFp8GemmPath(args.a.scaling, args.b.scaling, args.a.format, args.b.format, n);
  if (path == Fp8GemmPath::kUnsupported) {
    return absl::UnimplementedError(absl::StrCat(
        "fp8 gemm: CUDA cannot multiply ", ScalingName(args.a.scaling), " ",
        FormatName(args.a.format), " by ", ScalingName(args.b.scaling), " ",
        FormatName(args.b.format),
        " (supported: per-tensor x per-tensor, 1x128 with 1x128 or 128x128 but not 128x128 x "
        "128x128, MXFP8 x MXFP8; not E5M2 x E5M2)"));
  }
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    // Every element is an empty sum: zero, or unchanged when accumulating.
    if (!args.accumulate) {
      MOETRAIN_CUDA_RETURN_IF_ERROR(
          "fp8 gemm",
          cudaMemsetAsync(args.c.raw(), 0,
                          static_cast<size_t>(m) * static_cast<size_t>(n) * sizeof(float),
                          op.stream));
    }
    return absl::OkStatus();
  }
  if (path == Fp8GemmPath::kCublasLtPerTensor || path == Fp8GemmPath::kCublasLtBlockwise) {
    bool ran = false;
    MOETRAIN_RETURN_IF_ERROR(RunCublasLtFp8(op, args, &ran));
    if (ran) return absl::OkStatus();
    // No cuBLASLt kernel for this shape or alignment: the exact values in f32 instead.
    path = Fp8GemmPath::kDequantizedF32;
  }
  return DequantizedGemm(ctx, op, args,
                         path == Fp8GemmPath::kDequantizedBf16 ? DType::kBF16 : DType::kF32);
}

}  // namespace moetrain::ops::cuda
