// The per-attempt rendezvous (KvSet, KvGet, KvWait): how the ranks of a gang find each other. Only
// a worker holding a rank of the attempt may use it; its size is bounded per attempt and in all,
// and it goes with its attempt (the AttemptEntry that holds it is erased however the attempt
// ends).
#include <malloc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"

namespace moetrain::server {
namespace {

constexpr size_t kMaxKeyBytes = 256;
constexpr size_t kMaxValueBytes = 1 << 20;
// How often a KvWait asks whether its caller went away (as GetAssignment does).
constexpr absl::Duration kCancelCheck = absl::Milliseconds(200);
// Freed rendezvous bytes worth handing back to the system at once.
constexpr int64_t kTrimAfterFreeing = int64_t{16} << 20;

absl::Status CheckKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", key.size(), " bytes; a key has 1 to ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

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

int64_t Fleet::KvBytesLocked() const {
  int64_t bytes = 0;
  for (const auto& [job_id, attempt] : attempts_) bytes += attempt->kv_bytes;
  return bytes;
}

int64_t Fleet::KvBytes() {
  absl::MutexLock lock(&mu_);
  return KvBytesLocked();
}

void Fleet::TrimFreedKvMemory() {
  const int64_t held = KvBytesLocked();
  if (kv_bytes_peak_ - held < kTrimAfterFreeing) return;
  kv_bytes_peak_ = held;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

absl::Status Fleet::KvSet(absl::string_view worker_id, absl::string_view job_id, int64_t attempt,
                          absl::string_view key, absl::string_view value) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value has ", value.size(), " bytes, more than ", kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindKvAttempt(worker_id, job_id, attempt));
  auto it = entry->kv.find(key);
  const int64_t replaced =
      it == entry->kv.end() ? 0 : static_cast<int64_t>(it->first.size() + it->second.size());
  const int64_t growth = static_cast<int64_t>(key.size() + value.size()) - replaced;
  const std::string where = absl::StrCat("attempt ", attempt, " of job ", job_id);
  if (it == entry->kv.end() &&
      static_cast<int64_t>(entry->kv.size()) >= options_.kv_max_keys_per_attempt) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of ", where, " holds ", entry->kv.size(),
        " keys, the most an attempt may hold (kv_max_keys_per_attempt); key '", key, "' is new"));
  }
  if (entry->kv_bytes + growth > options_.kv_max_bytes_per_attempt) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous of ", where, " would hold ", entry->kv_bytes + growth,
                     " bytes of keys and values, more than the ", options_.kv_max_bytes_per_attempt,
                     " an attempt may hold (kv_max_bytes_per_attempt)"));
  }
  const int64_t total = KvBytesLocked();
  if (total + growth > options_.kv_max_bytes_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of all attempts would hold ", total + growth, " bytes, more than the ",
        options_.kv_max_bytes_total, " the coordinator allows (kv_max_bytes_total)"));
  }
  entry->kv.insert_or_assign(std::string(key), std::string(value));
  entry->kv_bytes += growth;
  kv_bytes_peak_ = std::max(kv_bytes_peak_, total + growth);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> Fleet::KvGet(absl::string_view worker_id,
                                                        absl::string_view job_id, int64_t attempt,
                                                        absl::string_view key) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindKvAttempt(worker_id, job_id, attempt));
  auto it = entry->kv.find(key);
  if (it == entry->kv.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::StatusOr<std::string> Fleet::KvWait(absl::string_view worker_id, absl::string_view job_id,
                                          int64_t attempt, absl::string_view key,
                                          absl::Duration timeout,
                                          const std::function<bool()>& is_cancelled) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  const absl::Time deadline =
      timeout > absl::ZeroDuration() ? absl::Now() + timeout : absl::InfiniteFuture();
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Looked up on every round: the attempt may end while this call waits.
    MOETRAIN_ASSIGN_OR_RETURN(AttemptEntry * entry, FindKvAttempt(worker_id, job_id, attempt));
    auto it = entry->kv.find(key);
    if (it != entry->kv.end()) return it->second;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("key '", key, "' of attempt ", attempt,
                                                      " of job ", job_id, " was not set within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (is_cancelled && is_cancelled()) {
      return absl::CancelledError("the caller stopped waiting");
    }
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + kCancelCheck));
  }
}

}  // namespace moetrain::server
