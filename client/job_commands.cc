#include "client/job_commands.h"

#include <cstdio>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/event_printer.h"
#include "client/job_follower.h"
#include "client/job_format.h"
#include "client/terminal_text.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job_spec.h"

namespace moetrain {
namespace {

// Most jobs one ListJobs page may hold; fewer round trips for long listings.
constexpr int32_t kListPageSize = 1000;

// A version 4 (random) UUID, the default submission id.
std::string RandomUuid() {
  std::random_device random;
  std::string bytes(16, '\0');
  for (int i = 0; i < 16; i += 4) {
    const uint32_t word = random();
    for (int j = 0; j < 4; ++j) bytes[i + j] = static_cast<char>(word >> (8 * j));
  }
  bytes[6] = static_cast<char>((bytes[6] & 0x0f) | 0x40);  // version 4
  bytes[8] = static_cast<char>((bytes[8] & 0x3f) | 0x80);  // RFC 4122 variant
  const std::string hex = absl::BytesToHexString(bytes);
  const absl::string_view digits = hex;
  return absl::StrCat(digits.substr(0, 8), "-", digits.substr(8, 4), "-", digits.substr(12, 4), "-",
                      digits.substr(16, 4), "-", digits.substr(20));
}

// The JobService calls of the commands, each with the per-call deadline. A failed call keeps the
// coordinator's code, and its message names the coordinator, the call with its arguments, and
// the coordinator's own message (which names the field).
class JobClient {
 public:
  static absl::StatusOr<JobClient> Create(const ClientOptions& options) {
    absl::StatusOr<Connection> connection = Connect(options.connect);
    if (!connection.ok()) return connection.status();
    return JobClient(options, *std::move(connection));
  }

  const Connection& connection() const { return connection_; }

  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request) {
    v1::Job job;
    grpc::ClientContext context;
    Prepare(&context);
    return Check(
        stub_->SubmitJob(&context, request, &job),
        absl::StrCat("SubmitJob(submission_id '", Abbreviate(request.submission_id()), "')"), job);
  }

  absl::StatusOr<v1::Job> Get(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    Prepare(&context);
    return Check(stub_->GetJob(&context, request, &job),
                 absl::StrCat("GetJob(job_id '", Abbreviate(job_id), "')"), job);
  }

