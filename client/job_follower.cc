#include "client/job_follower.h"

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "moetrain/v1/backoff.h"
#include "moetrain/v1/coordinator.grpc.pb.h"

namespace moetrain {
namespace {

// Codes of a stream that broke on the way (the coordinator went away, restarts, or drops the
// call), as opposed to one the coordinator refused (NOT_FOUND, UNAUTHENTICATED, ...).
bool IsBrokenStream(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// The status with the call and where it stood in the message.
absl::Status WatchError(const grpc::Status& status, const FollowOptions& options,
                        int64_t sequence) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("WatchJob(job_id '", options.job_id, "', from_sequence ",
                                   sequence, "): ", status.error_message()));
}

// The job's state now, to tell a finished job (every event delivered) from a stream cut short.
absl::StatusOr<v1::JobState> CurrentState(v1::JobService::Stub& stub, const Connection& connection,
                                          const FollowOptions& options) {
  grpc::ClientContext context;
  connection.Prepare(&context, options.call_timeout);
  v1::GetJobRequest request;
  request.set_job_id(options.job_id);
  v1::Job job;
  const grpc::Status status = stub.GetJob(&context, request, &job);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("GetJob(job_id '", options.job_id, "'): ", status.error_message()));
  }
  return job.state();
}

}  // namespace

bool IsFinalJobState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<FollowResult> FollowJob(const Connection& connection, const FollowOptions& options,
                                       const std::function<void(const v1::JobEvent&)>& on_event) {
  const std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(connection.channel);
  FollowResult result;
  result.next_sequence = options.from_sequence;
  Backoff backoff({.initial = options.initial_backoff, .max = options.max_backoff});
  // Since when the channel has not been connected; unset while it is.
  std::optional<absl::Time> unreachable_since;
  for (;;) {
    grpc::ClientContext context;
    // No deadline: a follow lasts as long as the job does.
    connection.Prepare(&context, absl::InfiniteDuration());
    v1::WatchJobRequest request;
    request.set_job_id(options.job_id);
    request.set_from_sequence(result.next_sequence);
    request.set_no_wait(!options.follow);
    const int64_t requested_from = result.next_sequence;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub->WatchJob(&context, request);
    int64_t delivered = 0;
    v1::JobEvent event;
    while (reader->Read(&event)) {
      backoff.Reset();
      // The coordinator resumes exactly where asked; this only guards the promise to the caller.
      if (event.sequence() < result.next_sequence) continue;
      result.next_sequence = event.sequence() + 1;
      if (event.has_state_change()) {
        result.last_state = event.state_change().to();
        result.final = IsFinalJobState(result.last_state);
      }
      ++delivered;
      on_event(event);
    }
    const grpc::Status status = reader->Finish();
    if (result.final) return result;  // whatever became of the stream after the last event
    if (!options.follow) {
      if (status.ok()) return result;
      return WatchError(status, options, requested_from);
    }
    if (!status.ok() && !IsBrokenStream(status.error_code())) {
      return WatchError(status, options, requested_from);
    }
    absl::Status last_error =
        status.ok() ? absl::UnavailableError(absl::StrCat("the stream of job ", options.job_id,
                                                          " ended at event ", result.next_sequence,
                                                          " before the job reached a final state"))
                    : WatchError(status, options, requested_from);
    if (status.ok() && delivered == 0) {
      // Nothing new and no final state: either every event was delivered before and the job is
      // final (a follow that starts past the end), or the coordinator is shutting down.
      absl::StatusOr<v1::JobState> state = CurrentState(*stub, connection, options);
      if (state.ok() && IsFinalJobState(*state)) {
        result.last_state = *state;
        result.final = true;
        return result;
      }
      if (!state.ok() && !IsBrokenStream(static_cast<grpc::StatusCode>(state.status().code()))) {
        return state.status();
      }
      if (!state.ok()) last_error = state.status();
    }

    absl::SleepFor(backoff.Next());
    // WaitForConnected asks the channel to connect, and gRPC retries with its own short backoff
    // (moetrain::Connect caps it at 2 s), so a restarted coordinator is found within seconds.
    if (connection.channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      if (!unreachable_since.has_value()) unreachable_since = absl::Now();
      const absl::Time give_up = *unreachable_since + options.reconnect_timeout;
      if (!connection.channel->WaitForConnected(absl::ToChronoTime(give_up))) {
        return absl::UnavailableError(absl::StrCat(
            "the coordinator has been unreachable for ",
            absl::FormatDuration(absl::Trunc(absl::Now() - *unreachable_since, absl::Seconds(1))),
            " (--reconnect-timeout ", absl::FormatDuration(options.reconnect_timeout),
            ") while following job ", options.job_id, " at event ", result.next_sequence,
            "; last error: ", last_error.ToString()));
      }
    }
    unreachable_since.reset();
  }
}

}  // namespace moetrain
