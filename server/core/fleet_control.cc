// The fleet's control loop and the life of attempts: reload and reconciliation after a start,
// lost workers, scheduling passes, and how an attempt ends. The calls of workers and clients are
// in fleet.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/log.h"
#include "engine/core/status.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"
#include "server/core/scheduler.h"

namespace moetrain::server {
namespace {

// Passes triggered by requests are at least this far apart, so a burst of submissions or reports
// is looked at once.
constexpr absl::Duration kMinPassGap = absl::Milliseconds(100);
constexpr int kPageSize = 1000;
// Starts the log line that says why a job cannot start.
constexpr char kWaitingPrefix[] = "waiting: ";

absl::StatusOr<v1::JobSpec> ParseSpec(const JobRecord& job) {
  v1::JobSpec spec;
  if (!spec.ParseFromString(job.spec)) {
    return absl::DataLossError(absl::StrCat("job ", job.id, ": the stored spec does not parse"));
  }
  return spec;
}

// Every job in one of `states`, in submission order.
absl::StatusOr<std::vector<JobRecord>> JobsIn(Store& store, std::vector<JobState> states) {
  std::vector<JobRecord> jobs;
  ListJobsOptions options;
  options.states = std::move(states);
  options.page_size = kPageSize;
  do {
    MOETRAIN_ASSIGN_OR_RETURN(JobPage page, store.ListJobs(options));
    for (JobRecord& job : page.jobs) jobs.push_back(std::move(job));
    options.page_token = page.next_page_token;
  } while (!options.page_token.empty());
  return jobs;
}

void LogIfError(const absl::Status& status, absl::string_view what) {
  if (!status.ok()) Log(absl::StrCat(what, ": ", status.ToString()));
}

}  // namespace

absl::Status FleetOptions::Validate() const {
  const std::pair<const char*, absl::Duration> positive[] = {
      {"heartbeat_interval", heartbeat_interval},   {"heartbeat_timeout", heartbeat_timeout},
      {"max_assignment_wait", max_assignment_wait}, {"max_kv_wait", max_kv_wait},
      {"control_interval", control_interval},       {"forget_lost_after", forget_lost_after},
      {"metrics_retention", metrics_retention}};
  for (const auto& [name, value] : positive) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", absl::FormatDuration(value), " must be positive"));
    }
  }
  const std::pair<const char*, absl::Duration> not_negative[] = {
      {"reconcile_grace", reconcile_grace},
      {"forget_never_heartbeated_after", forget_never_heartbeated_after}};
  for (const auto& [name, value] : not_negative) {
    if (value < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", absl::FormatDuration(value), " is negative"));
    }
  }
  if (restart_backoff_initial <= absl::ZeroDuration() ||
      restart_backoff_initial > restart_backoff_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("restart_backoff_initial = ", absl::FormatDuration(restart_backoff_initial),
                     " must be positive and at most restart_backoff_max = ",
                     absl::FormatDuration(restart_backoff_max)));
  }
  if (heartbeat_interval >= heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval = ", absl::FormatDuration(heartbeat_interval),
        " must be below heartbeat_timeout = ", absl::FormatDuration(heartbeat_timeout)));
  }
  const std::pair<const char*, int64_t> counts[] = {
      {"max_unheartbeated_registrations_per_client", max_unheartbeated_registrations_per_client},
      {"kv_max_keys_per_rank", kv_max_keys_per_rank},
      {"kv_max_bytes_per_rank", kv_max_bytes_per_rank},
      {"kv_max_keys_per_attempt", kv_max_keys_per_attempt},
      {"kv_max_bytes_per_attempt", kv_max_bytes_per_attempt},
      {"kv_max_bytes_total", kv_max_bytes_total}};
  for (const auto& [name, value] : counts) {
    if (value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, " = ", value, " must be positive"));
    }
  }
  if (checkpoint_dir.empty()) return absl::InvalidArgumentError("checkpoint_dir is empty");
  return absl::OkStatus();
}

std::string Fleet::CheckpointRoot(const JobRecord& job, const v1::JobSpec& spec) const {
  const std::string& root =
      spec.checkpoint().dir().empty() ? options_.checkpoint_dir : spec.checkpoint().dir();
  return absl::StrCat(
      root, "/", options_.checkpoint_naming == CheckpointNaming::kJobName ? spec.name() : job.id);
}

