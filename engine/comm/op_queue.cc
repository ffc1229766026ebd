#include "engine/comm/op_queue.h"

#include <memory>
#include <utility>

namespace moetrain {
namespace {

// Where an op's outcome lands; shared by the queue and the request, so a request may be waited
// for after its communicator is gone.
class Completion {
 public:
  void Complete(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  }

  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class QueuedRequest : public CommRequest {
 public:
  explicit QueuedRequest(std::shared_ptr<Completion> completion)
      : completion_(std::move(completion)) {}
  absl::Status Wait() override { return completion_->Wait(); }

 private:
  const std::shared_ptr<Completion> completion_;
};

}  // namespace

struct OpQueue::Entry {
  Op op;
  std::shared_ptr<Completion> completion;
};

OpQueue::OpQueue(std::function<void()> thread_init)
    : thread_([this, init = std::move(thread_init)]() mutable { Loop(std::move(init)); }) {}

OpQueue::~OpQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::unique_ptr<CommRequest> OpQueue::Enqueue(Op op) {
  auto completion = std::make_shared<Completion>();
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping) pending_.push_back(Entry{std::move(op), completion});
  }
  if (stopping) completion->Complete(absl::CancelledError("the communicator is shutting down"));
  return std::make_unique<QueuedRequest>(std::move(completion));
}

absl::Status OpQueue::Run(Op op) { return Enqueue(std::move(op))->Wait(); }

void OpQueue::Loop(std::function<void()> thread_init) {
  if (thread_init) thread_init();
  for (;;) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OpQueue* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue->mu_) {
            return queue->stopping_ || !queue->pending_.empty();
          },
          this));
      if (stopping_) break;
      entry = std::move(pending_.front());
      pending_.pop_front();
    }
    entry.completion->Complete(entry.op());
  }
  // Shutting down: whatever is left never runs.
  std::deque<Entry> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(pending_);
  }
  for (Entry& entry : left) {
    entry.completion->Complete(absl::CancelledError("the communicator was destroyed first"));
  }
}

}  // namespace moetrain
