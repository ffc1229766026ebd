// Reads a job's events through JobService.WatchJob and hands each to a callback exactly once, in
// sequence order, across dropped connections and coordinator restarts:
//
//   FollowOptions options;
//   options.job_id = job_id;
//   MOETRAIN_ASSIGN_OR_RETURN(FollowResult result,
//                             FollowJob(connection, options, [&](const v1::JobEvent& event) {
//                               printer.Print(event);
//                             }));
//
// While following, a stream that breaks before the job's final state (UNAVAILABLE, CANCELLED,
// ABORTED, DEADLINE_EXCEEDED, or an OK end: a coordinator shutting down ends its watches) is
// opened again from the last sequence delivered + 1, after a backoff, once the channel is
// connected again. FollowJob gives up (Unavailable) only when the channel has not been connected
// for reconnect_timeout in a row.
#ifndef MOETRAIN_CLIENT_JOB_FOLLOWER_H_
#define MOETRAIN_CLIENT_JOB_FOLLOWER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.pb.h"

namespace moetrain {

struct FollowOptions {
  std::string job_id;
  // First event sequence to deliver; 0 = the job's whole history.
  int64_t from_sequence = 0;
  // Wait for new events until the job reaches a final state. False: deliver the events recorded
  // so far and return (WatchJob's no_wait), without retrying a failed stream.
  bool follow = true;
  // Longest the coordinator may stay unreachable while following before FollowJob gives up.
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // Wait before reopening a broken stream: initial_backoff, doubling up to max_backoff, back to
  // initial_backoff once an event arrives.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // Deadline of the GetJob call that checks a job's state when a stream ended without events.
  absl::Duration call_timeout = absl::Seconds(10);
};

struct FollowResult {
  // The last state the events moved the job to (UNSPECIFIED when they held no state change).
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  // Whether last_state is final (SUCCEEDED, FAILED, CANCELLED): the job's history is complete.
  bool final = false;
  // The sequence to resume from: the last delivered + 1.
  int64_t next_sequence = 0;
};

// SUCCEEDED, FAILED or CANCELLED.
bool IsFinalJobState(v1::JobState state);

// Delivers the events of options.job_id to `on_event` (on the calling thread) until the job's
// final state change has been delivered (follow), or the recorded events have been (no follow).
// Errors carry the coordinator's status (NotFound for an unknown job, Unauthenticated, ...), with
// the job and the sequence reached in the message; Unavailable after reconnect_timeout without a
// connection.
absl::StatusOr<FollowResult> FollowJob(const Connection& connection, const FollowOptions& options,
                                       const std::function<void(const v1::JobEvent&)>& on_event);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_JOB_FOLLOWER_H_
