#include "engine/core/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"

namespace moetrain {
namespace {

// True while a thread runs a chunk: ParallelFor then runs inline.
thread_local bool t_inside_parallel_for = false;

int64_t NumChunks(int64_t n, int64_t grain, int num_threads) {
  if (n <= 0) return 0;
  return std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, num_threads);
}

// Chunk `c` of `num_chunks` near-equal ones; the first n % num_chunks get one extra element, so
// each is at least n / num_chunks >= grain long.
void ChunkBounds(int64_t n, int64_t num_chunks, int64_t c, int64_t* begin, int64_t* end) {
  const int64_t base = n / num_chunks;
  const int64_t extra = n % num_chunks;
  *begin = c * base + std::min(c, extra);
  *end = *begin + base + (c < extra ? 1 : 0);
}

}  // namespace

struct ThreadPool::State {
  int num_threads = 1;
};

ThreadPool::ThreadPool(int num_threads) : state_(std::make_unique<State>()) {
  state_->num_threads = std::max(num_threads, 1);
}

ThreadPool::~ThreadPool() = default;

int ThreadPool::num_threads() const { return state_->num_threads; }

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  const int64_t num_chunks = NumChunks(n, grain, state_->num_threads);
  if (num_chunks == 0) return;
  const bool was_inside = t_inside_parallel_for;
  if (was_inside || num_chunks == 1) {
    // The same chunks as a parallel run, so that results match it bit for bit.
    t_inside_parallel_for = true;
    for (int64_t c = 0; c < num_chunks; ++c) {
      int64_t begin, end;
      ChunkBounds(n, num_chunks, c, &begin, &end);
      fn(begin, end);
    }
    t_inside_parallel_for = was_inside;
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(num_chunks))
  {
    t_inside_parallel_for = true;
    const int64_t team = omp_get_num_threads();
    for (int64_t c = omp_get_thread_num(); c < num_chunks; c += team) {
      int64_t begin, end;
      ChunkBounds(n, num_chunks, c, &begin, &end);
      fn(begin, end);
    }
    t_inside_parallel_for = false;
  }
}

namespace {

int DefaultNumThreads() {
  if (const char* env = std::getenv("MOETRAIN_NUM_THREADS"); env != nullptr) {
    int value = 0;
    if (absl::SimpleAtoi(env, &value) && value > 0) return value;
    std::fprintf(stderr, "moetrain: ignoring MOETRAIN_NUM_THREADS='%s' (not a positive integer)\n",
                 env);
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

ThreadPool& DefaultThreadPool() {
  // Leaked on purpose, so that it outlives every other static that may run a loop on it.
  static ThreadPool* const pool = new ThreadPool(DefaultNumThreads());
  return *pool;
}

}  // namespace moetrain