absl::Status Fleet::Reload() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, store_->ListWorkers());
  for (const WorkerRecord& record : workers) {
    auto worker = std::make_unique<WorkerEntry>();
    v1::StoredWorker registration;
    if (!registration.ParseFromString(record.resources)) {
      return absl::DataLossError(
          absl::StrCat("store: worker ", record.id, ": its resources do not parse"));
    }
    worker->id = record.id;
    worker->name = record.name;
    worker->version = registration.version();
    worker->resources = registration.resources();
    worker->secret_sha256 = registration.secret_sha256();
    worker->heartbeated = registration.heartbeated();
    worker->lost = record.state == WorkerState::kLost;
    worker->reloaded = !worker->lost;
    // Everyone gets a fresh heartbeat_timeout to show up: the coordinator was away, not them.
    worker->last_heartbeat = now;
    workers_.emplace(worker->id, std::move(worker));
  }

  MOETRAIN_ASSIGN_OR_RETURN(auto open, store_->ListOpenAttempts());
  for (const auto& [job_id, record] : open) {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
    const bool live = (job.state == JobState::kScheduled || job.state == JobState::kRunning) &&
                      job.attempt == record.attempt;
    if (!live) {
      MOETRAIN_RETURN_IF_ERROR(store_->EndAttempt(job_id, record.attempt, "abandoned"));
      continue;
    }
    MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseSpec(job));
    auto attempt = std::make_unique<AttemptEntry>();
    attempt->job_id = job_id;
    attempt->attempt = record.attempt;
    attempt->devices_per_worker = static_cast<int32_t>(spec.resources().devices_per_worker());
    attempt->max_restarts = spec.restart().max_restarts();
    attempt->total_steps = spec.train().steps();
    attempt->workers = record.workers;
    attempt->started.assign(record.workers.size(), false);
    attempt->succeeded.assign(record.workers.size(), false);
    absl::StatusOr<CheckpointRecord> checkpoint = store_->LatestCheckpoint(job_id);
    attempt->last_tokens_seen = checkpoint.ok() ? checkpoint->tokens_seen : 0;
    v1::StepMetrics last;
    if (job.last_step_attempt == record.attempt && last.ParseFromString(job.last_step_metrics)) {
      // This attempt's own reports: a retry of one of them is a repeat.
      attempt->last_step = last.step();
      attempt->last_tokens_seen = last.tokens_seen();
    }
    for (size_t member = 0; member < record.workers.size(); ++member) {
      auto worker = workers_.find(record.workers[member]);
      if (worker == workers_.end() || worker->second->lost) continue;
      Slot& slot = worker->second->slot.emplace();
      v1::Assignment& assignment = slot.assignment;
      assignment.set_job_id(job_id);
      assignment.set_attempt(record.attempt);
      assignment.set_rank(static_cast<int32_t>(member) * attempt->devices_per_worker);
      assignment.set_world_size(attempt->world_size());
      *assignment.mutable_spec() = spec;
      if (checkpoint.ok()) assignment.set_resume_checkpoint(checkpoint->path);
      assignment.set_checkpoint_dir(CheckpointRoot(job, spec));
      assignment.set_checkpoint_root(options_.checkpoint_dir);
      slot.assigned_at = now;
      slot.delivered = true;
      slot.delivered_at = now;
    }
    metrics_.OnAttemptStart(job, spec, checkpoint.ok() ? &*checkpoint : nullptr);
    metrics_.OnJobState(job_id, job.state);
    kv_.Open(job_id, record.attempt, attempt->world_size());
    attempts_.emplace(job_id, std::move(attempt));
    reconciling_ = true;
  }
  // A job moved on past an ended attempt but not yet to its next state (a crash in between).
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> orphans,
                            JobsIn(*store_, {JobState::kScheduled, JobState::kRunning}));
  for (const JobRecord& job : orphans) {
    if (attempts_.count(job.id) != 0) continue;
    TransitionOptions free_restart;
    free_restart.count_restart = false;
    MOETRAIN_RETURN_IF_ERROR(TransitionJob(job.id, job.state, JobState::kRestarting,
                                           absl::StrCat("the coordinator restarted after attempt ",
                                                        job.attempt, " had ended"),
                                           free_restart)
                                 .status());
  }
  // What each waiting job was last told, so a restart does not say it again.
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> waiting,
                            JobsIn(*store_, {JobState::kPending, JobState::kRestarting}));
  for (const JobRecord& job : waiting) {
    if (!job.waiting_reason.empty()) stored_waiting_[job.id] = job.waiting_reason;
    MOETRAIN_ASSIGN_OR_RETURN(std::optional<EventRecord> last, store_->LastEvent(job.id));
    if (last.has_value() && last->kind == kLogEventKind &&
        absl::StartsWith(last->payload, kWaitingPrefix)) {
      waiting_reasons_[job.id] = last->payload.substr(strlen(kWaitingPrefix));
    }
  }
  grace_until_ = workers_.empty() ? now : now + options_.reconcile_grace;
  // Known workers get the grace period to come back even with nothing in flight, and waiting
  // ends early once all of them are back.
  if (!workers_.empty()) reconciling_ = true;
  if (!attempts_.empty()) {
    Log(absl::StrCat("reloaded ", workers_.size(), " workers and ", attempts_.size(),
                     " attempts in flight; waiting ",
                     absl::FormatDuration(options_.reconcile_grace),
                     " for their workers to report"));
  }
  return absl::OkStatus();
}

