#include "worker/worker.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/log.h"
#include "moetrain/v1/backoff.h"
#include "moetrain/v1/proto_time.h"
#include "worker/assignment_ranks.h"
#include "worker/rank_runner.h"
#include "worker/rendezvous_store.h"

namespace moetrain {
namespace {

constexpr absl::Duration kInitialBackoff = absl::Milliseconds(100);

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

absl::Status WorkerOptions::Validate() const {
  if (device_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("device count = ", device_count, " is below 1"));
  }
  if (memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory-limit = ", memory_limit_bytes, " bytes is negative"));
  }
  if (threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads = ", threads, " is below 1"));
  }
  if (rank_executable.empty()) return absl::InvalidArgumentError("rank_executable is empty");
  for (const auto& [name, value] : {std::pair<const char*, absl::Duration>{"poll_wait", poll_wait},
                                    {"call_timeout", call_timeout},
                                    {"max_backoff", max_backoff},
                                    {"comm_timeout", comm_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " = ", absl::FormatDuration(value), " must be positive"));
    }
  }
  return absl::OkStatus();
}

Worker::Worker(Connection connection, WorkerOptions options)
    : connection_(std::move(connection)),
      options_(std::move(options)),
      stub_(v1::WorkerService::NewStub(connection_.channel)) {
  ReporterOptions reporter;
  reporter.call_timeout = options_.call_timeout;
  reporter.max_backoff = options_.max_backoff;
  reporter.on_fenced = [this](const std::string& job_id, int64_t attempt) {
    absl::MutexLock lock(&mu_);
    StopAssignment(job_id, attempt, StopRequest::kStop);
  };
  reporter.on_worker_unknown = [this](const std::string& id) { OnWorkerUnknown(id); };
  reporter.on_attempt_resolved = [this](const std::string& job_id, int64_t attempt) {
    OnAttemptResolved(job_id, attempt);
  };
  reporter_ = std::make_unique<Reporter>(&connection_, std::move(reporter));
}

bool Worker::AssignmentEntry::finished() const {
  return std::all_of(ranks.begin(), ranks.end(), [](const auto& rank) { return rank->finished; });
}

Worker::~Worker() {
  Shutdown();
  reporter_->Stop();
  std::map<AttemptKey, std::unique_ptr<AssignmentEntry>> assignments;
  {
    absl::MutexLock lock(&mu_);
    // Run has returned (or never ran): a rank still running has nobody left to report to.
    for (auto& [key, entry] : assignments_) {
      for (auto& rank : entry->ranks) rank->process->Kill();
    }
    assignments.swap(assignments_);
  }
  // Joined without the lock, which a rank's serving thread takes as it ends, and before any
  // entry goes: that thread writes into its entry.
  for (auto& [key, entry] : assignments) {
    for (auto& rank : entry->ranks) rank->process->Join();
  }
}

std::string Worker::worker_id() {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

void Worker::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  for (auto& [key, entry] : assignments_) {
    for (auto& rank : entry->ranks) {
      // A cancel already ordered stays: kStop is the stronger order.
      rank->process->Stop(StopRequest::kCheckpointAndStop, /*worker_draining=*/true);
    }
  }
  if (call_context_ != nullptr) call_context_->TryCancel();
  changed_.SignalAll();
}

void Worker::Sleep(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = absl::Now() + delay;
  while (!shutting_down_ && absl::Now() < until) changed_.WaitWithDeadline(&mu_, until);
}

absl::Status Worker::Register() {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_version(options_.version);
  request.mutable_resources()->set_device(options_.device);
  request.mutable_resources()->set_device_count(options_.device_count);
  request.mutable_resources()->set_device_memory_bytes(options_.device_memory_bytes);
  request.mutable_resources()->set_threads(options_.threads);
  grpc::ClientContext context;
  connection_.Prepare(&context, options_.call_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::CancelledError("shutting down");
    call_context_ = &context;
  }
  const absl::Time sent = absl::Now();
  v1::RegisterWorkerResponse response;
  const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    call_context_ = nullptr;
  }
  if (!status.ok()) return FromGrpcStatus(status);
  // Before the id is published: every report made under it carries the secret.
  reporter_->SetWorkerSecret(response.worker_id(), response.worker_secret());
  absl::MutexLock lock(&mu_);
  worker_id_ = response.worker_id();
  worker_secret_ = response.worker_secret();
  registered_ = true;
  if (response.has_heartbeat_interval()) {
    heartbeat_interval_ = FromProtoDuration(response.heartbeat_interval());
  }
  if (response.has_heartbeat_timeout()) {
    heartbeat_timeout_ = FromProtoDuration(response.heartbeat_timeout());
  }
  lease_until_ = sent + heartbeat_timeout_ - heartbeat_interval_;
  heartbeat_now_ = true;
  changed_.SignalAll();
  Log(absl::StrCat("registered as worker ", worker_id_, " (", options_.name, "); heartbeat every ",
                   absl::FormatDuration(heartbeat_interval_)));
  return absl::OkStatus();
}