  // Every page, in the coordinator's order (oldest first).
  absl::StatusOr<std::vector<v1::Job>> ListAll(const std::vector<v1::JobState>& states) {
    v1::ListJobsRequest request;
    for (v1::JobState state : states) request.add_states(state);
    request.set_page_size(kListPageSize);
    std::vector<v1::Job> jobs;
    do {
      v1::ListJobsResponse page;
      grpc::ClientContext context;
      Prepare(&context);
      absl::StatusOr<v1::ListJobsResponse> listed =
          Check(stub_->ListJobs(&context, request, &page),
                request.page_token().empty()
                    ? std::string("ListJobs")
                    : absl::StrCat("ListJobs(page_token '", Abbreviate(request.page_token()), "')"),
                page);
      if (!listed.ok()) return listed.status();
      for (v1::Job& job : *listed->mutable_jobs()) jobs.push_back(std::move(job));
      request.set_page_token(listed->next_page_token());
    } while (!request.page_token().empty());
    return jobs;
  }

  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, const std::string& reason) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    request.set_reason(reason);
    v1::Job job;
    grpc::ClientContext context;
    Prepare(&context);
    return Check(stub_->CancelJob(&context, request, &job),
                 absl::StrCat("CancelJob(job_id '", Abbreviate(job_id), "')"), job);
  }

  absl::StatusOr<v1::DeleteJobResponse> Delete(const std::string& job_id, bool delete_checkpoints) {
    v1::DeleteJobRequest request;
    request.set_job_id(job_id);
    request.set_delete_checkpoints(delete_checkpoints);
    v1::DeleteJobResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return Check(stub_->DeleteJob(&context, request, &response),
                 absl::StrCat("DeleteJob(job_id '", Abbreviate(job_id), "')"), response);
  }

  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id) {
    v1::ListCheckpointsRequest request;
    request.set_job_id(job_id);
    v1::ListCheckpointsResponse response;
    grpc::ClientContext context;
    Prepare(&context);
    return Check(stub_->ListCheckpoints(&context, request, &response),
                 absl::StrCat("ListCheckpoints(job_id '", Abbreviate(job_id), "')"), response);
  }

  // Every page, in one response (by id, as the coordinator lists them), at the coordinator's
  // default page size.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() {
    v1::ListWorkersRequest request;
    v1::ListWorkersResponse all;
    do {
      v1::ListWorkersResponse page;
      grpc::ClientContext context;
      Prepare(&context);
      absl::StatusOr<v1::ListWorkersResponse> listed = Check(
          stub_->ListWorkers(&context, request, &page),
          request.page_token().empty()
              ? std::string("ListWorkers")
              : absl::StrCat("ListWorkers(page_token '", Abbreviate(request.page_token()), "')"),
          page);
      if (!listed.ok()) return listed.status();
      for (v1::WorkerInfo& worker : *listed->mutable_workers()) {
        *all.add_workers() = std::move(worker);
      }
      request.set_page_token(listed->next_page_token());
    } while (!request.page_token().empty());
    return all;
  }

  // A failed call (or follow) as the commands report it: "coordinator ADDR: CALL: CODE: message",
  // or "cannot reach the coordinator at ADDR: ..." when it is unreachable.
  absl::Status Explain(const absl::Status& status, absl::string_view call) const {
    const std::string where =
        ExitCodeFor(status) == kExitUnreachable
            ? absl::StrCat("cannot reach the coordinator at ", options_.connect.address)
            : absl::StrCat("coordinator ", options_.connect.address);
    return absl::Status(status.code(), absl::StrCat(where, ": ", call, ": ",
                                                    absl::StatusCodeToString(status.code()), ": ",
                                                    status.message()));
  }

 private:
  JobClient(const ClientOptions& options, Connection connection)
      : options_(options),
        connection_(std::move(connection)),
        stub_(v1::JobService::NewStub(connection_.channel)) {}

  void Prepare(grpc::ClientContext* context) const {
    connection_.Prepare(context, options_.call_timeout);
  }

  template <typename Response>
  absl::StatusOr<Response> Check(const grpc::Status& status, absl::string_view call,
                                 Response& response) const {
    if (!status.ok()) return Explain(FromGrpcStatus(status), call);
    return std::move(response);
  }

  ClientOptions options_;
  Connection connection_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

int Fail(absl::string_view command, const absl::Status& status) {
  // The message quotes the coordinator and what the user typed: bounded and escaped.
  absl::FPrintF(stderr, "moetrain %s: %s\n", command,
                TerminalSafe(Abbreviate(status.message(), kMaxErrorMessageBytes)));
  return ExitCodeFor(status);
}

// Prints `message` as one JSON document on one line.
absl::Status PrintJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = MessageToJson(message);
  if (!json.ok()) return json.status();
  absl::PrintF("%s\n", JsonTerminalSafe(*json));
  return absl::OkStatus();
}

// Follows the job from its first event, printing every event; the exit code.
int Follow(absl::string_view command, JobClient& client, const ClientOptions& options,
           const v1::Job& job, absl::Duration reconnect_timeout) {
  EventPrinter printer(EventPrinterOptions{
      .json = options.json, .total_steps = job.spec().train().steps(), .job_label = job.id()});
  FollowOptions follow;
  follow.job_id = job.id();
  follow.follow = true;
  follow.reconnect_timeout = reconnect_timeout;
  follow.call_timeout = options.call_timeout;
  absl::StatusOr<FollowResult> result = FollowJob(
      client.connection(), follow, [&printer](const v1::JobEvent& event) { printer.Print(event); });
  if (!result.ok()) {
    return Fail(command, client.Explain(result.status(), absl::StrCat("following job ", job.id())));
  }
  if (result->last_state == v1::JOB_STATE_FAILED || result->last_state == v1::JOB_STATE_CANCELLED) {
    absl::FPrintF(stderr, "moetrain %s: job %s ended %s\n", command, TerminalSafe(job.id()),
                  JobStateLabel(result->last_state));
    return kExitJobUnsuccessful;
  }
  return kExitOk;
}

}  // namespace