void Fleet::ControlLoop() {
  for (;;) {
    ControlPass();
    absl::MutexLock lock(&mu_);
    const absl::Time earliest = absl::Now() + kMinPassGap;
    const absl::Time latest = absl::Now() + options_.control_interval;
    for (;;) {
      if (stopping_) return;
      if (wake_.exchange(false)) schedule_requested_ = true;
      const absl::Time now = absl::Now();
      if (now >= latest || (schedule_requested_ && now >= earliest)) break;
      changed_.WaitWithDeadline(&mu_, schedule_requested_ ? earliest : latest);
    }
  }
}

void Fleet::ControlPass() {
  std::vector<NewEvent> announcements;
  std::vector<std::pair<std::string, std::string>> waiting;
  {
    absl::MutexLock lock(&mu_);
    ControlPassLocked(&announcements);
    waiting.swap(unwritten_waiting_);
  }
  // The rendezvous maps' freed memory goes back to the system outside the fleet's lock, so that
  // malloc_trim does not hold up every RPC.
  kv_.TrimFreedMemory();
  // Outside the lock, in one commit: with many jobs waiting, one write per job under the lock
  // held every submit and report behind a row of fsyncs.
  if (!announcements.empty()) {
    LogIfError(coordinator_->AppendEvents(announcements), "recording why jobs wait");
  }
  // Then the job rows. Only the control thread writes these, so no later pass's reasons can
  // overtake them; a job that moved on meanwhile keeps the empty reason its transition left (the
  // store checks).
  if (!waiting.empty()) LogIfError(store_->SetWaitingReasons(waiting), "recording why jobs wait");
}

void Fleet::ControlPassLocked(std::vector<NewEvent>* announcements) {
  if (stopping_) return;
  if (wake_.exchange(false)) schedule_requested_ = true;
  const absl::Time now = absl::Now();
  metrics_.RetireEnded(now);
  if (now >= backoff_ends_) {
    backoff_ends_ = absl::InfiniteFuture();
    schedule_requested_ = true;
  }
  LostWorkersPass(now);
  // Stuck ranks only once reconciled: a reloaded rank has the grace period to show up.
  if (reconciling_) {
    ReconcilePass(now);
  } else {
    StuckRanksPass(now);
  }
  if (now >= grace_until_ && schedule_requested_) {
    schedule_requested_ = false;
    LogIfError(SchedulePass(announcements), "scheduling pass");
  }
}

void Fleet::LostWorkersPass(absl::Time now) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    WorkerEntry& worker = *it->second;
    const absl::Duration silence = now - worker.last_heartbeat;
    const absl::Duration allowed =
        worker.reloaded ? std::max(options_.heartbeat_timeout, options_.reconcile_grace)
                        : options_.heartbeat_timeout;
    if (!worker.lost && silence > allowed) {
      LogIfError(MarkLost(worker,
                          absl::StrCat(
                              "worker ", worker.id, " (", worker.name, ") sent no heartbeat for ",
                              absl::FormatDuration(absl::Trunc(silence, absl::Milliseconds(100))))),
                 absl::StrCat("marking worker ", worker.id, " lost"));
    } else if (worker.lost && silence > ForgetAfter(worker)) {
      absl::Status deleted = store_->DeleteWorker(worker.id);
      if (deleted.ok() || absl::IsNotFound(deleted)) {
        it = workers_.erase(it);
        continue;
      }
      LogIfError(deleted, absl::StrCat("forgetting worker ", worker.id));
    }
    ++it;
  }
}

