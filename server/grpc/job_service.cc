#include "server/grpc/job_service.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace moetrain::server {
namespace {

v1::JobState ToProto(JobState state) {
  switch (state) {
    case JobState::kPending:
      return v1::JOB_STATE_PENDING;
    case JobState::kScheduled:
      return v1::JOB_STATE_SCHEDULED;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kRestarting:
      return v1::JOB_STATE_RESTARTING;
    case JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

// UNSPECIFIED and unknown values have no core state.
std::optional<JobState> FromProto(int state) {
  switch (state) {
    case v1::JOB_STATE_PENDING:
      return JobState::kPending;
    case v1::JOB_STATE_SCHEDULED:
      return JobState::kScheduled;
    case v1::JOB_STATE_RUNNING:
      return JobState::kRunning;
    case v1::JOB_STATE_RESTARTING:
      return JobState::kRestarting;
    case v1::JOB_STATE_SUCCEEDED:
      return JobState::kSucceeded;
    case v1::JOB_STATE_FAILED:
      return JobState::kFailed;
    case v1::JOB_STATE_CANCELLED:
      return JobState::kCancelled;
    default:
      return std::nullopt;
  }
}

void ToProto(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t micros = absl::ToUnixMicros(time);
  int64_t seconds = micros / 1000000;
  int64_t remainder = micros % 1000000;
  if (remainder < 0) {
    --seconds;
    remainder += 1000000;
  }
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(static_cast<int32_t>(remainder * 1000));
}

absl::Status ToProto(const JobRecord& record, v1::Job* job) {
  job->set_id(record.id);
  job->set_submission_id(record.submission_id);
  job->set_name(record.name);
  if (!job->mutable_spec()->ParseFromString(record.spec)) {
    return absl::DataLossError(absl::StrCat("job ", record.id, ": stored spec does not parse"));
  }
  job->set_state(ToProto(record.state));
  job->set_state_reason(record.state_reason);
  job->set_priority(record.priority);
  job->set_attempt(record.attempt);
  job->set_restarts(record.restarts);
  ToProto(record.created_at, job->mutable_create_time());
  ToProto(record.updated_at, job->mutable_update_time());
  if (record.latest_checkpoint_step.has_value()) {
    job->set_latest_checkpoint_step(*record.latest_checkpoint_step);
  }
  return absl::OkStatus();
}

// Store sequences start at 1, the wire's at 0.
void ToProto(const EventRecord& record, v1::JobEvent* event) {
  event->set_sequence(record.sequence - 1);
  ToProto(record.time, event->mutable_time());
  if (record.kind == kStateChangeEventKind) {
    absl::StatusOr<StateChange> change = DecodeStateChange(record.payload);
    if (change.ok()) {
      v1::StateChange* proto = event->mutable_state_change();
      proto->set_from(ToProto(change->from));
      proto->set_to(ToProto(change->to));
      proto->set_reason(change->reason);
      return;
    }
  } else if (record.kind == kSubmittedEventKind) {
    v1::StateChange* proto = event->mutable_state_change();
    proto->set_from(v1::JOB_STATE_UNSPECIFIED);
    proto->set_to(v1::JOB_STATE_PENDING);
    proto->set_reason(record.payload);
    return;
  }
  // A kind this transport does not know yet still reaches the client, as text.
  event->mutable_log_line()->set_text(absl::StrCat(record.kind, ": ", record.payload));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer length in full; a length mismatch folds into the result, not an early exit.
  const size_t length = std::max(a.size(), b.size());
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < length; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference |= static_cast<unsigned char>(x ^ y);
  }
  return difference == 0;
}

JobService::JobService(Coordinator* coordinator, JobServiceOptions options)
    : coordinator_(coordinator), options_(std::move(options)) {}

grpc::Status JobService::Authenticate(const grpc::ServerContext& context) const {
  if (options_.bearer_token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ") ||
      !ConstantTimeEquals(value, options_.bearer_token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

grpc::Status JobService::SubmitJob(grpc::ServerContext* context,
                                   const v1::SubmitJobRequest* request, v1::Job* response) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
  absl::StatusOr<JobRecord> job =
      coordinator_->Submit(request->submission_id(), request->spec(), request->priority());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
  absl::StatusOr<JobRecord> job = coordinator_->Get(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
  ListOptions options;
  for (int state : request->states()) {
    if (std::optional<JobState> core = FromProto(state); core.has_value()) {
      options.states.push_back(*core);
    }
  }
  options.match_nothing = !request->states().empty() && options.states.empty();
  options.page_size = request->page_size();
  options.page_token = request->page_token();
  absl::StatusOr<JobPage> page = coordinator_->List(options);
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (const JobRecord& record : page->jobs) {
    if (absl::Status status = ToProto(record, response->add_jobs()); !status.ok()) {
      return ToGrpcStatus(status);
    }
  }
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status JobService::CancelJob(grpc::ServerContext* context,
                                   const v1::CancelJobRequest* request, v1::Job* response) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
  absl::StatusOr<JobRecord> job = coordinator_->Cancel(request->job_id(), request->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status auth = Authenticate(*context); !auth.ok()) return auth;
  if (request->from_sequence() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("from_sequence = ", request->from_sequence(), " is negative"));
  }
  WatchOptions options;
  options.from_sequence = request->from_sequence() + 1;
  options.is_cancelled = [context] { return context->IsCancelled(); };
  options.cancel_check_interval = options_.watch_cancel_check_interval;
  absl::Status status =
      coordinator_->Watch(request->job_id(), options, [writer](const EventRecord& record) {
        v1::JobEvent event;
        ToProto(record, &event);
        return writer->Write(event);
      });
  if (status.ok() && context->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
  }
  return ToGrpcStatus(status);
}

}  // namespace moetrain::server
