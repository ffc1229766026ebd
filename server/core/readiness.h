// Whether the coordinator takes work: one state machine, STARTING → SERVING → DRAINING → STOPPED,
// that HTTP /healthz and /readyz, the gRPC health service and the metrics all read, so that they
// never disagree.
//
//   Readiness readiness;                          // STARTING, "starting"
//   readiness.AddListener([](ReadinessState state, const std::string& reason) { ... });
//   MOETRAIN_RETURN_IF_ERROR(readiness.Transition(ReadinessState::kServing, "store opened"));
//
// Thread-safe. States only move forward; a process that stops serving does not come back.
#ifndef MOETRAIN_SERVER_CORE_READINESS_H_
#define MOETRAIN_SERVER_CORE_READINESS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"

namespace moetrain::server {

enum class ReadinessState { kStarting = 0, kServing = 1, kDraining = 2, kStopped = 3 };
inline constexpr ReadinessState kAllReadinessStates[] = {
    ReadinessState::kStarting, ReadinessState::kServing, ReadinessState::kDraining,
    ReadinessState::kStopped};

// "STARTING", "SERVING", "DRAINING" or "STOPPED".
const char* ReadinessStateName(ReadinessState state);

class Readiness {
 public:
  // Told the state and its reason. Listeners run one transition at a time, in order, on the
  // thread that made it; one must not call Transition, AddListener or RemoveListener.
  using Listener = std::function<void(ReadinessState state, const std::string& reason)>;
  using ListenerId = int64_t;

  Readiness() = default;
  Readiness(const Readiness&) = delete;
  Readiness& operator=(const Readiness&) = delete;

  ReadinessState state() const;
  std::string reason() const;
  // Both, read together.
  ReadinessState Get(std::string* reason) const;

  // Moves to a later state and tells every listener. FailedPrecondition for a state that is not
  // later than the current one (SERVING → STARTING, DRAINING → DRAINING): the caller is out of
  // step with the lifecycle.
  absl::Status Transition(ReadinessState next, std::string reason);

  // Calls `listener` at once with the current state, then after every transition, until it is
  // removed; no transition is missed or told twice.
  ListenerId AddListener(Listener listener);
  // After it returns the listener is not running and will not run again. Unknown ids are ignored.
  void RemoveListener(ListenerId id);

 private:
  // Held across a transition and its notifications, so that listeners see them in order.
  mutable std::mutex notify_mu_;
  std::map<ListenerId, Listener> listeners_ ABSL_GUARDED_BY(notify_mu_);
  ListenerId next_listener_id_ ABSL_GUARDED_BY(notify_mu_) = 1;

  mutable std::mutex mu_;  // taken inside notify_mu_, never the other way round
  ReadinessState state_ ABSL_GUARDED_BY(mu_) = ReadinessState::kStarting;
  std::string reason_ ABSL_GUARDED_BY(mu_) = "starting";
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_READINESS_H_
