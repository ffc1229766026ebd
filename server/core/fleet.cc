// The calls of workers (registration, heartbeats, polls, reports, rendezvous) and of the job API
// (cancel, workers). The control loop and the life of attempts are in fleet_control.cc.
#include "server/core/fleet.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/memory_admission.h"
#include "moetrain/v1/proto_time.h"
#include "server/core/fleet_internal.h"
#include "server/core/step_report_shape.h"
#include "server/core/worker_secret.h"

namespace moetrain::server {
namespace {

constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxVersionBytes = 64;
constexpr int kMaxLogLines = 1000;
constexpr size_t kMaxLogLineBytes = 16 << 10;
// How often a long poll asks whether its caller went away.
constexpr absl::Duration kCancelCheck = absl::Milliseconds(200);

// "step-00000100", as the engine names step directories.
std::string StepDirName(int64_t step) {
  std::string digits = absl::StrCat(step);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return absl::StrCat("step-", digits);
}

}  // namespace

Fleet::Fleet(Store* store, Coordinator* coordinator, ServiceMetrics* metrics, FleetOptions options)
    : store_(store),
      coordinator_(coordinator),
      options_(std::move(options)),
      kv_(RendezvousLimits{.max_keys_per_rank = options_.kv_max_keys_per_rank,
                           .max_bytes_per_rank = options_.kv_max_bytes_per_rank,
                           .max_keys_per_attempt = options_.kv_max_keys_per_attempt,
                           .max_bytes_per_attempt = options_.kv_max_bytes_per_attempt,
                           .max_bytes_total = options_.kv_max_bytes_total}),
      metrics_(metrics, options_.metrics_retention) {}

absl::StatusOr<std::unique_ptr<Fleet>> Fleet::Create(Store* store, Coordinator* coordinator,
                                                     ServiceMetrics* metrics,
                                                     FleetOptions options) {
  MOETRAIN_RETURN_IF_ERROR(options.Validate());
  if (options.reconcile_grace == absl::ZeroDuration()) {
    options.reconcile_grace = options.heartbeat_timeout;
  }
  if (options.forget_never_heartbeated_after == absl::ZeroDuration()) {
    options.forget_never_heartbeated_after = options.heartbeat_timeout;
  }
  std::unique_ptr<Fleet> fleet(new Fleet(store, coordinator, metrics, std::move(options)));
  MOETRAIN_RETURN_IF_ERROR(fleet->Reload());
  return fleet;
}

Fleet::~Fleet() { Stop(); }

void Fleet::Start() {
  absl::MutexLock lock(&mu_);
  if (control_thread_.joinable() || stopping_) return;
  control_thread_ = std::thread([this] { ControlLoop(); });
}

void Fleet::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  kv_.Shutdown();  // KvWait calls wait on the rendezvous, not on changed_
  if (control_thread_.joinable()) control_thread_.join();
}

void Fleet::Wake() {
  wake_.store(true);
  changed_.SignalAll();
}

absl::StatusOr<Fleet::WorkerEntry*> Fleet::FindWorker(absl::string_view worker_id) {
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker '", worker_id, "' is not registered"));
  }
  if (it->second->lost) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", worker_id, " was declared lost; its ranks were given away: register again"));
  }
  return it->second.get();
}

absl::StatusOr<Fleet::AttemptEntry*> Fleet::FindCurrentAttempt(absl::string_view job_id,
                                                               int64_t attempt) {
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  auto it = attempts_.find(job_id);
  if (it == attempts_.end() || it->second->attempt != attempt) {
    absl::StatusOr<JobRecord> job = store_->GetJob(job_id);
    if (!job.ok()) return job.status();
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of job ", job_id, " is not running (the job is ",
                     JobStateName(job->state), ", attempt ", job->attempt, ")"));
  }
  return it->second.get();
}