ExitCode ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    default:
      return kExitCoordinatorError;
  }
}

absl::StatusOr<v1::ListWorkersResponse> ListCoordinatorWorkers(const ClientOptions& options) {
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return client.status();
  return client->ListWorkers();
}

int FailCommand(absl::string_view command, const absl::Status& status) {
  return Fail(command, status);
}

absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& flag, const std::string& text) {
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &duration)) {
    duration = -absl::InfiniteDuration();
  }
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = '", Abbreviate(text),
                     "' is not a positive duration (60s, 1m30s, 500ms, or seconds)"));
  }
  return duration;
}

int SubmitCommand(const ClientOptions& options, const SubmitArgs& args) {
  constexpr absl::string_view kCommand = "submit";
  // Checked here first, so that a bad spec never reaches the coordinator.
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(args.spec_path);
  if (!spec.ok()) return Fail(kCommand, spec.status());
  if (absl::Status valid = ValidateJobSpec(*spec); !valid.ok()) {
    return Fail(kCommand,
                absl::Status(valid.code(), absl::StrCat(args.spec_path, ": ", valid.message())));
  }
  if (args.complete_spec) {
    const std::string note = args.complete_spec(&*spec);
    if (!note.empty()) {
      absl::FPrintF(stderr, "moetrain %s: %s\n", kCommand,
                    TerminalSafe(Abbreviate(note, kMaxErrorMessageBytes)));
    }
  }
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());

  v1::SubmitJobRequest request;
  request.set_submission_id(args.submission_id.empty() ? RandomUuid() : args.submission_id);
  // As written: the coordinator applies the defaults, so the stored spec is its version of them.
  *request.mutable_spec() = *std::move(spec);
  request.set_priority(args.priority);
  absl::StatusOr<v1::Job> job = client->Submit(request);
  if (!job.ok()) return Fail(kCommand, job.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*job); !printed.ok()) return Fail(kCommand, printed);
  } else {
    absl::PrintF("job %s %s\n", TerminalSafe(job->id()), JobStateLabel(job->state()));
  }
  std::fflush(stdout);
  if (!args.follow) return kExitOk;
  return Follow(kCommand, *client, options, *job, args.reconnect_timeout);
}

int JobsCommand(const ClientOptions& options, const std::vector<std::string>& states) {
  constexpr absl::string_view kCommand = "jobs";
  std::vector<v1::JobState> filter;
  for (const std::string& name : states) {
    absl::StatusOr<v1::JobState> state = ParseJobStateName(name);
    if (!state.ok()) return Fail(kCommand, state.status());
    filter.push_back(*state);
  }
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<std::vector<v1::Job>> jobs = client->ListAll(filter);
  if (!jobs.ok()) return Fail(kCommand, jobs.status());
  if (!options.json) {
    absl::PrintF("%s", FormatJobsTable(*jobs, absl::Now()));
    return kExitOk;
  }
  // {"jobs": [...]}: a ListJobsResponse without the paging, which the command did.
  std::vector<std::string> documents;
  for (const v1::Job& job : *jobs) {
    absl::StatusOr<std::string> document = MessageToJson(job);
    if (!document.ok()) return Fail(kCommand, document.status());
    documents.push_back(*std::move(document));
  }
  absl::PrintF("{\"jobs\":[%s]}\n", JsonTerminalSafe(absl::StrJoin(documents, ",")));
  return kExitOk;
}

int DescribeCommand(const ClientOptions& options, const std::string& job_id) {
  constexpr absl::string_view kCommand = "describe";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<v1::Job> job = client->Get(job_id);
  if (!job.ok()) return Fail(kCommand, job.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*job); !printed.ok()) return Fail(kCommand, printed);
    return kExitOk;
  }
  absl::PrintF("%s", FormatJobDescription(*job, absl::Now()));
  return kExitOk;
}