void Fleet::ReconcilePass(absl::Time now) {
  if (now < grace_until_) {
    // Everyone known is back and every reloaded rank has reported: no need to wait longer.
    const bool workers_back = std::none_of(
        workers_.begin(), workers_.end(), [](const auto& entry) { return entry.second->reloaded; });
    const bool ranks_back = std::all_of(attempts_.begin(), attempts_.end(), [](const auto& entry) {
      return std::find(entry.second->started.begin(), entry.second->started.end(), false) ==
             entry.second->started.end();
    });
    if (workers_back && ranks_back) {
      Log("every worker and rank in flight reported back: reconciliation done");
      grace_until_ = now;
    }
  }
  if (now < grace_until_) return;
  // The grace period is over: an attempt with a rank that did not report starts again.
  reconciling_ = false;
  std::vector<std::string> job_ids;
  for (const auto& [job_id, attempt] : attempts_) job_ids.push_back(job_id);
  for (const std::string& job_id : job_ids) {
    AttemptEntry& attempt = *attempts_.at(job_id);
    auto missing = std::find(attempt.started.begin(), attempt.started.end(), false);
    if (missing == attempt.started.end()) continue;
    const size_t member = missing - attempt.started.begin();
    LogIfError(
        EndAttemptUnsuccessfully(
            attempt, "stopped",
            absl::StrCat("the coordinator restarted and rank ", member * attempt.devices_per_worker,
                         " (worker ", attempt.workers[member], ") did not report within ",
                         absl::FormatDuration(options_.reconcile_grace)),
            Failure::kNone),
        absl::StrCat("restarting job ", job_id));
  }
}

void Fleet::StuckRanksPass(absl::Time now) {
  // A rank that was handed out but never showed up: its worker cannot run it.
  std::vector<std::pair<std::string, std::string>> stuck;  // (job, why)
  for (const auto& [id, worker] : workers_) {
    if (!worker->slot.has_value()) continue;
    const Slot& slot = *worker->slot;
    if (slot.started || slot.stopping || now - slot.assigned_at <= options_.heartbeat_timeout) {
      continue;
    }
    stuck.emplace_back(
        slot.assignment.job_id(),
        absl::StrCat("rank ", slot.assignment.rank(), " was assigned to worker ", id, " (",
                     worker->name, ") ",
                     absl::FormatDuration(absl::Trunc(now - slot.assigned_at, absl::Seconds(1))),
                     " ago and never started"));
  }
  for (const auto& [job_id, why] : stuck) {
    auto it = attempts_.find(job_id);
    if (it == attempts_.end()) continue;
    LogIfError(EndAttemptUnsuccessfully(*it->second, "failed", why, Failure::kTransient),
               absl::StrCat("failing job ", job_id));
  }
}