absl::StatusOr<Fleet::AttemptEntry*> Fleet::FindAttempt(absl::string_view worker_id,
                                                        absl::string_view job_id, int64_t attempt,
                                                        int32_t rank) {
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(worker_id));
  MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindCurrentAttempt(job_id, attempt));
  const int32_t member = entry->MemberOf(rank);
  if (member < 0 || entry->workers[member] != worker_id) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of attempt ", attempt,
                                                      " of job ", job_id,
                                                      " was not given to worker ", worker_id));
  }
  // A rank that reported its end holds no slot any more: nothing more may come from it.
  if (!worker->slot.has_value() || !worker->slot->Is(job_id, attempt) ||
      worker->slot->assignment.rank() != rank) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of attempt ", attempt,
                                                      " of job ", job_id, " on worker ", worker_id,
                                                      " has already ended"));
  }
  return entry;
}

WorkerState Fleet::StateOf(const WorkerEntry& worker) const {
  if (worker.lost) return WorkerState::kLost;
  if (worker.draining && !worker.slot.has_value()) return WorkerState::kDraining;
  return worker.slot.has_value() ? WorkerState::kBusy : WorkerState::kIdle;
}

absl::StatusOr<v1::RegisterWorkerResponse> Fleet::Register(const v1::RegisterWorkerRequest& request,
                                                           absl::string_view client) {
  const v1::WorkerResources& resources = request.resources();
  if (request.name().size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name has ", request.name().size(), " bytes, more than ", kMaxNameBytes));
  }
  if (request.version().size() > kMaxVersionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("version has ", request.version().size(),
                                                   " bytes, more than ", kMaxVersionBytes));
  }
  if (resources.device_count() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device_count = ", resources.device_count(), " is below 1"));
  }
  if (resources.device_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.device_memory_bytes = ", resources.device_memory_bytes(), " is negative"));
  }
  if (resources.threads() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.threads = ", resources.threads(), " is below 1"));
  }
  if (!v1::ResourceConfig::Device_IsValid(resources.device())) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device = ", resources.device(), " is not a known device kind"));
  }
  MOETRAIN_ASSIGN_OR_RETURN(std::string secret, NewWorkerSecret());
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
  MOETRAIN_RETURN_IF_ERROR(CheckRegistrationQuota(client));
  auto worker = std::make_unique<WorkerEntry>();
  worker->client = std::string(client);
  do {
    worker->id = RandomId("w-");
  } while (workers_.count(worker->id) != 0);
  worker->secret_sha256 = WorkerSecretDigest(secret);
  worker->name = request.name().empty() ? worker->id : request.name();
  worker->version = request.version();
  worker->resources = resources;
  worker->last_heartbeat = absl::Now();
  MOETRAIN_RETURN_IF_ERROR(PersistWorker(*worker));
  Log(absl::StrCat(
      "worker ", worker->id, " (", worker->name, ", ",
      v1::ResourceConfig::Device_Name(resources.device()), " x", resources.device_count(),
      resources.device_memory_bytes() > 0
          ? absl::StrFormat(" of %.1f GiB",
                            resources.device_memory_bytes() / (1024.0 * 1024.0 * 1024.0))
          : std::string(),
      ", ", resources.threads(), " threads, version ", worker->version, ") registered"));
  v1::RegisterWorkerResponse response;
  response.set_worker_id(worker->id);
  response.set_worker_secret(std::move(secret));
  ToProtoDuration(options_.heartbeat_interval, response.mutable_heartbeat_interval());
  ToProtoDuration(options_.heartbeat_timeout, response.mutable_heartbeat_timeout());
  workers_.emplace(worker->id, std::move(worker));
  RequestSchedule();
  return response;
}