Connection Worker::RegisteredConnection() const {
  Connection registered = connection_;
  registered.worker_id = worker_id_;
  registered.worker_secret = worker_secret_;
  return registered;
}

absl::Status Worker::Run() {
  std::thread heartbeats([this] { HeartbeatLoop(); });
  Backoff backoff({.initial = kInitialBackoff, .max = options_.max_backoff});
  absl::Status result = absl::OkStatus();
  bool unreachable_logged = false;
  for (;;) {
    bool registered;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) break;
      registered = registered_;
    }
    grpc::Status status = grpc::Status::OK;
    if (!registered) {
      const absl::Status registration = Register();
      if (absl::IsCancelled(registration)) continue;  // Shutdown cut the call
      if (!registration.ok() && !absl::IsUnavailable(registration) &&
          !absl::IsDeadlineExceeded(registration)) {
        result = absl::Status(
            registration.code(),
            absl::StrCat("the coordinator refused the registration: ", registration.message()));
        Shutdown();
        break;
      }
      status = grpc::Status(static_cast<grpc::StatusCode>(registration.code()),
                            std::string(registration.message()));
    } else {
      status = Poll();
    }
    if (status.ok()) {
      if (unreachable_logged) Log("the coordinator answers again");
      unreachable_logged = false;
      backoff.Reset();
      continue;
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      OnWorkerUnknown(worker_id());
      continue;
    }
    if (status.error_code() == grpc::StatusCode::CANCELLED) continue;  // Shutdown cut the poll
    if (!Retryable(status.error_code()) || !unreachable_logged) {
      Log(absl::StrCat("coordinator call failed: ", status.error_message(), "; retrying"));
      unreachable_logged = Retryable(status.error_code());
    }
    Sleep(backoff.Next());
  }

  // Wind down: ranks stop (with a checkpoint, as Shutdown asked), then their reports go out.
  {
    absl::MutexLock lock(&mu_);
    auto all_finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::all_of(assignments_.begin(), assignments_.end(),
                         [](const auto& entry) { return entry.second->finished(); });
    };
    while (!all_finished()) changed_.Wait(&mu_);
  }
  if (!reporter_->Flush(absl::Now() + options_.shutdown_timeout)) {
    Log(absl::StrCat("gave up delivering reports after ",
                     absl::FormatDuration(options_.shutdown_timeout)));
  }
  {
    absl::MutexLock lock(&mu_);
    stop_heartbeats_ = true;
    changed_.SignalAll();
  }
  heartbeats.join();
  SendDrainingHeartbeat();
  if (result.ok() && worker_id().empty()) Log("stopped before registering with the coordinator");
  return result;
}

grpc::Status Worker::Poll() {
  v1::GetAssignmentRequest request;
  grpc::ClientContext context;
  Connection registered;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    request.set_worker_id(worker_id_);
    registered = RegisteredConnection();
    call_context_ = &context;
  }
  ToProtoDuration(options_.poll_wait, request.mutable_wait_timeout());
  registered.Prepare(&context, options_.poll_wait + options_.call_timeout);
  v1::GetAssignmentResponse response;
  const grpc::Status status = stub_->GetAssignment(&context, request, &response);
  absl::MutexLock lock(&mu_);
  call_context_ = nullptr;
  if (!status.ok()) return status;
  for (const v1::AttemptRef& stop : response.cancel()) {
    StopAssignment(stop.job_id(), stop.attempt(), StopRequest::kStop);
  }
  if (response.has_assignment()) StartAssignment(response.assignment());
  return status;
}