absl::Status Fleet::SchedulePass(std::vector<NewEvent>* announcements) {
  MOETRAIN_ASSIGN_OR_RETURN(std::vector<JobRecord> waiting,
                            JobsIn(*store_, {JobState::kPending, JobState::kRestarting}));
  if (waiting.empty()) return absl::OkStatus();
  const absl::Time now = absl::Now();
  std::vector<PendingJob> jobs;
  std::map<std::string, const JobRecord*> by_id;
  // Why each job waits, for its job row (written when it changed).
  std::vector<UnschedulableJob> reasons;
  backoff_ends_ = absl::InfiniteFuture();
  for (const JobRecord& job : waiting) {
    if (job.next_attempt_at.has_value() && *job.next_attempt_at > now) {
      // Still backing off after a failed attempt: not a candidate, and holds no worker.
      backoff_ends_ = std::min(backoff_ends_, *job.next_attempt_at);
      reasons.push_back(
          {job.id, absl::StrCat("restart backoff after a failed attempt: the next one starts at ",
                                absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", *job.next_attempt_at,
                                                 absl::UTCTimeZone()))});
      continue;
    }
    MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseSpec(job));
    PendingJob& pending = jobs.emplace_back();
    pending.job_id = job.id;
    pending.priority = job.priority;
    pending.submit_sequence = static_cast<int64_t>(jobs.size());  // JobsIn is in submission order
    pending.workers_needed = static_cast<int32_t>(spec.resources().workers());
    pending.device_kind = spec.resources().device() == v1::ResourceConfig::CUDA ? DeviceKind::kCuda
                                                                                : DeviceKind::kCpu;
    pending.devices_per_worker = static_cast<int32_t>(spec.resources().devices_per_worker());
    // The device memory one rank needs as the spec states it (`moetrain submit` fills it from
    // the plan), so that rule 2 passes over workers too small for it; 0 = not stated.
    pending.device_memory_bytes = std::max<int64_t>(0, spec.resources().device_memory_bytes());
    by_id[job.id] = &job;
  }
  std::vector<SchedulerWorker> workers;
  for (const auto& [id, worker] : workers_) {
    SchedulerWorker& candidate = workers.emplace_back();
    candidate.worker_id = id;
    candidate.device_kind = worker->resources.device() == v1::ResourceConfig::CUDA
                                ? DeviceKind::kCuda
                                : DeviceKind::kCpu;
    candidate.device_count = worker->resources.device_count();
    candidate.device_memory_bytes = worker->resources.device_memory_bytes();
    candidate.state = StateOf(*worker);
  }
  MOETRAIN_ASSIGN_OR_RETURN(ScheduleDecision decision, Schedule(jobs, workers));
  for (const UnschedulableJob& job : decision.unschedulable) {
    reasons.push_back(job);
    std::string& announced = waiting_reasons_[job.job_id];
    if (announced == job.reason) continue;
    announcements->push_back({job.job_id, kLogEventKind, absl::StrCat(kWaitingPrefix, job.reason)});
    announced = job.reason;
  }
  reasons.insert(reasons.end(), decision.waiting.begin(), decision.waiting.end());
  for (const UnschedulableJob& job : reasons) {
    std::string& stored = stored_waiting_[job.job_id];
    if (stored == job.reason) continue;
    stored = job.reason;
    unwritten_waiting_.emplace_back(job.job_id, job.reason);
  }
  for (const Assignment& assignment : decision.assignments) {
    absl::Status started = StartAttempt(*by_id.at(assignment.job_id), assignment.worker_ids);
    // One job that cannot start must not hold up the others.
    LogIfError(started, absl::StrCat("starting job ", assignment.job_id));
  }
  return absl::OkStatus();
}

absl::Status Fleet::StartAttempt(const JobRecord& job, const std::vector<std::string>& workers) {
  MOETRAIN_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseSpec(job));
  MOETRAIN_ASSIGN_OR_RETURN(int32_t number, store_->StartAttempt(job.id, workers));
  absl::StatusOr<JobRecord> moved =
      TransitionJob(job.id, job.state, JobState::kScheduled,
                    absl::StrCat("attempt ", number, " on ", absl::StrJoin(workers, ", ")));
  if (!moved.ok()) {
    // Cancelled meanwhile: the attempt never starts.
    store_->EndAttempt(job.id, number, "abandoned").IgnoreError();
    return moved.status();
  }
  absl::StatusOr<CheckpointRecord> checkpoint = store_->LatestCheckpoint(job.id);
  if (!checkpoint.ok() && !absl::IsNotFound(checkpoint.status())) return checkpoint.status();

  auto attempt = std::make_unique<AttemptEntry>();
  attempt->job_id = job.id;
  attempt->attempt = number;
  attempt->devices_per_worker = static_cast<int32_t>(spec.resources().devices_per_worker());
  attempt->max_restarts = spec.restart().max_restarts();
  attempt->total_steps = spec.train().steps();
  attempt->workers = workers;
  attempt->started.assign(workers.size(), false);
  attempt->succeeded.assign(workers.size(), false);
  attempt->last_tokens_seen = checkpoint.ok() ? checkpoint->tokens_seen : 0;
  const absl::Time now = absl::Now();
  for (size_t member = 0; member < workers.size(); ++member) {
    Slot& slot = workers_.at(workers[member])->slot.emplace();
    v1::Assignment& assignment = slot.assignment;
    assignment.set_job_id(job.id);
    assignment.set_attempt(number);
    assignment.set_rank(static_cast<int32_t>(member) * attempt->devices_per_worker);
    assignment.set_world_size(attempt->world_size());
    *assignment.mutable_spec() = spec;
    if (checkpoint.ok()) assignment.set_resume_checkpoint(checkpoint->path);
    assignment.set_checkpoint_dir(CheckpointRoot(job, spec));
    assignment.set_checkpoint_root(options_.checkpoint_dir);
    slot.assigned_at = now;
  }
  Log(absl::StrCat("job ", job.id, " (", job.name, "): attempt ", number, " on ",
                   absl::StrJoin(workers, ", "),
                   checkpoint.ok() ? absl::StrCat(", resuming from ", checkpoint->path) : ""));
  metrics_.OnAttemptStart(job, spec, checkpoint.ok() ? &*checkpoint : nullptr);
  waiting_reasons_.erase(job.id);
  kv_.Open(job.id, number, attempt->world_size());
  attempts_.insert_or_assign(job.id, std::move(attempt));
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status Fleet::FinishAttempt(AttemptEntry& attempt, int64_t step) {
  const std::string job_id = attempt.job_id;
  const int32_t number = attempt.attempt;
  MOETRAIN_RETURN_IF_ERROR(store_->EndAttempt(job_id, number, "succeeded"));
  // The attempt has ended on record: forget it whatever happens to the job's state below.
  ForgetAttempt(job_id);
  MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
  if (job.state == JobState::kScheduled) {
    MOETRAIN_RETURN_IF_ERROR(
        TransitionJob(job_id, JobState::kScheduled, JobState::kRunning, "every rank ran").status());
  }
  MOETRAIN_RETURN_IF_ERROR(
      TransitionJob(job_id, JobState::kRunning, JobState::kSucceeded,
                    absl::StrCat("finished at step ", step, " (attempt ", number, ")"))
          .status());
  Log(absl::StrCat("job ", job_id, " succeeded at step ", step));
  return absl::OkStatus();
}