absl::Status Fleet::PersistWorker(const WorkerEntry& worker) {
  WorkerRecord record;
  record.id = worker.id;
  record.name = worker.name;
  v1::StoredWorker stored;  // the resources and version, as registered, and the secret's digest
  *stored.mutable_resources() = worker.resources;
  stored.set_version(worker.version);
  stored.set_name(worker.name);
  stored.set_secret_sha256(worker.secret_sha256);
  stored.set_heartbeated(worker.heartbeated);
  record.resources = stored.SerializeAsString();
  record.state = worker.lost ? WorkerState::kLost : WorkerState::kIdle;
  return store_->UpsertWorker(record);
}

absl::Status Fleet::Authenticate(absl::string_view worker_id, absl::string_view secret) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(worker_id));
  if (worker->secret_sha256.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", worker_id, " registered before workers had secrets: register again"));
  }
  if (secret.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("the call carries no secret of worker ", worker_id,
                     " (the worker_secret its RegisterWorker returned)"));
  }
  if (!WorkerSecretMatches(worker->secret_sha256, secret)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the secret is not the one issued to worker ", worker_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> Fleet::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(request.worker_id()));
  if (!worker->heartbeated) MOETRAIN_RETURN_IF_ERROR(MarkHeartbeated(*worker));
  worker->last_heartbeat = absl::Now();
  worker->reloaded = false;
  if (request.draining()) worker->draining = true;  // shutting down: no new rank
  v1::HeartbeatResponse response;
  bool slot_listed = false;
  for (const v1::RunningAttempt& running : request.running()) {
    const bool own = worker->slot.has_value() &&
                     worker->slot->Is(running.job_id(), running.attempt()) &&
                     worker->slot->assignment.rank() == running.rank();
    if (own && !worker->slot->stopping) {
      slot_listed = true;
      auto it = attempts_.find(running.job_id());
      if (it != attempts_.end() && it->second->attempt == running.attempt()) {
        MOETRAIN_RETURN_IF_ERROR(MarkStarted(*it->second, it->second->MemberOf(running.rank())));
      }
      continue;
    }
    slot_listed |= own;
    // Stopping, or not (any longer) this worker's to run: stop it.
    v1::AttemptRef* stop = response.add_cancel();
    stop->set_job_id(running.job_id());
    stop->set_attempt(running.attempt());
  }
  // A rank told to stop that the worker no longer lists has ended (or never began): the worker
  // is free. One that was never told to stop and is not listed yet has not been picked up.
  if (worker->slot.has_value() && worker->slot->stopping && !slot_listed) ReleaseSlot(*worker);
  return response;
}

absl::StatusOr<v1::GetAssignmentResponse> Fleet::GetAssignment(
    const v1::GetAssignmentRequest& request, const std::function<bool()>& is_cancelled) {
  const absl::Duration wait = std::clamp(FromProtoDuration(request.wait_timeout()),
                                         absl::ZeroDuration(), options_.max_assignment_wait);
  const absl::Time deadline = absl::Now() + wait;
  // A delivered assignment is sent again only if its rank has not shown up after this long
  // (the first response may have been lost).
  const absl::Duration redeliver_after = 2 * options_.heartbeat_interval;
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * caller, FindWorker(request.worker_id()));
  // One long poll per worker: a genuine worker keeps one, so an older call still waiting is one
  // its worker gave up on (or a flood of calls, each of which would hold a server thread).
  const int64_t poll = ++caller->polls;
  changed_.SignalAll();
  for (;;) {
    MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(request.worker_id()));
    if (worker->polls != poll) return v1::GetAssignmentResponse();  // a newer poll took over
    const absl::Time now = absl::Now();
    v1::GetAssignmentResponse response;
    if (worker->slot.has_value()) {
      Slot& slot = *worker->slot;
      if (slot.stopping && !slot.stop_sent) {
        slot.stop_sent = true;
        v1::AttemptRef* stop = response.add_cancel();
        stop->set_job_id(slot.assignment.job_id());
        stop->set_attempt(slot.assignment.attempt());
        return response;
      }
      if (!slot.stopping && !slot.started &&
          (!slot.delivered || now - slot.delivered_at >= redeliver_after)) {
        slot.delivered = true;
        slot.delivered_at = now;
        *response.mutable_assignment() = slot.assignment;
        return response;
      }
    }
    if (now >= deadline || (is_cancelled && is_cancelled())) return response;
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + kCancelCheck));
  }
}

