#include "server/grpc/job_service.h"

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "moetrain/v1/proto_time.h"
#include "moetrain/v1/trainer_support.h"

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

// Whether `path` lies under `root` as far as their text tells (the coordinator does not see the
// workers' file systems): kUnknown when one is relative and the other absolute, since a relative
// path resolves against each worker's --work-dir. The workers check again, links followed.
enum class Containment { kInside, kOutside, kUnknown };

std::filesystem::path NormalPath(const std::string& text) {
  std::filesystem::path path = std::filesystem::path(text).lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();  // "a/" -> "a"
  return path;
}

Containment LexicallyUnder(const std::string& path, const std::string& root) {
  const std::filesystem::path normal_path = NormalPath(path), normal_root = NormalPath(root);
  if (normal_path.is_absolute() != normal_root.is_absolute()) return Containment::kUnknown;
  const std::filesystem::path relative = normal_path.lexically_relative(normal_root);
  return !relative.empty() && *relative.begin() != ".." ? Containment::kInside
                                                        : Containment::kOutside;
}

// The spec's paths against the roots this coordinator was started with: InvalidArgument naming
// the field, its value and the root(s) when the text alone shows the path outside.
absl::Status CheckSpecPaths(const v1::JobSpec& spec, const JobServiceOptions& options) {
  const std::string& dir = spec.checkpoint().dir();
  if (!dir.empty() && !options.checkpoint_root.empty()) {
    const Containment where = LexicallyUnder(dir, options.checkpoint_root);
    // A relative dir climbing out with ".." leaves the directory it is relative to, whatever
    // that is, unless the root itself climbs the same way (moetrain run --checkpoint-dir ../x).
    const bool climbs = !NormalPath(dir).empty() && *NormalPath(dir).begin() == "..";
    if (where == Containment::kOutside || (where == Containment::kUnknown && climbs)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.dir = '", dir.substr(0, 256),
                       "' is outside the coordinator's checkpoint root '", options.checkpoint_root,
                       "': leave it empty, or name a directory under the root"));
    }
  }
  // What a job reads, as the workers' --data-root confines it.
  const std::pair<const char*, const std::string&> reads[] = {
      {"data.path", spec.data().path()}, {"checkpoint.init_from", spec.checkpoint().init_from()}};
  for (const auto& [field, path] : reads) {
    if (path.empty() || options.data_roots.empty()) continue;
    bool maybe_inside = false;
    for (const std::string& root : options.data_roots) {
      maybe_inside = maybe_inside || LexicallyUnder(path, root) != Containment::kOutside;
    }
    if (!maybe_inside) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = '", path.substr(0, 256),
                       "' is outside every --data-root of the coordinator ('",
                       absl::StrJoin(options.data_roots, "', '"), "')"));
    }
  }
  return absl::OkStatus();
}

void SetStateChange(JobState from, JobState to, const std::string& reason, v1::JobEvent* event) {
  v1::StateChange* change = event->mutable_state_change();
  change->set_from(ToProto(from));
  change->set_to(ToProto(to));
  change->set_reason(reason);
}

}  // namespace

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
  ToProtoTimestamp(record.created_at, job->mutable_create_time());
  ToProtoTimestamp(record.updated_at, job->mutable_update_time());
  if (record.latest_checkpoint_step.has_value()) {
    job->set_latest_checkpoint_step(*record.latest_checkpoint_step);
  }
  if (!record.last_step_metrics.empty() &&
      !job->mutable_last_metrics()->ParseFromString(record.last_step_metrics)) {
    return absl::DataLossError(
        absl::StrCat("job ", record.id, ": stored step metrics do not parse"));
  }
  job->set_waiting_reason(record.waiting_reason);
  if (record.next_attempt_at.has_value()) {
    ToProtoTimestamp(*record.next_attempt_at, job->mutable_next_attempt_time());
  }
  return absl::OkStatus();
}

void ToProto(const EventRecord& record, v1::JobEvent* event) {
  event->set_sequence(record.sequence - 1);
  ToProtoTimestamp(record.time, event->mutable_time());
  if (record.kind == kStateChangeEventKind) {
    if (absl::StatusOr<StateChange> change = DecodeStateChange(record.payload); change.ok()) {
      SetStateChange(change->from, change->to, change->reason, event);
      return;
    }
  } else if (record.kind == kSubmittedEventKind) {
    event->mutable_state_change()->set_to(v1::JOB_STATE_PENDING);
    event->mutable_state_change()->set_reason(record.payload);
    return;
  } else if (record.kind == kStepMetricsEventKind) {
    if (event->mutable_step_metrics()->ParseFromString(record.payload)) return;
  } else if (record.kind == kCheckpointSavedEventKind) {
    if (event->mutable_checkpoint_saved()->ParseFromString(record.payload)) return;
  } else if (record.kind == kLogEventKind) {
    event->mutable_log_line()->set_text(record.payload);
    return;
  }
  // A kind this transport does not know, or a payload that does not decode, still reaches the
  // client, as text.
  event->mutable_log_line()->set_text(absl::StrCat(record.kind, ": ", record.payload));
}

