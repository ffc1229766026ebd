// How the client commands show the coordinator's answers: readable tables and descriptions for
// people, and the protobuf JSON mapping for scripts. Pure functions of their inputs (the current
// time is passed in), so tests can compare exact text. The text forms print every string with its
// control characters escaped (TerminalSafe, client/terminal_text.h): a job name, a reason or a
// worker name cannot act on the terminal. The JSON form escapes them as JSON does.
#ifndef MOETRAIN_CLIENT_JOB_FORMAT_H_
#define MOETRAIN_CLIENT_JOB_FORMAT_H_

#include <google/protobuf/message.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "moetrain/v1/coordinator.pb.h"

namespace moetrain {

// "RUNNING", "running" or "JOB_STATE_RUNNING" → JOB_STATE_RUNNING. InvalidArgument naming the
// value and listing the states for anything else (UNSPECIFIED included: it is never a state).
absl::StatusOr<v1::JobState> ParseJobStateName(absl::string_view name);

// "5s", "3m", "2h", "4d": how long ago `then` was, kubectl style; "-" when `then` is unset
// (absl::InfinitePast) or in the future by more than a second (clock skew).
std::string FormatAge(absl::Time then, absl::Time now);

// A protobuf Timestamp as absl::Time; InfinitePast when unset.
absl::Time TimeFromProto(const google::protobuf::Timestamp& timestamp);

// One line per job under a header: ID, NAME, STATE, STEP (last reported step / spec.train.steps),
// LOSS (of the last report), RESTARTS, AGE. "(no jobs)" when empty.
std::string FormatJobsTable(const std::vector<v1::Job>& jobs, absl::Time now);

// Everything about one job a person needs, one "Label: value" per line (state and reason, why it
// waits and when a restart's backoff ends, attempt and restarts, priority, latest checkpoint,
// last metrics, times), then the spec as YAML.
std::string FormatJobDescription(const v1::Job& job, absl::Time now);

// STEP, TOKENS, ATTEMPT, AGE, PATH per checkpoint; "(no checkpoints)" when empty.
std::string FormatCheckpointsTable(const v1::ListCheckpointsResponse& response, absl::Time now);

// ID, NAME, STATE, DEVICES, THREADS, JOB (id/attempt), HEARTBEAT (age), VERSION per worker;
// "(no workers)" when empty.
std::string FormatWorkersTable(const v1::ListWorkersResponse& response, absl::Time now);

// The message in the protobuf JSON mapping, on one line, with the proto field names
// (snake_case) and every field present, defaults included, so that scripts always find the keys.
// Enums are their full names ("JOB_STATE_RUNNING"); 64-bit integers are strings; times are RFC
// 3339. Internal when the message cannot be converted.
absl::StatusOr<std::string> MessageToJson(const google::protobuf::Message& message);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_JOB_FORMAT_H_