absl::Status Fleet::MarkStarted(AttemptEntry& attempt, int member) {
  if (member < 0 || attempt.started[member]) return absl::OkStatus();
  attempt.started[member] = true;
  auto worker = workers_.find(attempt.workers[member]);
  if (worker != workers_.end() && worker->second->slot.has_value()) {
    worker->second->slot->started = true;
  }
  if (std::find(attempt.started.begin(), attempt.started.end(), false) != attempt.started.end()) {
    return absl::OkStatus();
  }
  // A reloaded attempt may have been RUNNING before the coordinator restarted.
  MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(attempt.job_id));
  if (job.state != JobState::kScheduled) return absl::OkStatus();
  return TransitionJob(attempt.job_id, JobState::kScheduled, JobState::kRunning,
                       absl::StrCat("all ", attempt.world_size(), " ranks of attempt ",
                                    attempt.attempt, " are running"))
      .status();
}

absl::Status Fleet::ReportStep(const v1::ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(
      AttemptEntry * attempt,
      FindAttempt(request.worker_id(), request.job_id(), request.attempt(), request.rank()));
  const v1::StepMetrics& metrics = request.metrics();
  // A step outside the job's range would freeze its progress (every real report after it would
  // look like a repeat).
  if (metrics.step() < 1 || metrics.step() > attempt->total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.step = ", metrics.step(), " is outside [1, train.steps = ", attempt->total_steps,
        "] of job ", request.job_id()));
  }
  // Arrays that do not fit the job's model would grow /metrics and the event log without bound.
  MOETRAIN_RETURN_IF_ERROR(CheckStepReport(
      metrics, StepReportShape::Of(workers_.at(request.worker_id())->slot->assignment.spec())));
  // Rank 0 speaks for the job; the others' reports only show that they are alive.
  if (request.rank() == 0 && metrics.step() <= attempt->last_step) {
    return absl::AlreadyExistsError(absl::StrCat(
        "metrics.step = ", metrics.step(), " is not after step ", attempt->last_step,
        ", already reported by attempt ", attempt->attempt, " of job ", request.job_id()));
  }
  MOETRAIN_RETURN_IF_ERROR(MarkStarted(*attempt, attempt->MemberOf(request.rank())));
  if (request.rank() != 0) return absl::OkStatus();
  MOETRAIN_RETURN_IF_ERROR(
      coordinator_->RecordStepMetrics(request.job_id(), attempt->attempt, metrics).status());
  attempt->last_step = metrics.step();
  const int64_t new_tokens =
      std::max<int64_t>(0, metrics.tokens_seen() - attempt->last_tokens_seen);
  attempt->last_tokens_seen = std::max(attempt->last_tokens_seen, metrics.tokens_seen());
  metrics_.OnStep(request.job_id(), metrics, new_tokens);
  return absl::OkStatus();
}

absl::Status Fleet::ReportLog(const v1::ReportLogRequest& request) {
  if (request.lines_size() > kMaxLogLines) {
    return absl::InvalidArgumentError(
        absl::StrCat(request.lines_size(), " lines in one call; at most ", kMaxLogLines));
  }
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(
      AttemptEntry * attempt,
      FindAttempt(request.worker_id(), request.job_id(), request.attempt(), request.rank()));
  MOETRAIN_RETURN_IF_ERROR(MarkStarted(*attempt, attempt->MemberOf(request.rank())));
  const std::string prefix =
      attempt->world_size() > 1 ? absl::StrCat("[rank ", request.rank(), "] ") : "";
  for (const std::string& line : request.lines()) {
    MOETRAIN_RETURN_IF_ERROR(
        coordinator_
            ->AppendEvent(request.job_id(), kLogEventKind,
                          absl::StrCat(prefix, absl::string_view(line).substr(0, kMaxLogLineBytes)))
            .status());
  }
  return absl::OkStatus();
}

