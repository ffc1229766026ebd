// The fleet's side of the per-attempt rendezvous (KvSet, KvGet, KvWait): only a worker holding a
// rank of the job's current attempt of more than one rank may use its map, which FleetRendezvous
// keeps (bounded per worker, per attempt and in all) and which goes with its attempt, however
// the attempt ends. A worker waits in one KvWait per rank at most, so that its waits cannot take
// the server's threads from the others.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"

namespace moetrain::server {
namespace {

// How often a KvWait asks whether its caller went away (as GetAssignment does).
constexpr absl::Duration kCancelCheck = absl::Milliseconds(200);

}  // namespace

absl::StatusOr<Fleet::AttemptEntry*> Fleet::FindKvAttempt(absl::string_view worker_id,
                                                          absl::string_view job_id,
                                                          int64_t attempt) {
  MOETRAIN_ASSIGN_OR_RETURN(WorkerEntry * worker, FindWorker(worker_id));
  MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindCurrentAttempt(job_id, attempt));
  const bool member =
      std::find(entry->workers.begin(), entry->workers.end(), worker_id) != entry->workers.end();
  if (!member || !worker->slot.has_value() || !worker->slot->Is(job_id, attempt)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", worker_id, " holds no rank of attempt ", attempt, " of job ", job_id));
  }
  // Its rank runs alone (the worker's communicator makes no store for one rank): nothing to meet,
  // and the keys would take from the attempts that need them.
  if (entry->world_size() < 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of job ", job_id,
                     " has one rank, which needs no rendezvous: its world_size is 1"));
  }
  return entry;
}

int64_t Fleet::KvBytes() { return kv_.Bytes(); }

absl::Status Fleet::KvSet(absl::string_view worker_id, absl::string_view job_id, int64_t attempt,
                          absl::string_view key, absl::string_view value) {
  // A malformed key or value is InvalidArgument whoever sends it.
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckKey(key));
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckValue(value));
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindKvAttempt(worker_id, job_id, attempt));
  return kv_.Set(job_id, attempt, key, value, worker_id, entry->devices_per_worker);
}

absl::StatusOr<std::optional<std::string>> Fleet::KvGet(absl::string_view worker_id,
                                                        absl::string_view job_id, int64_t attempt,
                                                        absl::string_view key) {
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckKey(key));
  absl::MutexLock lock(&mu_);
  MOETRAIN_RETURN_IF_ERROR(FindKvAttempt(worker_id, job_id, attempt).status());
  return kv_.Get(job_id, attempt, key);
}

absl::StatusOr<std::string> Fleet::KvWait(absl::string_view worker_id, absl::string_view job_id,
                                          int64_t attempt, absl::string_view key,
                                          absl::Duration timeout,
                                          const std::function<bool()>& is_cancelled) {
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckKey(key));
  // Every wait ends: one without a deadline would hold a server thread for as long as its
  // caller liked.
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout = ", absl::FormatDuration(timeout), ": KvWait needs a timeout above 0 (at most ",
        absl::FormatDuration(options_.max_kv_wait), "; a longer one is cut to it)"));
  }
  const absl::Duration wait = std::min(timeout, options_.max_kv_wait);
  const absl::Time deadline = absl::Now() + wait;
  {
    absl::MutexLock lock(&mu_);
    MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindKvAttempt(worker_id, job_id, attempt));
    WorkerEntry& worker = *workers_.find(worker_id)->second;  // FindKvAttempt found it
    if (worker.kv_waits >= entry->devices_per_worker) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker ", worker_id, " has ", worker.kv_waits,
                       " KvWait calls in flight already, one "
                       "per rank it runs of attempt ",
                       attempt, " of job ", job_id, "; retry once one returns"));
    }
    ++worker.kv_waits;
  }
  absl::StatusOr<std::string> value =
      AwaitKey(worker_id, job_id, attempt, key, deadline, wait, is_cancelled);
  absl::MutexLock lock(&mu_);
  // The worker may have been forgotten meanwhile; ids are never reused.
  if (auto it = workers_.find(worker_id); it != workers_.end()) --it->second->kv_waits;
  return value;
}

absl::StatusOr<std::string> Fleet::AwaitKey(absl::string_view worker_id, absl::string_view job_id,
                                            int64_t attempt, absl::string_view key,
                                            absl::Time deadline, absl::Duration wait,
                                            const std::function<bool()>& is_cancelled) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Looked up on every round: the attempt may end, or the worker lose its rank, meanwhile.
      MOETRAIN_RETURN_IF_ERROR(FindKvAttempt(worker_id, job_id, attempt).status());
      MOETRAIN_ASSIGN_OR_RETURN(std::optional<std::string> value, kv_.Get(job_id, attempt, key));
      if (value.has_value()) return *std::move(value);
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' of attempt ", attempt,
                                                      " of job ", job_id, " was not set within ",
                                                      absl::FormatDuration(wait)));
    }
    if (is_cancelled && is_cancelled()) {
      return absl::CancelledError("the caller stopped waiting");
    }
    // Without the fleet's lock: a Set, the attempt's end or Stop wakes it.
    kv_.Await(job_id, attempt, key, std::min(deadline, now + kCancelCheck));
  }
}

}  // namespace moetrain::server