void Worker::StartAssignment(const v1::Assignment& assignment) {
  const AttemptKey key(assignment.job_id(), assignment.attempt());
  if (shutting_down_ || assignments_.count(key) != 0) return;  // a repeat of one we run
  // One assignment at a time: the coordinator sends the assignment again once this worker is free.
  for (const auto& [other, entry] : assignments_) {
    if (!entry->finished()) return;
  }
  auto owned = std::make_unique<AssignmentEntry>();
  AssignmentEntry* entry = owned.get();
  entry->assignment = assignment;
  entry->worker_id = worker_id_;
  assignments_.emplace(key, std::move(owned));
  absl::StatusOr<std::vector<LocalRank>> ranks =
      ExpandAssignment(assignment, options_.device, options_.device_count);
  if (!ranks.ok()) {
    // Not this worker's to run (more devices than it has): the attempt fails at once, saying why,
    // instead of a gang that never meets. The entry, with no rank, stays until that end report is
    // delivered, so that a redelivery of the assignment is not refused twice.
    Log(absl::StrCat("refusing job ", assignment.job_id(), " attempt ", assignment.attempt(),
                     " rank ", assignment.rank(), ": ", ranks.status().message()));
    v1::ReportAttemptEndRequest end;
    end.set_worker_id(worker_id_);
    end.set_job_id(assignment.job_id());
    end.set_attempt(assignment.attempt());
    end.set_rank(assignment.rank());
    end.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
    end.set_message(std::string(ranks.status().message()));
    end.set_failure_kind(FailureKindOf(ranks.status()));
    entry->end_reports = 1;
    reporter_->Enqueue(std::move(end));
    return;
  }
  const int32_t first = assignment.rank();
  const int32_t count = static_cast<int32_t>(ranks->size());
  Log(absl::StrCat("starting job ", assignment.job_id(), " (", assignment.spec().name(),
                   ") attempt ", assignment.attempt(), " rank ",
                   count == 1 ? absl::StrCat(first) : absl::StrCat(first, "..", first + count - 1),
                   "/", assignment.world_size(),
                   options_.device == v1::ResourceConfig::CUDA
                       ? absl::StrCat(" on ", ranks->front().device.DebugString(),
                                      count == 1 ? "" : absl::StrCat("..", count - 1))
                       : "",
                   assignment.resume_checkpoint().empty()
                       ? ""
                       : absl::StrCat(", resuming from ", assignment.resume_checkpoint())));
  // The coordinator takes one end report per worker and attempt, from its first rank: a single
  // rank's own end report goes as it is; several are combined once the last of them has ended.
  // Only the first reports checkpoints (RankEnvironment::reports_checkpoints).
  entry->end_reports = 1;
  for (LocalRank& local : *ranks) {
    rank::RankStart start;
    start.set_worker_id(worker_id_);
    start.set_threads(options_.threads);
    start.set_comm_host(options_.comm_host);
    ToProtoDuration(options_.comm_timeout, start.mutable_comm_timeout());
    for (const std::string& root : options_.data_roots) start.add_data_roots(root);
    start.set_memory_limit_bytes(options_.memory_limit_bytes);
    start.set_stop_after_step(options_.stop_after_step);
    start.set_cuda(local.device.type == DeviceType::kCuda);
    start.set_cuda_device(local.device.index);
    start.set_reports_checkpoints(local.assignment.rank() == first);
    start.set_log(LogEnabled().load());
    RankProcessHooks hooks;
    hooks.report = [this](Reporter::Report report) { reporter_->Enqueue(std::move(report)); };
    hooks.may_write_checkpoints = [this] { return MayWriteCheckpoints(); };
    if (assignment.world_size() > 1) {
      // The rendezvous calls carry the worker's identity.
      hooks.rendezvous = std::make_shared<CoordinatorKeyValueStore>(
          RegisteredConnection(), assignment.job_id(), assignment.attempt());
    }
    hooks.metrics = options_.metrics;
    auto owned_rank = std::make_unique<RankEntry>();
    RankEntry* rank = owned_rank.get();
    entry->ranks.push_back(std::move(owned_rank));
    // On the rank's serving thread, once its process is gone; it waits for mu_, which this
    // function holds, so `rank->process` is set before it runs.
    hooks.on_exit = [this, entry, rank, first, count](v1::ReportAttemptEndRequest end,
                                                      bool reported) {
      // A rank that ended at stop_after_step ended draining: the worker winds down.
      if (end.worker_draining()) Shutdown();
      absl::MutexLock lock(&mu_);
      if (!reported) {
        // A rank that died took the gang's collectives with it: its siblings here would only
        // wait out --comm-timeout in them before failing too (torchrun's agent, likewise, ends
        // every worker when one fails).
        for (auto& sibling : entry->ranks) {
          if (sibling.get() != rank && !sibling->finished) sibling->process->Kill();
        }
      }
      // Queued before the rank counts as finished: Run's wind-down flushes the reporter once every
      // rank has finished and must find it there. Enqueue only queues (the reporter calls back
      // from its own thread, unlocked), so calling it under mu_ is safe.
      if (count == 1) {
        reporter_->Enqueue(std::move(end));
      } else {
        entry->rank_ends.push_back(std::move(end));
        if (static_cast<int32_t>(entry->rank_ends.size()) == count) {
          reporter_->Enqueue(CombineRankEnds(first, entry->rank_ends));
        }
      }
      rank->finished = true;
      changed_.SignalAll();
    };
    *start.mutable_assignment() = std::move(local.assignment);
    rank->process =
        std::make_unique<RankProcess>(options_.rank_executable, std::move(start), std::move(hooks));
  }
  // Tell the coordinator at once that the ranks started.
  heartbeat_now_ = true;
  changed_.SignalAll();
}