absl::Status Fleet::ReportCheckpoint(const v1::ReportCheckpointRequest& request) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(
      AttemptEntry * attempt,
      FindAttempt(request.worker_id(), request.job_id(), request.attempt(), request.rank()));
  const int32_t member = attempt->MemberOf(request.rank());
  MOETRAIN_RETURN_IF_ERROR(MarkStarted(*attempt, member));
  const Slot& slot = *workers_.at(request.worker_id())->slot;
  const std::string expected =
      absl::StrCat(slot.assignment.checkpoint_dir(), "/", StepDirName(request.step()));
  // A step past train.steps would pass for the job's final checkpoint (ReportSucceeded).
  if (request.step() < 1 || request.step() > attempt->total_steps || request.path() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint step ", request.step(), " at '", request.path(), "': expected a step in [1, ",
        "train.steps = ", attempt->total_steps, "] at '", expected, "'"));
  }
  metrics_.OnCheckpointWritten(request.job_id(), FromProtoDuration(request.write_duration()));
  std::set<int32_t>& members = attempt->checkpoint_members[request.step()];
  members.insert(member);
  if (members.size() < attempt->workers.size()) return absl::OkStatus();
  attempt->checkpoint_members.erase(attempt->checkpoint_members.begin(),
                                    attempt->checkpoint_members.upper_bound(request.step()));
  CheckpointRecord record;
  record.step = request.step();
  record.path = request.path();
  record.tokens_seen = request.tokens_seen();
  record.attempt = attempt->attempt;
  MOETRAIN_RETURN_IF_ERROR(store_->RecordCheckpoint(request.job_id(), record));
  metrics_.OnCheckpointGood(request.job_id(), record.step, absl::Now());
  v1::CheckpointSaved saved;
  saved.set_step(request.step());
  saved.set_path(request.path());
  saved.set_tokens_seen(request.tokens_seen());
  return coordinator_
      ->AppendEvent(request.job_id(), kCheckpointSavedEventKind, saved.SerializeAsString())
      .status();
}

absl::Status Fleet::ReportAttemptEnd(const v1::ReportAttemptEndRequest& request) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(request.worker_id()));
  if (!worker->slot.has_value() || !worker->slot->Is(request.job_id(), request.attempt()) ||
      worker->slot->assignment.rank() != request.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " holds no rank ", request.rank(),
                     " of attempt ", request.attempt(), " of job ", request.job_id()));
  }
  // Only the worker says whether it is shutting down: the other ranks of a gang stop with it.
  if (request.worker_draining()) worker->draining = true;
  auto it = attempts_.find(request.job_id());
  if (it == attempts_.end() || it->second->attempt != request.attempt()) {
    // A rank of an attempt that is over already (stopped, cancelled, replaced) has wound down.
    ReleaseSlot(*worker);
    return absl::OkStatus();
  }
  AttemptEntry& attempt = *it->second;
  const int32_t member = attempt.MemberOf(request.rank());
  const std::string who =
      absl::StrCat("rank ", request.rank(), " on worker ", worker->id, " (", worker->name, ")");
  switch (request.outcome()) {
    case v1::ATTEMPT_OUTCOME_SUCCEEDED:
      return ReportSucceeded(attempt, member, *worker, request.step(), who);
    case v1::ATTEMPT_OUTCOME_FAILED:
      ReleaseSlot(*worker);
      return EndAttemptUnsuccessfully(
          attempt, "failed", absl::StrCat(who, " failed: ", request.message()),
          request.failure_kind() == v1::FAILURE_KIND_PERMANENT ? Failure::kPermanent
                                                               : Failure::kTransient);
    case v1::ATTEMPT_OUTCOME_CANCELLED:
    case v1::ATTEMPT_OUTCOME_STOPPED:
      // Nobody told this rank to stop (that would have ended the attempt already): its worker,
      // or another of the gang, is shutting down, after a checkpoint. The job restarts; the
      // worker that shuts down said so (worker_draining) and gets no part of it.
      ReleaseSlot(*worker);
      return EndAttemptUnsuccessfully(
          attempt, "stopped",
          absl::StrCat(who, " stopped at step ", request.step(),
                       request.message().empty() ? "" : absl::StrCat(": ", request.message())),
          Failure::kNone);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("outcome = ", request.outcome(), " is not a known attempt outcome"));
  }
}

