#include "server/core/readiness.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace moetrain::server {

const char* ReadinessStateName(ReadinessState state) {
  switch (state) {
    case ReadinessState::kStarting:
      return "STARTING";
    case ReadinessState::kServing:
      return "SERVING";
    case ReadinessState::kDraining:
      return "DRAINING";
    case ReadinessState::kStopped:
      return "STOPPED";
  }
  return "UNKNOWN";
}

ReadinessState Readiness::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::string Readiness::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

ReadinessState Readiness::Get(std::string* reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  *reason = reason_;
  return state_;
}

absl::Status Readiness::Transition(ReadinessState next, std::string reason) {
  std::lock_guard<std::mutex> notify_lock(notify_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(next) <= static_cast<int>(state_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("readiness transition ", ReadinessStateName(state_), " -> ",
                       ReadinessStateName(next), " does not move forward"));
    }
    state_ = next;
    reason_ = reason;
  }
  for (const auto& [id, listener] : listeners_) listener(next, reason);
  return absl::OkStatus();
}

Readiness::ListenerId Readiness::AddListener(Listener listener) {
  std::lock_guard<std::mutex> notify_lock(notify_mu_);
  std::string reason;
  const ReadinessState current = Get(&reason);
  listener(current, reason);
  const ListenerId id = next_listener_id_++;
  listeners_.emplace(id, std::move(listener));
  return id;
}

void Readiness::RemoveListener(ListenerId id) {
  std::lock_guard<std::mutex> notify_lock(notify_mu_);
  listeners_.erase(id);
}

}  // namespace moetrain::server
