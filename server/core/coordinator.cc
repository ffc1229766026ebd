#include "server/core/coordinator.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/status.h"
#include "moetrain/v1/job_spec.h"
#include "server/core/limits.h"

namespace moetrain::server {
namespace {

constexpr int kWatchBatch = 256;
constexpr int kMaxPageSize = 1000;
constexpr int kCancelTries = 8;

// The store compares spec hashes for idempotency, so equal specs must give equal bytes.
std::string SerializeDeterministic(const v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&coded);
  }
  return bytes;
}

// A watch cut short is not a job that ended: the client should come back (to this process's
// successor).
absl::Status ShuttingDown() {
  return absl::UnavailableError("the coordinator is shutting down; watch again to resume");
}

absl::Status ValidateSubmissionId(absl::string_view submission_id) {
  if (submission_id.empty()) return absl::InvalidArgumentError("submission_id is required");
  if (submission_id.size() > kMaxSubmissionIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("submission_id has ", submission_id.size(),
                                                   " characters, more than ",
                                                   kMaxSubmissionIdLength));
  }
  for (size_t i = 0; i < submission_id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(submission_id[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "submission_id holds byte 0x%02x at offset %d; it must be printable ASCII (0x20-0x7e)", c,
          i));
    }
  }
  return absl::OkStatus();
}

// The paths of a spec, which the store keeps with the job and every listing carries.
absl::Status ValidateSpecPath(absl::string_view field, absl::string_view value) {
  if (value.size() <= kMaxPathBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", value.size(), " bytes, more than ", kMaxPathBytes));
}

// Log lines are cut (and marked) rather than refused: a worker reports each line once.
std::string BoundedPayload(absl::string_view kind, absl::string_view payload) {
  if (kind == kLogEventKind) return TruncateWithMarker(payload, kMaxLogLineBytes);
  return std::string(payload);
}

}  // namespace

absl::Status ValidateJobNameForPath(absl::string_view name) {
  // ValidateJobSpec restricts the alphabet too; this check holds even if that one is relaxed,
  // because the name may end up in paths.
  if (name.empty()) return absl::InvalidArgumentError("name is required");
  if (name == "." || name == ".." || absl::StrContains(name, "/") ||
      absl::StrContains(name, "\\") || absl::StrContains(name, "..") || name.front() == '.' ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name = '", name, "' could escape a directory ('/', '\\', '..' or a ", "leading '.')"));
  }
  return absl::OkStatus();
}

Coordinator::Coordinator(Store* store) : store_(store) {}

Coordinator::~Coordinator() { Shutdown(); }

absl::StatusOr<JobRecord> Coordinator::Submit(absl::string_view submission_id,
                                              const v1::JobSpec& spec, int32_t priority) {
  MOETRAIN_RETURN_IF_ERROR(ValidateSubmissionId(submission_id));
  MOETRAIN_RETURN_IF_ERROR(ValidateJobNameForPath(spec.name()));
  MOETRAIN_RETURN_IF_ERROR(ValidateSpecPath("data.path", spec.data().path()));
  MOETRAIN_RETURN_IF_ERROR(ValidateSpecPath("checkpoint.dir", spec.checkpoint().dir()));
  MOETRAIN_RETURN_IF_ERROR(ValidateSpecPath("checkpoint.init_from", spec.checkpoint().init_from()));
  MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec resolved, ResolveJobSpec(spec));

  NewJob job;
  job.submission_id = std::string(submission_id);
  job.name = resolved.name();
  job.spec = SerializeDeterministic(resolved);
  if (job.spec.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec serializes to ", job.spec.size(), " bytes, more than ", kMaxSpecBytes));
  }
  job.priority = priority;

  MOETRAIN_ASSIGN_OR_RETURN(JobRecord record, store_->CreateJob(job));
  // Told for repeats too: waking the watchers and the scheduler once more costs nothing.
  NotifyAppended();
  if (submitted_listener_) submitted_listener_(record.id);
  return record;
}

absl::StatusOr<JobRecord> Coordinator::SubmitSerialized(absl::string_view submission_id,
                                                        absl::string_view spec_bytes,
                                                        int32_t priority) {
  v1::JobSpec spec;
  if (!spec.ParseFromString(std::string(spec_bytes))) {
    return absl::InvalidArgumentError("spec: not a serialized moetrain.v1.JobSpec");
  }
  return Submit(submission_id, spec, priority);
}

absl::StatusOr<bool> Coordinator::HasSubmission(absl::string_view submission_id) {
  return store_->HasSubmission(submission_id);
}

absl::StatusOr<JobRecord> Coordinator::Get(absl::string_view job_id) {
  return store_->GetJob(job_id);
}

absl::StatusOr<JobPage> Coordinator::List(const ListOptions& options) {
  if (options.page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", options.page_size, " is negative"));
  }
  if (options.match_nothing) return JobPage{};
  ListJobsOptions store_options;
  store_options.page_size = std::min(options.page_size, kMaxPageSize);
  store_options.page_token = options.page_token;
  store_options.states = options.states;
  std::sort(store_options.states.begin(), store_options.states.end());
  store_options.states.erase(std::unique(store_options.states.begin(), store_options.states.end()),
                             store_options.states.end());
  return store_->ListJobs(store_options);
}

