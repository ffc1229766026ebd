// One line per event on stderr, for the daemons (coordinator and worker): an RFC 3339 UTC time,
// then the message. Whole lines are written with one call, so concurrent lines do not interleave.
//
//   Log(absl::StrCat("worker ", id, " registered"));
#ifndef MOETRAIN_ENGINE_CORE_LOG_H_
#define MOETRAIN_ENGINE_CORE_LOG_H_

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace moetrain {

// On by default; `moetrain run`, which embeds a coordinator and a worker, turns it off so that
// the daemons' lines do not interleave with its own progress output.
inline std::atomic<bool>& LogEnabled() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

inline void Log(absl::string_view message) {
  if (!LogEnabled().load(std::memory_order_relaxed)) return;
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), " ",
                   message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_CORE_LOG_H_