void Worker::StopAssignment(const std::string& job_id, int64_t attempt, StopRequest request) {
  auto it = assignments_.find(AttemptKey(job_id, attempt));
  if (it == assignments_.end()) return;
  bool changed = false;
  for (auto& rank : it->second->ranks) {
    if (rank->finished) continue;
    changed |= rank->process->Stop(request, /*worker_draining=*/false);
  }
  if (changed) {
    Log(absl::StrCat("stopping job ", job_id, " attempt ", attempt,
                     request == StopRequest::kStop ? " (cancelled)" : " (checkpoint first)"));
  }
}

void Worker::OnWorkerUnknown(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (id.empty() || id != worker_id_ || !registered_) return;
  Log(absl::StrCat("the coordinator no longer knows worker ", id,
                   ": stopping its ranks (they were given away) and registering again"));
  registered_ = false;
  for (auto& [key, entry] : assignments_) {
    if (entry->worker_id == id) StopAssignment(key.first, key.second, StopRequest::kStop);
  }
  changed_.SignalAll();
}

void Worker::OnAttemptResolved(const std::string& job_id, int64_t attempt) {
  std::unique_ptr<AssignmentEntry> done;
  {
    absl::MutexLock lock(&mu_);
    auto it = assignments_.find(AttemptKey(job_id, attempt));
    if (it == assignments_.end()) return;
    // One end report per rank: the assignment is over when the last of them is resolved.
    if (++it->second->resolved < it->second->end_reports) return;
    done = std::move(it->second);
    assignments_.erase(it);
    changed_.SignalAll();
  }
  // The end reports were the ranks' last acts: their serving threads are ending.
  for (auto& rank : done->ranks) rank->process->Join();
}

absl::Status Worker::MayWriteCheckpoints() {
  absl::MutexLock lock(&mu_);
  if (absl::Now() <= lease_until_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "no heartbeat has reached the coordinator for more than ",
      absl::FormatDuration(heartbeat_timeout_ - heartbeat_interval_),
      ": the job may run on another worker by now, so this one keeps out of its directory"));
}

void Worker::SendDrainingHeartbeat() {
  v1::HeartbeatRequest request;
  Connection registered;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return;
    request.set_worker_id(worker_id_);
    registered = RegisteredConnection();
  }
  request.set_draining(true);
  grpc::ClientContext context;
  registered.Prepare(&context, absl::Seconds(2));
  v1::HeartbeatResponse response;
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) {
    Log(absl::StrCat("could not tell the coordinator that this worker drains: ",
                     status.error_message()));
  }
}

void Worker::HeartbeatLoop() {
  absl::Time next = absl::Now();
  bool failing = false;
  for (;;) {
    v1::HeartbeatRequest request;
    absl::Duration interval;
    Connection registered;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_heartbeats_ && !heartbeat_now_ && absl::Now() < next) {
        changed_.WaitWithDeadline(&mu_, next);
      }
      if (stop_heartbeats_) return;
      heartbeat_now_ = false;
      interval = heartbeat_interval_;
      next = absl::Now() + interval;
      if (!registered_) continue;
      request.set_worker_id(worker_id_);
      registered = RegisteredConnection();
      // One entry per assignment, as its first rank (the one the coordinator gave this worker):
      // the coordinator stops any rank it did not give. The ranks step together.
      for (const auto& [key, entry] : assignments_) {
        if (entry->worker_id != worker_id_ || entry->ranks.empty()) continue;
        v1::RunningAttempt* running = request.add_running();
        running->set_job_id(key.first);
        running->set_attempt(key.second);
        running->set_rank(entry->assignment.rank());
        running->set_step(entry->ranks.front()->process->step());
      }
    }
    grpc::ClientContext context;
    registered.Prepare(&context,
                       std::min(options_.call_timeout, std::max(interval, absl::Seconds(1))));
    const absl::Time sent = absl::Now();
    v1::HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      OnWorkerUnknown(request.worker_id());
      continue;
    }
    if (!status.ok()) {
      if (!failing) Log(absl::StrCat("heartbeat failed: ", status.error_message()));
      failing = true;
      continue;
    }
    if (failing) Log("heartbeats reach the coordinator again");
    failing = false;
    absl::MutexLock lock(&mu_);
    if (request.worker_id() == worker_id_) {
      lease_until_ = std::max(lease_until_, sent + heartbeat_timeout_ - heartbeat_interval_);
    }
    for (const v1::AttemptRef& stop : response.cancel()) {
      StopAssignment(stop.job_id(), stop.attempt(), StopRequest::kStop);
    }
  }
}

}  // namespace moetrain