absl::StatusOr<JobRecord> Coordinator::Cancel(absl::string_view job_id, absl::string_view reason) {
  if (reason.size() > kMaxReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("reason has ", reason.size(), " bytes, more than ", kMaxReasonBytes));
  }
  const std::string why = reason.empty() ? "cancelled" : std::string(reason);
  for (int attempt = 0; attempt < kCancelTries; ++attempt) {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
    if (IsFinal(job.state)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job.id, " is ", JobStateName(job.state), ", a final state; nothing to cancel"));
    }
    absl::StatusOr<JobRecord> cancelled = Transition(job.id, job.state, JobState::kCancelled, why);
    // FailedPrecondition: the state moved between the read and the transition; look again.
    if (!absl::IsFailedPrecondition(cancelled.status())) return cancelled;
  }
  return absl::UnavailableError(
      absl::StrCat("job ", job_id, " kept changing state while being cancelled; retry"));
}

absl::Status Coordinator::Watch(absl::string_view job_id, const WatchOptions& options,
                                const EventCallback& callback) {
  if (options.from_sequence < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("from_sequence = ", options.from_sequence, " is below 1"));
  }
  MOETRAIN_RETURN_IF_ERROR(store_->GetJob(job_id).status());
  int64_t next = options.from_sequence;
  for (;;) {
    // Read the generation before the store: an append after this read moves it, so the wait
    // below cannot miss it.
    uint64_t seen;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return ShuttingDown();
      seen = generation_;
    }
    MOETRAIN_ASSIGN_OR_RETURN(std::vector<EventRecord> events,
                              store_->ReadEvents(job_id, next, kWatchBatch));
    for (const EventRecord& event : events) {
      if (!callback(event)) return absl::OkStatus();
      next = event.sequence + 1;
      if (event.kind == kStateChangeEventKind) {
        absl::StatusOr<StateChange> change = DecodeStateChange(event.payload);
        if (change.ok() && IsFinal(change->to)) return absl::OkStatus();
      }
    }
    if (!events.empty()) continue;
    if (options.no_wait) return absl::OkStatus();
    // Nothing left: a final job will have no more events (its final state change was appended
    // with the state, so it is behind us already, or before from_sequence).
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
    if (IsFinal(job.state)) {
      MOETRAIN_ASSIGN_OR_RETURN(std::vector<EventRecord> late, store_->ReadEvents(job_id, next, 1));
      if (late.empty()) return absl::OkStatus();
      continue;
    }
    if (options.is_cancelled && options.is_cancelled()) return absl::OkStatus();
    // The deadline also bounds how late an event appended behind the coordinator's back (another
    // process on the same file) is seen.
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + options.cancel_check_interval;
    while (generation_ == seen && !shutdown_) {
      if (appended_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (shutdown_) return ShuttingDown();
  }
}

absl::StatusOr<JobRecord> Coordinator::Transition(absl::string_view job_id, JobState from,
                                                  JobState to, absl::string_view reason,
                                                  const TransitionOptions& options) {
  absl::StatusOr<JobRecord> job = store_->TransitionJob(job_id, from, to, reason, options);
  if (job.ok()) NotifyAppended();
  return job;
}

absl::StatusOr<int64_t> Coordinator::AppendEvent(absl::string_view job_id, absl::string_view kind,
                                                 absl::string_view payload) {
  absl::StatusOr<int64_t> sequence =
      store_->AppendEvent(job_id, kind, BoundedPayload(kind, payload));
  if (sequence.ok()) NotifyAppended();
  return sequence;
}

absl::Status Coordinator::AppendEvents(const std::vector<NewEvent>& events) {
  std::vector<NewEvent> bounded = events;
  for (NewEvent& event : bounded) event.payload = BoundedPayload(event.kind, event.payload);
  absl::Status status = store_->AppendEvents(bounded);
  if (status.ok()) NotifyAppended();
  return status;
}

absl::StatusOr<int64_t> Coordinator::RecordStepMetrics(absl::string_view job_id, int32_t attempt,
                                                       const v1::StepMetrics& metrics) {
  // The per-expert FP8 statistics (layers × experts entries) go to /metrics only, behind
  // --metrics-per-expert; the store keeps the per-layer ones.
  v1::StepMetrics stored = metrics;
  stored.clear_fp8_experts();
  absl::StatusOr<int64_t> sequence =
      store_->RecordStepMetrics(job_id, attempt, stored.SerializeAsString());
  if (sequence.ok()) NotifyAppended();
  return sequence;
}

absl::StatusOr<std::vector<CheckpointRecord>> Coordinator::ListCheckpoints(
    absl::string_view job_id) {
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> all, store_->ListCheckpoints(job_id));
  std::error_code error;
  const bool root_visible =
      !all.empty() &&
      std::filesystem::is_directory(std::filesystem::path(all.back().path).parent_path(), error);
  if (!root_visible) return all;
  std::vector<CheckpointRecord> present;
  for (CheckpointRecord& checkpoint : all) {
    if (std::filesystem::is_directory(checkpoint.path, error)) {
      present.push_back(std::move(checkpoint));
    }
  }
  return present;
}

absl::StatusOr<std::optional<EventRecord>> Coordinator::LastEvent(absl::string_view job_id) {
  return store_->LastEvent(job_id);
}

absl::StatusOr<std::vector<EventRecord>> Coordinator::ReadEvents(absl::string_view job_id,
                                                                 int64_t from_sequence, int limit) {
  return store_->ReadEvents(job_id, from_sequence, limit);
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  appended_.SignalAll();
}

void Coordinator::SetSubmittedListener(std::function<void(const std::string& job_id)> listener) {
  submitted_listener_ = std::move(listener);
}

void Coordinator::NotifyAppended() {
  absl::MutexLock lock(&mu_);
  ++generation_;
  appended_.SignalAll();
}

}  // namespace moetrain::server
