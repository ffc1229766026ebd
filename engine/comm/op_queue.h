// Runs a communicator's operations one at a time, in the order they were started, on a thread of
// its own: Start* returns at once, compute overlaps the transfer, and every rank executes its
// collectives in the order it started them, which is what keeps a group's ranks matched.
#ifndef MOETRAIN_ENGINE_COMM_OP_QUEUE_H_
#define MOETRAIN_ENGINE_COMM_OP_QUEUE_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "engine/comm/communicator.h"

namespace moetrain {

class OpQueue {
 public:
  using Op = std::function<absl::Status()>;

  // `thread_init` runs first on the queue's thread (e.g. to set its signal mask, which threads it
  // starts inherit).
  explicit OpQueue(std::function<void()> thread_init = nullptr);
  // Ops not yet started complete with Cancelled; the running one finishes first.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Queues `op`; the request's Wait returns its status once it has run. Safe from any thread.
  std::unique_ptr<CommRequest> Enqueue(Op op);
  // Enqueue and wait.
  absl::Status Run(Op op);

 private:
  struct Entry;
  void Loop(std::function<void()> thread_init);

  absl::Mutex mu_;
  std::deque<Entry> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_OP_QUEUE_H_
