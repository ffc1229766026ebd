#include "engine/ops/gemm/gemm_cpu.h"

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

}  // namespace

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

absl::Status Gemm(const ops::GemmArgs& args, int64_t m, int64_t n, int64_t k) {
  return RunGemm({args.a.dtype(), args.a.raw(), args.b.raw(), args.c.data<float>(), m, n, k,
                  args.a.dim(1), args.b.dim(1), n, args.trans_a, args.trans_b, args.accumulate,
                  RuntimeDim::kNone});
}

}  // namespace moetrain::cpu
