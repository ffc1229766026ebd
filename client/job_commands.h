// The `moetrain` commands that talk to a coordinator: submit, jobs, describe, logs, cancel,
// delete, checkpoints, workers. Each returns the process exit code, prints its result to stdout and
// its errors, one line naming what was wrong and the value, to stderr.
//
// Exit codes, for every client command:
//   0  success
//   1  the followed job ended FAILED or CANCELLED (submit --follow, logs -f)
//   2  bad usage or a bad spec (nothing was sent), or the coordinator refused the request:
//      INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE,
//      RESOURCE_EXHAUSTED, UNAUTHENTICATED, PERMISSION_DENIED (its message names the field);
//      for submit --dry-run, also: the coordinator would refuse the spec (as submit would exit)
//   3  the coordinator is unreachable: UNAVAILABLE or DEADLINE_EXCEEDED (for logs -f: for longer
//      than --reconnect-timeout)
//   4  the coordinator failed the call otherwise (INTERNAL, DATA_LOSS, UNIMPLEMENTED, ...)
//
// --json output, one document per command (the protobuf JSON mapping of coordinator.proto, proto
// field names, every scalar field present; see MessageToJson in job_format.h):
//   submit, describe, cancel   the Job
//   delete                     the DeleteJobResponse {"checkpoint_dir", "checkpoints_deleted"}
//   jobs                       {"jobs": [Job, ...]} with every page
//   checkpoints                {"checkpoints": [Checkpoint, ...]}
//   workers                    {"workers": [WorkerInfo, ...]}
//   logs                       one JSON object per event and line (event_printer.h)
//   submit --follow            the Job, then the events as logs prints them
#ifndef MOETRAIN_CLIENT_JOB_COMMANDS_H_
#define MOETRAIN_CLIENT_JOB_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.pb.h"
#include "moetrain/v1/job.pb.h"

namespace moetrain {

enum ExitCode : int {
  kExitOk = 0,
  kExitJobUnsuccessful = 1,
  kExitUsage = 2,
  kExitUnreachable = 3,
  kExitCoordinatorError = 4,
};

// The exit code for a command that failed with `status` (see the table above).
ExitCode ExitCodeFor(const absl::Status& status);

// What every client command takes.
struct ClientOptions {
  ConnectOptions connect;
  // Print the --json documents above instead of text.
  bool json = false;
  // Deadline of each unary call; the follow stream has none.
  absl::Duration call_timeout = absl::Seconds(10);
};

struct SubmitArgs {
  std::string spec_path;
  // Makes the submission idempotent; empty = a fresh random UUID.
  std::string submission_id;
  int32_t priority = 0;
  // Then print the job's events as `logs -f` does.
  bool follow = false;
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // Completes the checked spec before it is sent and returns a line for stderr (empty = none).
  // The `moetrain` executable fills a CUDA job's resources.device_memory_bytes from the plan here
  // (CompleteDeviceMemory, client/job_plan.h), which needs the engine this library never links.
  // Unset: the spec is sent as read.
  std::function<std::string(v1::JobSpec* spec)> complete_spec;
};

struct LogsArgs {
  std::string job_id;
  // Wait for new events until the job ends, across coordinator restarts.
  bool follow = false;
  // While following: give up (exit 3) after the coordinator is unreachable this long.
  absl::Duration reconnect_timeout = absl::Seconds(60);
};

// Parses and validates the spec here (exit 2 naming the field, nothing sent), completes it
// (args.complete_spec), submits it, prints "job <id> <STATE>" (or the Job), then follows it with
// --follow.
int SubmitCommand(const ClientOptions& options, const SubmitArgs& args);
// Every job (all pages), oldest first, optionally only those in `states` (names in any case).
int JobsCommand(const ClientOptions& options, const std::vector<std::string>& states);
int DescribeCommand(const ClientOptions& options, const std::string& job_id);
int LogsCommand(const ClientOptions& options, const LogsArgs& args);
int CancelCommand(const ClientOptions& options, const std::string& job_id,
                  const std::string& reason);
// Deletes a final job from the coordinator; its checkpoint files stay unless delete_checkpoints.
// Prints "job <id> deleted" and where its checkpoints are (or were), or the DeleteJobResponse.
int DeleteCommand(const ClientOptions& options, const std::string& job_id, bool delete_checkpoints);
int CheckpointsCommand(const ClientOptions& options, const std::string& job_id);
int WorkersCommand(const ClientOptions& options);

// For commands beyond this library (`submit --dry-run`, client/dry_run_command.h): the
// coordinator's workers, a failed call explained as the commands above explain theirs; and the
// commands' way to fail, "moetrain COMMAND: message" (bounded, escaped) on stderr and the exit
// code for `status`.
absl::StatusOr<v1::ListWorkersResponse> ListCoordinatorWorkers(const ClientOptions& options);
int FailCommand(absl::string_view command, const absl::Status& status);

// "60s", "1m30s", "500ms", or a plain number of seconds; InvalidArgument naming `flag` and the
// text otherwise, or when not positive.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text);

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_JOB_COMMANDS_H_
