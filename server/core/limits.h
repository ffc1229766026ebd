// Bounds on the strings the coordinator stores and lists, so that no request (and no worker) can
// grow a job's row or an event past what a listing can carry. docs/service.md ("Size limits")
// lists them. A user's request over a limit is refused (InvalidArgument naming the field and its
// length: the user can send it again, shorter); text a worker reports once and cannot resend (a
// failure message, a log line) is cut at the limit and marked instead, so that it is not lost.
#ifndef MOETRAIN_SERVER_CORE_LIMITS_H_
#define MOETRAIN_SERVER_CORE_LIMITS_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moetrain::server {

// A job's state reason: a cancel reason (refused beyond it) or a failure message (cut).
inline constexpr size_t kMaxReasonBytes = 4096;
// One log line of a job's event log (cut beyond it).
inline constexpr size_t kMaxLogLineBytes = 4096;
// A path in a spec (data.path, checkpoint.dir, checkpoint.init_from) or a checkpoint report:
// Linux's PATH_MAX, so no path a worker could open is refused.
inline constexpr size_t kMaxPathBytes = 4096;
// A job's spec as the store keeps it (serialized). Its strings are bounded above (a name, three
// paths: under 13 KiB together); this bounds the whole, so that one job always fits a GetJob
// answer and a ListJobs page, and every assignment that carries the spec fits its message.
inline constexpr size_t kMaxSpecBytes = size_t{256} << 10;
// The message of a gRPC error (cut beyond it): far below gRPC's 8 KiB default metadata limit.
inline constexpr size_t kMaxErrorMessageBytes = 2048;
// The most bytes of jobs one ListJobs page holds (estimated from the stored sizes). gRPC's
// default message limit is 4 MiB; the rest is headroom for the encoding.
inline constexpr size_t kMaxListPageBytes = size_t{1} << 20;

// `text` when it has at most `limit` bytes; otherwise its head, cut at a UTF-8 character
// boundary, and a marker saying so, `limit` bytes at most in all.
inline std::string TruncateWithMarker(absl::string_view text, size_t limit) {
  if (text.size() <= limit) return std::string(text);
  const std::string marker = absl::StrCat(" [truncated at ", limit, " bytes]");
  size_t keep = limit > marker.size() ? limit - marker.size() : 0;
  // Never split a multi-byte character: back up over continuation bytes (10xxxxxx).
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), marker).substr(0, limit);
}

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_LIMITS_H_
