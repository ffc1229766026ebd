#include "moetrain/v1/backoff.h"

#include <algorithm>

namespace moetrain {

absl::Duration Backoff::Next(absl::Time now) {
  const absl::Duration left = std::max(options_.deadline - now, absl::ZeroDuration());
  const absl::Duration wait = std::min(delay_, left);
  delay_ = std::min(delay_ * options_.factor, options_.max);
  return wait;
}

}  // namespace moetrain
