// Data-parallel loops on the CPU.
//
// The threads are OpenMP's: oneDNN runs its GEMMs on the OpenMP thread team, and a second set of
// threads would fight that team's spinning workers for the same cores after every GEMM (on two
// cores this cost a third of the MoE layer's non-GEMM time). Sharing one team keeps every core
// busy with one thing and the workers warm between GEMMs and row kernels.
#ifndef MOETRAIN_ENGINE_CORE_THREAD_POOL_H_
#define MOETRAIN_ENGINE_CORE_THREAD_POOL_H_

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"

namespace moetrain {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;

  // Calls fn(begin, end) on disjoint chunks covering [0, n), each at least `grain` long (the last
  // may be shorter), and returns when all are done. The calling thread runs a share. Chunks are
  // a pure function of (n, grain, num_threads), so results do not depend on timing: n is split
  // evenly into min(num_threads, n / grain) chunks (at least one; none when n is 0). Calls from
  // inside fn (on any pool) run the same chunks inline, one after another. Concurrent calls from
  // different threads are safe and take turns. fn must not throw.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The process-wide pool, created on first use and never destroyed (so that it outlives other
// statics). One thread per hardware thread, or MOETRAIN_NUM_THREADS when that environment
// variable holds a positive integer.
ThreadPool& DefaultThreadPool();

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_THREAD_POOL_H_
