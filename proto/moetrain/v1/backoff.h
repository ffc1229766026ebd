// How long to wait between the tries of a call that failed in a way worth retrying (the
// coordinator restarting or unreachable): exponential backoff, capped, optionally within a
// deadline. The caller decides what is worth retrying and how to wait (a sleep, or a condition
// variable that a stop request wakes).
//
//   Backoff backoff({.initial = absl::Milliseconds(50), .max = absl::Seconds(2)});
//   while (Retryable(status = Call())) absl::SleepFor(backoff.Next());
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_BACKOFF_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_BACKOFF_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace moetrain {

struct BackoffOptions {
  // The first wait; each later one is `factor` times the one before, up to `max`.
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
  double factor = 2;
  // No wait reaches past this time: the one that would is cut short, and after it every wait is
  // zero (Expired says when to stop trying).
  absl::Time deadline = absl::InfiniteFuture();
};

class Backoff {
 public:
  explicit Backoff(const BackoffOptions& options) : options_(options), delay_(options.initial) {}

  // The wait before the next try (the current delay, cut at the deadline); the delay then grows.
  absl::Duration Next(absl::Time now = absl::Now());
  // Back to `initial`, after a call that succeeded.
  void Reset() { delay_ = options_.initial; }
  // Whether the deadline has passed.
  bool Expired(absl::Time now = absl::Now()) const { return now >= options_.deadline; }

 private:
  BackoffOptions options_;
  absl::Duration delay_;
};

}  // namespace moetrain

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_BACKOFF_H_
