#include "engine/ops/gemm/gemm.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "engine/ops/common/op_checks.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/gemm/gemm_cpu.h"
#if MOETRAIN_HAVE_CUDA
#include "engine/ops/gemm/gemm_cuda.h"
#endif

namespace moetrain::ops {
absl::Status Gemm(const ExecContext& ctx, const GemmArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(
      CheckDevices(ctx, "gemm", {{"a", args.a}, {"b", args.b}, {"c", args.c}}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.a, "gemm a", {-1, -1}));
  MOETRAIN_RETURN_IF_ERROR(CheckAct(args.b, "gemm b", {-1, -1}));
  if (args.a.dtype() != args.b.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm: a is ", args.a.DebugString(), " but b is ", args.b.DebugString()));
  }
  const int64_t m = args.trans_a ? args.a.dim(1) : args.a.dim(0);
  const int64_t k = args.trans_a ? args.a.dim(0) : args.a.dim(1);
  const int64_t kb = args.trans_b ? args.b.dim(1) : args.b.dim(0);
  const int64_t n = args.trans_b ? args.b.dim(0) : args.b.dim(1);
  if (k != kb) {
    return absl::InvalidArgumentError(absl::StrCat("gemm: inner dimensions differ: op(a) ",
                                                   args.a.DebugString(), " has K = ", k, ", op(b) ",
                                                   args.b.DebugString(), " has K = ", kb));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.c, "gemm c", DType::kF32, {m, n}));
#if MOETRAIN_HAVE_CUDA
  if (ctx.device().type == DeviceType::kCuda) return cuda::Gemm(ctx, args, m, n, k);
#endif
  if (!ctx.device().is_cpu()) return NoBackend(ctx, "gemm");
  return cpu::Gemm(args, m, n, k);
}

absl::StatusOr<double> MeasureGemmFlops(const ExecContext& ctx, DType dtype, int64_t n, int reps) {
  if (n < 1 || reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureGemmFlops: n = ", n, " and reps = ", reps, " must be positive"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(Tensor a, Tensor::Allocate(ctx.allocator(), dtype, {n, n}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor b, Tensor::Allocate(ctx.allocator(), dtype, {n, n}));
  MOETRAIN_ASSIGN_OR_RETURN(Tensor c, Tensor::Allocate(ctx.allocator(), DType::kF32, {n, n}));
  // Random values: a GPU multiplying zeros draws less power and holds higher clocks than it
  // would on real operands, overstating the rate MFU is measured against.
  {
    MOETRAIN_ASSIGN_OR_RETURN(Tensor normal,
                              Tensor::Allocate(ctx.allocator(), DType::kF32, {n, n}));
    for (Tensor* operand : {&a, &b}) {
      const Rng rng(/*seed=*/operand == &a ? 1 : 2, /*step=*/0, /*rank=*/0, /*stream_id=*/0);
      MOETRAIN_RETURN_IF_ERROR(FillNormal(ctx, normal, rng, 0.0f, 1.0f));
      MOETRAIN_RETURN_IF_ERROR(ConvertTensor(ctx, normal, *operand));
    }
  }
  std::vector<double> seconds;
  for (int i = 0; i <= reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    MOETRAIN_RETURN_IF_ERROR(Gemm(ctx, {.a = a, .b = b, .c = c}));
    MOETRAIN_RETURN_IF_ERROR(ctx.Synchronize());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (i > 0) seconds.push_back(took.count());  // the first run builds the primitive
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * n * n * n / std::max(seconds[seconds.size() / 2], 1e-12);
}

}  // namespace moetrain::ops
