#include "engine/core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

using Chunk = std::pair<int64_t, int64_t>;

// The chunks one ParallelFor hands out, sorted by begin.
std::vector<Chunk> RecordChunks(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex mu;
  std::vector<Chunk> chunks;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

// Spins until `count` reaches `target`; false after a generous timeout instead of hanging.
bool WaitForCount(const std::atomic<int>& count, int target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (count.load() < target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Runs `body` on a fresh thread and aborts if it has not finished within 60 s, so that a
// deadlock fails at once rather than at the ctest timeout.
void RunWithDeadlockGuard(const std::function<void()>& body) {
  std::promise<void> finished;
  std::future<void> done = finished.get_future();
  std::thread runner([&] {
    body();
    finished.set_value();
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "deadlock: the test body did not finish within 60 s\n");
    std::abort();
  }
  runner.join();
}

TEST(ThreadPoolTest, CoversEveryIndexOnceWithMaximalChunks) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 100, 1000, 12345}) {
      for (int64_t grain : {0, 1, 2, 3, 7, 64, 1000, 100000}) {
        SCOPED_TRACE(testing::Message()
                     << "threads " << threads << " n " << n << " grain " << grain);
        std::vector<std::atomic<int>> hits(n);
        std::mutex mu;
        std::vector<Chunk> chunks;
        pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          chunks.emplace_back(begin, end);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;

        // As many chunks as the grain allows, up to one per thread; none for n = 0.
        const int64_t effective_grain = std::max<int64_t>(grain, 1);
        const int64_t expected_chunks =
            n == 0 ? 0 : std::clamp<int64_t>(n / effective_grain, 1, threads);
        ASSERT_EQ(static_cast<int64_t>(chunks.size()), expected_chunks);
        std::sort(chunks.begin(), chunks.end());
        int64_t next = 0;
        for (const auto& [begin, end] : chunks) {
          EXPECT_EQ(begin, next);
          EXPECT_GT(end, begin);
          // Only a lone chunk of a short range may be shorter than the grain.
          if (n >= effective_grain) {
            EXPECT_GE(end - begin, effective_grain);
          }
          next = end;
        }
        EXPECT_EQ(next, n);
      }
    }
  }
}

TEST(ThreadPoolTest, ChunkLayoutIsPureFunctionOfArguments) {
  ThreadPool pool(4);
  ThreadPool twin(4);
  const std::vector<Chunk> first = RecordChunks(pool, 1003, 10);
  ASSERT_EQ(first.size(), 4u);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(RecordChunks(pool, 1003, 10), first) << i;
  EXPECT_EQ(RecordChunks(twin, 1003, 10), first);
  // Near-equal: sizes differ by at most one.
  for (const auto& [begin, end] : first) {
    EXPECT_GE(end - begin, 1003 / 4);
    EXPECT_LE(end - begin, 1003 / 4 + 1);
  }
}

TEST(ThreadPoolTest, NestedCallsRunInlineWithTheSameChunks) {
  ThreadPool pool(4);
  const std::vector<Chunk> top_level = RecordChunks(pool, 100, 1);
  std::atomic<int> mismatches{0};
  std::atomic<int> outer_chunks{0};
  RunWithDeadlockGuard([&] {
    pool.ParallelFor(8, 1, [&](int64_t, int64_t) {
      const std::thread::id outer_thread = std::this_thread::get_id();
      std::vector<Chunk> inner;  // Unsynchronised on purpose: inline calls are sequential.
      pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
        if (std::this_thread::get_id() != outer_thread) mismatches.fetch_add(1);
        inner.emplace_back(begin, end);
      });
      // Inline runs visit the chunks in order, so no sort is needed.
      if (inner != top_level) mismatches.fetch_add(1);
      outer_chunks.fetch_add(1);
    });
  });
  EXPECT_EQ(outer_chunks.load(), 4);
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ThreadPoolTest, CallsOnAnotherPoolFromInsideFnAlsoRunInline) {
  ThreadPool outer(2), inner(2);
  std::atomic<int> off_thread{0};
  RunWithDeadlockGuard([&] {
    outer.ParallelFor(2, 1, [&](int64_t, int64_t) {
      const std::thread::id me = std::this_thread::get_id();
      inner.ParallelFor(10, 1, [&](int64_t, int64_t) {
        if (std::this_thread::get_id() != me) off_thread.fetch_add(1);
      });
    });
  });
  EXPECT_EQ(off_thread.load(), 0);
}

TEST(ThreadPoolTest, PoolOfOneRunsOnTheCaller) {
  for (int requested : {1, 0, -3}) {  // Sizes below one mean one.
    ThreadPool pool(requested);
    EXPECT_EQ(pool.num_threads(), 1);
    std::vector<Chunk> chunks;
    std::vector<std::thread::id> threads;
    pool.ParallelFor(1000, 1, [&](int64_t begin, int64_t end) {
      chunks.emplace_back(begin, end);
      threads.push_back(std::this_thread::get_id());
    });
    EXPECT_EQ(chunks, (std::vector<Chunk>{{0, 1000}}));
    EXPECT_EQ(threads, (std::vector<std::thread::id>{std::this_thread::get_id()}));
  }
}