JobService::JobService(Coordinator* coordinator, Fleet* fleet, JobServiceOptions options)
    : coordinator_(coordinator),
      fleet_(fleet),
      options_(std::move(options)),
      caller_{.token = options_.bearer_token,
              .other_token = options_.worker_token,
              .other_refusal =
                  "the worker token (--worker-token-file) admits WorkerService "
                  "only; JobService needs the users' token (--token-file)"} {}

grpc::Status JobService::SubmitJob(grpc::ServerContext* context,
                                   const v1::SubmitJobRequest* request, v1::Job* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  // A job no worker of this version can train would fail on every worker it is given to.
  if (absl::Status supported = v1::CheckTrainerSupports(request->spec()); !supported.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat(supported.message(), "; this coordinator refuses the job")));
  }
  if (absl::Status paths = CheckSpecPaths(request->spec(), options_); !paths.ok()) {
    return ToGrpcStatus(paths);
  }
  // A job whose ranks need more device memory than every worker that could run it offers would
  // wait forever: refused (FAILED_PRECONDITION), and nothing is stored. A repeated submission is
  // not judged again: it returns its job (or AlreadyExists) whatever the fleet is now.
  absl::StatusOr<bool> repeat = coordinator_->HasSubmission(request->submission_id());
  if (!repeat.ok()) return ToGrpcStatus(repeat.status());
  if (!*repeat) {
    if (absl::Status fits = fleet_->CheckDeviceMemory(request->spec()); !fits.ok()) {
      return ToGrpcStatus(fits);
    }
  }
  absl::StatusOr<JobRecord> job =
      coordinator_->Submit(request->submission_id(), request->spec(), request->priority());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                v1::Job* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<JobRecord> job = coordinator_->Get(request->job_id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                  v1::ListJobsResponse* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
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
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<JobRecord> job = fleet_->Cancel(request->job_id(), request->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  return ToGrpcStatus(ToProto(*job, response));
}

grpc::Status JobService::DeleteJob(grpc::ServerContext* context,
                                   const v1::DeleteJobRequest* request,
                                   v1::DeleteJobResponse* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<DeletedJob> deleted =
      fleet_->Delete(request->job_id(), request->delete_checkpoints());
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  response->set_checkpoint_dir(deleted->checkpoint_dir);
  response->set_checkpoints_deleted(deleted->checkpoints_deleted);
  return grpc::Status::OK;
}

grpc::Status JobService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                  grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  if (request->from_sequence() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("from_sequence = ", request->from_sequence(), " is negative"));
  }
  WatchOptions options;
  // Store sequences are the wire's plus one; the largest wire sequence has no event after it.
  options.from_sequence = request->from_sequence() == std::numeric_limits<int64_t>::max()
                              ? request->from_sequence()
                              : request->from_sequence() + 1;
  options.is_cancelled = [context] { return context->IsCancelled(); };
  options.cancel_check_interval = options_.watch_cancel_check_interval;
  options.no_wait = request->no_wait();
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

grpc::Status JobService::ListCheckpoints(grpc::ServerContext* context,
                                         const v1::ListCheckpointsRequest* request,
                                         v1::ListCheckpointsResponse* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<std::vector<CheckpointRecord>> checkpoints =
      coordinator_->ListCheckpoints(request->job_id());
  if (!checkpoints.ok()) return ToGrpcStatus(checkpoints.status());
  for (const CheckpointRecord& record : *checkpoints) {
    v1::Checkpoint* checkpoint = response->add_checkpoints();
    checkpoint->set_step(record.step);
    checkpoint->set_path(record.path);
    checkpoint->set_attempt(record.attempt);
    checkpoint->set_tokens_seen(record.tokens_seen);
    ToProtoTimestamp(record.time, checkpoint->mutable_create_time());
  }
  return grpc::Status::OK;
}

grpc::Status JobService::ListWorkers(grpc::ServerContext* context,
                                     const v1::ListWorkersRequest* request,
                                     v1::ListWorkersResponse* response) {
  if (grpc::Status admitted = Admit(*context, caller_, *request); !admitted.ok()) {
    return admitted;
  }
  absl::StatusOr<WorkerPage> page =
      fleet_->ListWorkers({.page_size = request->page_size(), .page_token = request->page_token()});
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (v1::WorkerInfo& worker : page->workers) *response->add_workers() = std::move(worker);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

}  // namespace moetrain::server
