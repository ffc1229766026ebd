// The fleet's side of the per-attempt rendezvous (KvSet, KvGet, KvWait): only a worker holding a
// rank of the job's current attempt may use its map, which FleetRendezvous keeps (bounded per
// attempt and in all) and which goes with its attempt, however the attempt ends.
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
  return entry;
}

int64_t Fleet::KvBytes() { return kv_.Bytes(); }

absl::Status Fleet::KvSet(absl::string_view worker_id, absl::string_view job_id, int64_t attempt,
                          absl::string_view key, absl::string_view value) {
  // A malformed key or value is InvalidArgument whoever sends it.
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckKey(key));
  MOETRAIN_RETURN_IF_ERROR(FleetRendezvous::CheckValue(value));
  absl::MutexLock lock(&mu_);
  MOETRAIN_RETURN_IF_ERROR(FindKvAttempt(worker_id, job_id, attempt).status());
  return kv_.Set(job_id, attempt, key, value);
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
  const absl::Time deadline =
      timeout > absl::ZeroDuration() ? absl::Now() + timeout : absl::InfiniteFuture();
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
                                                      absl::FormatDuration(timeout)));
    }
    if (is_cancelled && is_cancelled()) {
      return absl::CancelledError("the caller stopped waiting");
    }
    // Without the fleet's lock: a Set, the attempt's end or Stop wakes it.
    kv_.Await(job_id, attempt, key, std::min(deadline, now + kCancelCheck));
  }
}

}  // namespace moetrain::server
