#include "engine/comm/op_queue.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

TEST(OpQueueTest, RunsInStartOrderOnOneThread) {
  std::thread::id init_thread;
  OpQueue queue([&] { init_thread = std::this_thread::get_id(); });
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<std::unique_ptr<CommRequest>> requests;
  for (int i = 0; i < 50; ++i) {
    requests.push_back(queue.Enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
      return i == 7 ? absl::InternalError("seven") : absl::OkStatus();
    }));
  }
  // Waited for backwards: each still reports its own outcome.
  for (int i = 49; i >= 0; --i) {
    EXPECT_EQ(requests[i]->Wait().ok(), i != 7) << i;
  }
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(order[i], i);
    EXPECT_EQ(threads[i], init_thread);
  }
  EXPECT_NE(init_thread, std::this_thread::get_id());
}

TEST(OpQueueTest, DestructionFinishesTheRunningOpAndCancelsTheRest) {
  std::promise<void> started;
  std::atomic<bool> release{false};
  auto queue = std::make_unique<OpQueue>();
  auto running = queue->Enqueue([&] {
    started.set_value();
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  });
  auto queued = queue->Enqueue([] { return absl::InternalError("must not run"); });
  started.get_future().wait();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    release.store(true);
  });
  queue.reset();
  releaser.join();
  EXPECT_TRUE(running->Wait().ok());
  EXPECT_EQ(queued->Wait().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace moetrain
