#include "engine/backend/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace moetrain::cpu {
namespace {

using dnnl::memory;

// Which dimension of a GEMM varies from call to call: the rows of a ragged expert batch are M in
// the forward and backward-data products and K in the weight gradient. oneDNN's jit GEMM keeps
// full speed with that one dimension (and the strides that follow from it) given only at
// execution time, so each weight shape needs one primitive however the tokens fall; with every
// dimension left open it falls back to a reference kernel, so the rest stays fixed.
enum class RuntimeDim { kNone, kM, kK };

// c (m, n) [+]= op(a) (m, k) · op(b) (k, n), raw pointers with leading dimensions of the
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

// A cached primitive and the scratchpad it needs at execution (zero bytes for some kernels).
// Every primitive here is built with scratchpad_mode::user: with oneDNN's default library mode,
// one scratchpad buffer belongs to the primitive and is shared by all its executions, so two
// threads running a GEMM of the same shape at once overwrite each other's temporaries.
struct CachedMatmul {
  dnnl::matmul primitive;
  memory::desc scratchpad;
};

// `bytes` of scratch space, 64-byte aligned, owned by the calling thread and valid until its next
// call; grown when too small and never shrunk, so after warm-up no call allocates. nullptr when
// the allocation fails. A thread runs one primitive at a time; the OpenMP threads of that run
// each use their own slice of the caller's buffer. Unlike library mode, which keeps a buffer per
// primitive for the life of the process, this holds only the largest one each thread has needed.
void* ThreadScratchpad(size_t bytes) {
  struct Buffer {
    std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
    size_t bytes = 0;
  };
  constexpr size_t kAlignment = 64;
  thread_local Buffer buffer;
  if (bytes > buffer.bytes) {
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    buffer.data.reset(std::aligned_alloc(kAlignment, rounded));
    buffer.bytes = buffer.data == nullptr ? 0 : rounded;
  }
  return buffer.data.get();
}

// The engine is shared (oneDNN's CPU engine is safe to use from any thread), streams are one
// per thread, and the map of primitives is guarded by mu_. A cached primitive may run on several
// threads at once because its temporaries live in each caller's ThreadScratchpad.
class MatmulCache {
 public:
  static MatmulCache& Get() {
    static MatmulCache* cache = new MatmulCache();
    return *cache;
  }

  dnnl::engine& engine() { return engine_; }
  // One stream per thread: grouped GEMMs run groups on several threads at once.
  dnnl::stream& stream() {
    thread_local dnnl::stream stream(engine_);
    return stream;
  }

