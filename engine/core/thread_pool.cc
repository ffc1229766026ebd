#include "engine/core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace moetrain {
namespace {

// How long an idle thread polls before it sleeps: long enough to catch the next loop of a
// training step without a futex round trip, short enough not to steal a shared core.
constexpr std::chrono::microseconds kSpinBeforeSleep{10};

// True on pool workers, and on a caller while it runs a job: ParallelFor then runs inline.
thread_local bool t_inside_parallel_for = false;

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to kSpinBeforeSleep; true once it holds.
template <typename Predicate>
bool SpinUntil(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  for (int i = 1;; ++i) {
    if (done()) return true;
    // Reading the clock costs more than a pause, so only every 16th turn.
    if (i % 16 == 0 && std::chrono::steady_clock::now() > deadline) return false;
    CpuRelax();
  }
}

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
  std::vector<std::thread> workers;
  // Serialises ParallelFor calls from different threads: the fields below hold one job.
  std::mutex submit_mu;
  uint32_t last_job = 0;  // Guarded by submit_mu.

  // The current job. Written by the submitter before it publishes `claim`, and read by a thread
  // only after it has claimed a chunk: the job cannot finish (and be overwritten) before that
  // chunk is done, so the reads never race with the next job's writes.
  const absl::FunctionRef<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t num_chunks = 0;

  // (job id << 32) | chunks not yet claimed. Tagging with the job id lets a late thread, still
  // looking at a finished job, fail its claim instead of taking a chunk of the next one.
  std::atomic<uint64_t> claim{0};
  std::atomic<int64_t> chunks_done{0};

  // Sleeping is announced in these counters before checking for work (all seq_cst), so a
  // publisher either sees the sleeper and notifies, or the sleeper sees the new work.
  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::atomic<int> sleeping_workers{0};
  std::atomic<bool> submitter_sleeping{false};
  std::atomic<bool> stop{false};

  // Claims and runs one chunk of job `job`; false when that job has no chunk left.
  bool RunOneChunk(uint32_t job) {
    uint64_t seen = claim.load(std::memory_order_acquire);
    do {
      if (static_cast<uint32_t>(seen >> 32) != job || static_cast<uint32_t>(seen) == 0) {
        return false;
      }
    } while (!claim.compare_exchange_weak(seen, seen - 1, std::memory_order_acquire));
    const int64_t total = num_chunks;
    int64_t begin, end;
    ChunkBounds(n, total, static_cast<uint32_t>(seen) - 1, &begin, &end);
    (*fn)(begin, end);
    // After this increment the job may end, so nothing of it is read below.
    if (chunks_done.fetch_add(1) + 1 == total && submitter_sleeping.load()) {
      std::lock_guard<std::mutex> lock(mu);
      done_cv.notify_all();
    }
    return true;
  }

  void WorkerLoop() {
    t_inside_parallel_for = true;
    uint32_t seen_job = 0;
    while (true) {
      auto has_news = [&] {
        return stop.load() || static_cast<uint32_t>(claim.load() >> 32) != seen_job;
      };
      if (!SpinUntil(has_news)) {
        std::unique_lock<std::mutex> lock(mu);
        sleeping_workers.fetch_add(1);
        work_cv.wait(lock, has_news);
        sleeping_workers.fetch_sub(1);
      }
      if (stop.load()) return;
      seen_job = static_cast<uint32_t>(claim.load(std::memory_order_acquire) >> 32);
      while (RunOneChunk(seen_job)) {
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : state_(std::make_unique<State>()) {
  state_->num_threads = std::max(num_threads, 1);
  state_->workers.reserve(state_->num_threads - 1);
  for (int i = 1; i < state_->num_threads; ++i) {
    state_->workers.emplace_back([state = state_.get()] { state->WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop.store(true);
  }
  state_->work_cv.notify_all();
  for (std::thread& worker : state_->workers) worker.join();
}

int ThreadPool::num_threads() const { return state_->num_threads; }

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  State& s = *state_;
  const int64_t num_chunks = NumChunks(n, grain, s.num_threads);
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

  std::lock_guard<std::mutex> submit_lock(s.submit_mu);
  // Job ids skip 0, the id workers start out having seen.
  const uint32_t job = ++s.last_job == 0 ? ++s.last_job : s.last_job;
  s.fn = &fn;
  s.n = n;
  s.num_chunks = num_chunks;
  s.chunks_done.store(0, std::memory_order_relaxed);
  s.claim.store(uint64_t{job} << 32 | static_cast<uint64_t>(num_chunks));
  if (const int sleeping = s.sleeping_workers.load(); sleeping > 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    // The caller takes a chunk too, so at most num_chunks - 1 workers are needed.
    if (num_chunks - 1 >= sleeping) {
      s.work_cv.notify_all();
    } else {
      for (int64_t i = 0; i < num_chunks - 1; ++i) s.work_cv.notify_one();
    }
  }

  t_inside_parallel_for = true;
  while (s.RunOneChunk(job)) {
  }
  t_inside_parallel_for = false;

  auto all_done = [&] { return s.chunks_done.load() == num_chunks; };
  if (!SpinUntil(all_done)) {
    std::unique_lock<std::mutex> lock(s.mu);
    s.submitter_sleeping.store(true);
    s.done_cv.wait(lock, all_done);
    s.submitter_sleeping.store(false);
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
  // Leaked on purpose: joining workers during static destruction could race other statics.
  static ThreadPool* const pool = new ThreadPool(DefaultNumThreads());
  return *pool;
}

}  // namespace moetrain