absl::Duration Fleet::RestartBackoff(int64_t restarts) const {
  absl::Duration backoff = options_.restart_backoff_initial;
  for (int64_t i = 1; i < restarts && backoff < options_.restart_backoff_max; ++i) backoff *= 2;
  return std::min(backoff, options_.restart_backoff_max);
}

absl::Status Fleet::EndAttemptUnsuccessfully(AttemptEntry& attempt, absl::string_view outcome,
                                             const std::string& reason, Failure failure) {
  const std::string job_id = attempt.job_id;
  MOETRAIN_RETURN_IF_ERROR(store_->EndAttempt(job_id, attempt.attempt, outcome));
  const bool count_restart = failure == Failure::kTransient;
  auto move_on = [&]() -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(JobRecord job, store_->GetJob(job_id));
    if (failure == Failure::kPermanent || (count_restart && job.restarts >= attempt.max_restarts)) {
      const std::string why =
          failure == Failure::kPermanent
              ? absl::StrCat(reason, "; not restarted: this job cannot run as specified")
              : absl::StrCat(reason,
                             "; no restarts left (restart.max_restarts = ", attempt.max_restarts,
                             ")");
      Log(absl::StrCat("job ", job_id, " failed: ", why));
      return TransitionJob(job_id, job.state, JobState::kFailed, why).status();
    }
    TransitionOptions options;
    options.count_restart = count_restart;
    std::string why = reason;
    if (count_restart) {
      const absl::Duration backoff = RestartBackoff(job.restarts + 1);
      options.next_attempt_at = absl::Now() + backoff;
      absl::StrAppend(&why, "; restart ", job.restarts + 1, " of ", attempt.max_restarts, " in ",
                      absl::FormatDuration(backoff));
    }
    Log(absl::StrCat("job ", job_id, " restarting: ", why));
    return TransitionJob(job_id, job.state, JobState::kRestarting, why, options).status();
  };
  const absl::Status moved = move_on();
  // The attempt has ended on record: its ranks stop whatever became of the job's state.
  OrderStop(attempt);
  ForgetAttempt(job_id);  // `attempt` is gone from here on
  RequestSchedule();
  return moved;
}

absl::Status Fleet::MarkLost(WorkerEntry& worker, const std::string& why) {
  MOETRAIN_RETURN_IF_ERROR(store_->SetWorkerState(worker.id, WorkerState::kLost));
  worker.lost = true;
  worker.last_heartbeat = absl::Now();  // from now on: when it was declared lost
  metrics_.OnWorkerLost();
  Log(absl::StrCat(why, ": declared lost"));
  absl::Status status = absl::OkStatus();
  if (worker.slot.has_value()) {
    auto it = attempts_.find(worker.slot->assignment.job_id());
    if (it != attempts_.end() && it->second->attempt == worker.slot->assignment.attempt()) {
      status = EndAttemptUnsuccessfully(*it->second, "failed", why, Failure::kTransient);
    }
    worker.slot.reset();
  }
  RequestSchedule();
  return status;
}

}  // namespace moetrain::server