  // The primitive for g's shape class, built on first use. The reference stays valid: entries
  // are never removed, and std::map does not move them.
  const CachedMatmul& Primitive(const RawGemm& g) {
    constexpr int64_t kRuntime = DNNL_RUNTIME_DIM_VAL;
    const bool rt_m = g.runtime_dim == RuntimeDim::kM, rt_k = g.runtime_dim == RuntimeDim::kK;
    Key key = {static_cast<int>(g.dtype),
               g.trans_a,
               g.trans_b,
               g.accumulate,
               rt_m ? kRuntime : g.m,
               g.n,
               rt_k ? kRuntime : g.k,
               (rt_m && g.trans_a) || (rt_k && !g.trans_a) ? kRuntime : g.lda,
               rt_k && g.trans_b ? kRuntime : g.ldb,
               g.ldc};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = primitives_.find(key);
    if (it != primitives_.end()) return it->second;
    const memory::data_type dt = ToDnnl(g.dtype);
    memory::desc a({key.m, key.k}, dt,
                   g.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
    memory::desc b({key.k, key.n}, dt,
                   g.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
    memory::desc c({key.m, key.n}, memory::data_type::f32, {key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (g.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine_);
    return primitives_.emplace(key, CachedMatmul{dnnl::matmul(pd), pd.scratchpad_desc()})
        .first->second;
  }

 private:
  struct Key {
    int dtype;
    bool trans_a, trans_b, accumulate;
    int64_t m, n, k, lda, ldb, ldc;
    auto operator<=>(const Key&) const = default;
  };

  static memory::data_type ToDnnl(DType dtype) {
    return dtype == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
  }

  MatmulCache() : engine_(dnnl::engine::kind::cpu, 0) {}

  dnnl::engine engine_;
  std::mutex mu_;
  std::map<Key, CachedMatmul> primitives_;  // guarded by mu_; entries are never removed
};

// oneDNN reports failure by exception (e.g. no bf16 matmul on a CPU without AVX-512); none
// may escape into the caller, so every call is turned into a Status here.
absl::Status RunGemm(const RawGemm& g) {
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  if (g.k == 0) {
    if (!g.accumulate) {
      for (int64_t i = 0; i < g.m; ++i) std::memset(g.c + i * g.ldc, 0, g.n * sizeof(float));
    }
    return absl::OkStatus();
  }
  try {
    MatmulCache& cache = MatmulCache::Get();
    const CachedMatmul& matmul = cache.Primitive(g);
    const memory::data_type dt =
        g.dtype == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
    memory::desc a_desc({g.m, g.k}, dt,
                        g.trans_a ? memory::dims{1, g.lda} : memory::dims{g.lda, 1});
    memory::desc b_desc({g.k, g.n}, dt,
                        g.trans_b ? memory::dims{1, g.ldb} : memory::dims{g.ldb, 1});
    memory::desc c_desc({g.m, g.n}, memory::data_type::f32, {g.ldc, 1});
    memory a(a_desc, cache.engine(), const_cast<void*>(g.a));
    memory b(b_desc, cache.engine(), const_cast<void*>(g.b));
    memory c(c_desc, cache.engine(), g.c);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (const size_t bytes = matmul.scratchpad.get_size(); bytes > 0) {
      void* scratchpad = ThreadScratchpad(bytes);
      if (scratchpad == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes of scratchpad for a GEMM of (", g.m,
                         ", ", g.k, ") x (", g.k, ", ", g.n, ")"));
      }
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(matmul.scratchpad, cache.engine(), scratchpad));
    }
    matmul.primitive.execute(cache.stream(), args);
    cache.stream().wait();
  } catch (const dnnl::error& e) {
    return absl::UnimplementedError(absl::StrCat(
        "oneDNN cannot run a ", g.dtype == DType::kBF16 ? "bf16" : "f32", " GEMM of (", g.m, ", ",
        g.k, ") x (", g.k, ", ", g.n, ") on this CPU",
        g.dtype == DType::kBF16 ? " (bf16 needs AVX-512; use f32)" : "", ": ", e.what()));
  }
  return absl::OkStatus();
}

// Runs the GEMM of each group (make(g) describes it). With many non-empty groups, whole groups
// go to the threads of the OpenMP team, each GEMM single-threaded inside the parallel region:
// a small expert GEMM split over threads spends much of its time synchronising, while whole
// groups balance well once there are several per thread. With few groups, each GEMM uses every
// thread instead. Either way each group's result depends only on its own inputs.
absl::Status RunGroupedGemms(absl::Span<const int64_t> offsets,
                             absl::FunctionRef<RawGemm(int64_t)> make) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  int64_t busy_groups = 0;
  for (int64_t g = 0; g < groups; ++g) busy_groups += offsets[g + 1] > offsets[g] ? 1 : 0;
  const int threads = omp_get_max_threads();
  if (threads == 1 || busy_groups < 4 * threads || omp_in_parallel()) {
    for (int64_t g = 0; g < groups; ++g) MOETRAIN_RETURN_IF_ERROR(RunGemm(make(g)));
    return absl::OkStatus();
  }
  std::mutex mu;
  absl::Status first_error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t g = 0; g < groups; ++g) {
    absl::Status status = RunGemm(make(g));
    if (!status.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = std::move(status);
    }
  }
  return first_error;
}

absl::Status CheckInputDType(const TensorView& t, const char* name) {
  if (t.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no tensor"));
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": dtype ", t.DebugString(), " is not f32 or bf16"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": must be contiguous"));
  }
  return absl::OkStatus();
}

char* RowPtr(const TensorView& t, int64_t row, int64_t row_elems) {
  return static_cast<char*>(t.raw()) + row * row_elems * DTypeSize(t.dtype());
}