void Fleet::ReleaseSlot(WorkerEntry& worker) {
  worker.slot.reset();
  RequestSchedule();
}

void Fleet::OrderStop(const AttemptEntry& attempt) {
  for (const std::string& id : attempt.workers) {
    auto it = workers_.find(id);
    if (it == workers_.end() || !it->second->slot.has_value()) continue;
    WorkerEntry& worker = *it->second;
    if (!worker.slot->Is(attempt.job_id, attempt.attempt)) continue;
    if (!worker.slot->delivered) {
      ReleaseSlot(worker);  // never handed out: nothing to stop
    } else {
      worker.slot->stopping = true;
      worker.slot->stop_sent = false;
    }
  }
  changed_.SignalAll();
}

void Fleet::ForgetAttempt(absl::string_view job_id) {
  auto it = attempts_.find(job_id);
  if (it != attempts_.end()) attempts_.erase(it);
  kv_.Close(job_id);
}

absl::StatusOr<JobRecord> Fleet::Cancel(absl::string_view job_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, coordinator_->Cancel(job_id, reason));
  metrics_.OnCancel(job);
  auto it = attempts_.find(job_id);
  if (it != attempts_.end()) {
    MOETRAIN_RETURN_IF_ERROR(store_->EndAttempt(job_id, it->second->attempt, "cancelled"));
    OrderStop(*it->second);
    ForgetAttempt(job_id);
  }
  waiting_reasons_.erase(std::string(job_id));
  stored_waiting_.erase(std::string(job_id));
  Log(absl::StrCat("job ", job_id, " cancelled: ", job.state_reason));
  return job;
}

absl::Status Fleet::CheckDeviceMemory(const v1::JobSpec& spec) {
  // A spec that does not resolve is the coordinator's own checks' to refuse, with their message.
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(spec);
  if (!resolved.ok()) return absl::OkStatus();
  std::vector<OfferedWorker> offered;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, worker] : workers_) {
      offered.push_back({.device = worker->resources.device(),
                         .device_count = worker->resources.device_count(),
                         .device_memory_bytes = worker->resources.device_memory_bytes()});
    }
  }
  return JudgeDeviceMemory(DeviceMemoryNeedOf(*resolved), offered).status;
}

std::map<WorkerState, int64_t> Fleet::CountWorkersByState() {
  std::map<WorkerState, int64_t> counts;
  for (WorkerState state : kAllWorkerStates) counts[state] = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, worker] : workers_) ++counts[StateOf(*worker)];
  return counts;
}

void Fleet::RequestSchedule() {
  schedule_requested_ = true;
  changed_.SignalAll();
}

absl::StatusOr<JobRecord> Fleet::TransitionJob(absl::string_view job_id, JobState from, JobState to,
                                               absl::string_view reason,
                                               const TransitionOptions& options) {
  absl::StatusOr<JobRecord> moved = coordinator_->Transition(job_id, from, to, reason, options);
  if (!moved.ok()) return moved;
  stored_waiting_.erase(std::string(job_id));  // the transition emptied it
  metrics_.OnJobState(job_id, to);
  if (to == JobState::kRestarting && options.count_restart) metrics_.OnRestart(job_id);
  return moved;
}

}  // namespace moetrain::server