TEST(ThreadPoolTest, ShortRangesRunInlineOnTheCaller) {
  ThreadPool pool(4);
  std::vector<std::thread::id> threads;
  pool.ParallelFor(5, 8, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 5);
    threads.push_back(std::this_thread::get_id());
  });
  EXPECT_EQ(threads, (std::vector<std::thread::id>{std::this_thread::get_id()}));
}

// How many threads ran `chunks` chunks of one call at the same time: each chunk waits for all the
// others to start, so the answer is `chunks` only when that many threads ran them together (and 0
// when some chunk gave up waiting).
size_t ThreadsRunningAtOnce(ThreadPool& pool, int chunks) {
  std::atomic<int> started{0};
  std::atomic<int> timeouts{0};
  std::mutex mu;
  std::set<std::thread::id> threads;
  pool.ParallelFor(chunks, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    started.fetch_add(1);
    if (!WaitForCount(started, chunks)) timeouts.fetch_add(1);
  });
  return timeouts.load() == 0 ? threads.size() : 0;
}

// Sleeping first lets OpenMP's idle workers go past their spin and block, so the wake-up path is
// the one exercised.
TEST(ThreadPoolTest, AllThreadsRunConcurrentlyAfterSleeping) {
  ThreadPool pool(4);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(ThreadsRunningAtOnce(pool, 4), 4u) << "round " << round;
  }
}

TEST(ThreadPoolTest, CallerWaitsForASlowWorkerChunk) {
  ThreadPool pool(2);
  std::atomic<int> started{0};
  std::atomic<bool> slow_chunk_done{false};
  const std::thread::id caller = std::this_thread::get_id();
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    started.fetch_add(1);
    // Both chunks in flight at once forces one onto the worker.
    WaitForCount(started, 2);
    if (std::this_thread::get_id() != caller) {
      // Long past OpenMP's spin at the closing barrier, so the caller has to block and be woken.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      slow_chunk_done.store(true);
    }
  });
  EXPECT_TRUE(slow_chunk_done.load());
}

TEST(ThreadPoolTest, TenThousandSmallCallsAreCorrect) {
  ThreadPool pool(std::max(2u, std::thread::hardware_concurrency()));
  std::vector<int64_t> values(256);
  RunWithDeadlockGuard([&] {
    for (int call = 0; call < 10000; ++call) {
      pool.ParallelFor(values.size(), 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) values[i] += i;
      });
      // Small sleeps now and then make workers fall asleep between some calls.
      if (call % 1000 == 999) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // Timing is the benchmark's business, never a test's: only the deadlock guard bounds time.
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    ASSERT_EQ(values[i], 10000 * i) << i;
  }
}

TEST(ThreadPoolTest, ConcurrentCallersTakeTurns) {
  ThreadPool pool(3);
  constexpr int kCalls = 2000;
  std::vector<std::atomic<int64_t>> sums(2);
  auto caller = [&](int which) {
    for (int call = 0; call < kCalls; ++call) {
      pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sums[which].fetch_add(i);
      });
    }
  };
  RunWithDeadlockGuard([&] {
    std::thread a(caller, 0), b(caller, 1);
    a.join();
    b.join();
  });
  EXPECT_EQ(sums[0].load(), int64_t{kCalls} * 4950);
  EXPECT_EQ(sums[1].load(), int64_t{kCalls} * 4950);
}

// A pool owns no threads: they are OpenMP's one team, shared by every pool (and oneDNN). So
// destroying a pool, unused or right after a call, must leave the team whole for the pools that
// remain, the default one included.
TEST(ThreadPoolTest, DestroyingAPoolLeavesTheSharedTeamToTheOthers) {
  ThreadPool survivor(4);
  RunWithDeadlockGuard([&] {
    for (int i = 0; i < 20; ++i) {
      { ThreadPool unused(4); }
      {
        ThreadPool used(4);
        ASSERT_EQ(ThreadsRunningAtOnce(used, 4), 4u) << i;
      }
      ASSERT_EQ(ThreadsRunningAtOnce(survivor, 4), 4u) << i;
    }
  });
  ThreadPool& shared = DefaultThreadPool();
  const int width = std::min(shared.num_threads(), 4);
  EXPECT_EQ(ThreadsRunningAtOnce(shared, width), static_cast<size_t>(width));
}

TEST(DefaultThreadPoolTest, IsOneSharedPool) {
  ThreadPool& pool = DefaultThreadPool();
  EXPECT_EQ(&pool, &DefaultThreadPool());
  EXPECT_GE(pool.num_threads(), 1);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(1000, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
  });
  EXPECT_EQ(sum.load(), 499500);
}

// The default pool is created once per process, so each setting is tried in a fresh one.
TEST(DefaultThreadPoolDeathTest, HonoursMoetrainNumThreads) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("MOETRAIN_NUM_THREADS", "3", 1);
        std::_Exit(DefaultThreadPool().num_threads() == 3 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EXIT(
      {
        setenv("MOETRAIN_NUM_THREADS", "zero", 1);
        std::_Exit(DefaultThreadPool().num_threads() == hardware ? 0 : 1);
      },
      testing::ExitedWithCode(0), "ignoring MOETRAIN_NUM_THREADS='zero'");
}

}  // namespace
}  // namespace moetrain