// Checks offsets (G + 1, non-decreasing, from 0 to rows).
absl::Status CheckOffsets(absl::Span<const int64_t> offsets, int64_t groups, int64_t rows) {
  if (static_cast<int64_t>(offsets.size()) != groups + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets: size ", offsets.size(), " must be groups + 1 = ", groups + 1));
  }
  if (offsets.front() != 0 || offsets.back() != rows) {
    return absl::InvalidArgumentError(absl::StrCat("offsets: must run from 0 to rows = ", rows,
                                                   ", got ", offsets.front(), " .. ",
                                                   offsets.back()));
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (offsets[g + 1] < offsets[g]) {
      return absl::InvalidArgumentError(absl::StrCat("offsets: decrease at group ", g, " (",
                                                     offsets[g], " > ", offsets[g + 1], ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Gemm(const GemmArgs& args) {
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(args.a, "gemm a"));
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(args.b, "gemm b"));
  for (const auto& [t, name] : {std::pair{args.a, "gemm a"}, {args.b, "gemm b"}}) {
    if (t.rank() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected a matrix, got ", t.DebugString()));
    }
  }
  if (args.a.dtype() != args.b.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemm: a is ", args.a.DebugString(), " but b is ", args.b.DebugString()));
  }
  int64_t m = args.trans_a ? args.a.dim(1) : args.a.dim(0);
  int64_t k = args.trans_a ? args.a.dim(0) : args.a.dim(1);
  int64_t kb = args.trans_b ? args.b.dim(1) : args.b.dim(0);
  int64_t n = args.trans_b ? args.b.dim(0) : args.b.dim(1);
  if (k != kb) {
    return absl::InvalidArgumentError(absl::StrCat("gemm: inner dimensions differ: op(a) ",
                                                   args.a.DebugString(), " has K = ", k, ", op(b) ",
                                                   args.b.DebugString(), " has K = ", kb));
  }
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(args.c, "gemm c", DType::kF32, {m, n}));
  return RunGemm({args.a.dtype(), args.a.raw(), args.b.raw(), args.c.data<float>(), m, n, k,
                  args.a.dim(1), args.b.dim(1), n, args.trans_a, args.trans_b, args.accumulate,
                  RuntimeDim::kNone});
}

absl::Status GroupedGemmForward(TensorView x, TensorView w, absl::Span<const int64_t> offsets,
                                TensorView y) {
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(x, "grouped gemm x"));
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(w, "grouped gemm w"));
  if (x.rank() != 2) return absl::InvalidArgumentError("grouped gemm x: must be (R, K)");
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w, "grouped gemm w", x.dtype(), {-1, -1, x.dim(1)}));
  const int64_t rows = x.dim(0), groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(y, "grouped gemm y", DType::kF32, {rows, n}));
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
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
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(dy, "grouped gemm dy"));
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(w, "grouped gemm w"));
  if (dy.rank() != 2) return absl::InvalidArgumentError("grouped gemm dy: must be (R, N)");
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(w, "grouped gemm w", dy.dtype(), {-1, dy.dim(1), -1}));
  const int64_t rows = dy.dim(0), groups = w.dim(0), n = w.dim(1), k = w.dim(2);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(dx, "grouped gemm dx", DType::kF32, {rows, k}));
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
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
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(dy, "grouped gemm dy"));
  MOETRAIN_RETURN_IF_ERROR(CheckInputDType(x, "grouped gemm x"));
  if (dy.rank() != 2 || x.rank() != 2) {
    return absl::InvalidArgumentError("grouped gemm: dy and x must be matrices");
  }
  MOETRAIN_RETURN_IF_ERROR(CheckTensor(x, "grouped gemm x", dy.dtype(), {dy.dim(0), -1}));
  const int64_t rows = dy.dim(0), n = dy.dim(1), k = x.dim(1);
  MOETRAIN_RETURN_IF_ERROR(CheckDenseTensor(dw, "grouped gemm dw", DType::kF32, {-1, n, k}));
  const int64_t groups = dw.dim(0);
  MOETRAIN_RETURN_IF_ERROR(CheckOffsets(offsets, groups, rows));
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

absl::StatusOr<double> MeasureGemmFlops(DType dtype, int64_t n, int reps) {
  if (n < 1 || reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureGemmFlops: n = ", n, " and reps = ", reps, " must be positive"));
  }
  const Tensor a = Tensor::Zeros(dtype, {n, n}), b = Tensor::Zeros(dtype, {n, n});
  Tensor c = Tensor::Empty(DType::kF32, {n, n});
  std::vector<double> seconds;
  for (int i = 0; i <= reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    MOETRAIN_RETURN_IF_ERROR(Gemm({.a = a, .b = b, .c = c}));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (i > 0) seconds.push_back(took.count());  // the first run builds the primitive
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * n * n * n / std::max(seconds[seconds.size() / 2], 1e-12);
}

}  // namespace moetrain::cpu