int LogsCommand(const ClientOptions& options, const LogsArgs& args) {
  constexpr absl::string_view kCommand = "logs";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  // The job first: an unknown job or an unreachable coordinator fails at once rather than after
  // the reconnect timeout, and the spec gives the bar its total.
  absl::StatusOr<v1::Job> job = client->Get(args.job_id);
  if (!job.ok()) return Fail(kCommand, job.status());
  if (args.follow) return Follow(kCommand, *client, options, *job, args.reconnect_timeout);

  EventPrinter printer(EventPrinterOptions{
      .json = options.json, .total_steps = job->spec().train().steps(), .job_label = job->id()});
  FollowOptions recorded;
  recorded.job_id = job->id();
  recorded.follow = false;
  absl::StatusOr<FollowResult> result =
      FollowJob(client->connection(), recorded,
                [&printer](const v1::JobEvent& event) { printer.Print(event); });
  if (!result.ok()) {
    return Fail(kCommand, client->Explain(result.status(),
                                          absl::StrCat("reading the events of job ", job->id())));
  }
  return kExitOk;
}

int CancelCommand(const ClientOptions& options, const std::string& job_id,
                  const std::string& reason) {
  constexpr absl::string_view kCommand = "cancel";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<v1::Job> job = client->Cancel(job_id, reason);
  if (!job.ok()) return Fail(kCommand, job.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*job); !printed.ok()) return Fail(kCommand, printed);
    return kExitOk;
  }
  absl::PrintF("job %s %s\n", TerminalSafe(job->id()), JobStateLabel(job->state()));
  return kExitOk;
}

int DeleteCommand(const ClientOptions& options, const std::string& job_id,
                  bool delete_checkpoints) {
  constexpr absl::string_view kCommand = "delete";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<v1::DeleteJobResponse> deleted = client->Delete(job_id, delete_checkpoints);
  if (!deleted.ok()) return Fail(kCommand, deleted.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*deleted); !printed.ok()) return Fail(kCommand, printed);
    return kExitOk;
  }
  if (deleted->checkpoints_deleted()) {
    absl::PrintF("job %s deleted, and its checkpoints in %s\n", TerminalSafe(job_id),
                 TerminalSafe(deleted->checkpoint_dir()));
  } else if (delete_checkpoints) {
    absl::PrintF("job %s deleted; the coordinator found no checkpoints in %s\n",
                 TerminalSafe(job_id), TerminalSafe(deleted->checkpoint_dir()));
  } else {
    absl::PrintF("job %s deleted; its checkpoints, if any, remain in %s\n", TerminalSafe(job_id),
                 TerminalSafe(deleted->checkpoint_dir()));
  }
  return kExitOk;
}

int CheckpointsCommand(const ClientOptions& options, const std::string& job_id) {
  constexpr absl::string_view kCommand = "checkpoints";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<v1::ListCheckpointsResponse> checkpoints = client->ListCheckpoints(job_id);
  if (!checkpoints.ok()) return Fail(kCommand, checkpoints.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*checkpoints); !printed.ok()) {
      return Fail(kCommand, printed);
    }
    return kExitOk;
  }
  absl::PrintF("%s", FormatCheckpointsTable(*checkpoints, absl::Now()));
  return kExitOk;
}

int WorkersCommand(const ClientOptions& options) {
  constexpr absl::string_view kCommand = "workers";
  absl::StatusOr<JobClient> client = JobClient::Create(options);
  if (!client.ok()) return Fail(kCommand, client.status());
  absl::StatusOr<v1::ListWorkersResponse> workers = client->ListWorkers();
  if (!workers.ok()) return Fail(kCommand, workers.status());
  if (options.json) {
    if (absl::Status printed = PrintJson(*workers); !printed.ok()) return Fail(kCommand, printed);
    return kExitOk;
  }
  absl::PrintF("%s", FormatWorkersTable(*workers, absl::Now()));
  return kExitOk;
}

}  // namespace moetrain
