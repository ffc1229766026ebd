// FleetRendezvous (fleet_rendezvous.h): the key/value maps of the live attempts.
#include "server/core/fleet_rendezvous.h"

#include <malloc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain::server {
namespace {

// Freed rendezvous bytes worth handing back to the system at once.
constexpr int64_t kTrimAfterFreeing = int64_t{16} << 20;

}  // namespace

absl::Status FleetRendezvous::CheckKey(absl::string_view key) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key has ", key.size(), " bytes; a key has 1 to ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status FleetRendezvous::CheckValue(absl::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value has ", value.size(), " bytes, more than ", kMaxValueBytes));
  }
  return absl::OkStatus();
}

void FleetRendezvous::Open(absl::string_view job_id, int64_t attempt) {
  absl::MutexLock lock(&mu_);
  AttemptMap& map = maps_[std::string(job_id)];
  bytes_ -= map.bytes;
  map = AttemptMap();
  map.attempt = attempt;
  changed_.SignalAll();
}

void FleetRendezvous::Close(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  auto it = maps_.find(job_id);
  if (it == maps_.end()) return;
  bytes_ -= it->second.bytes;
  maps_.erase(it);
  changed_.SignalAll();
}

void FleetRendezvous::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  changed_.SignalAll();
}

absl::StatusOr<FleetRendezvous::AttemptMap*> FleetRendezvous::Find(absl::string_view job_id,
                                                                   int64_t attempt) {
  auto it = maps_.find(job_id);
  if (it == maps_.end() || it->second.attempt != attempt) {
    return absl::FailedPreconditionError(
        absl::StrCat("attempt ", attempt, " of job ", job_id, " has no open rendezvous"));
  }
  return &it->second;
}

absl::Status FleetRendezvous::Set(absl::string_view job_id, int64_t attempt, absl::string_view key,
                                  absl::string_view value) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  MOETRAIN_RETURN_IF_ERROR(CheckValue(value));
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptMap * map, Find(job_id, attempt));
  auto it = map->values.find(key);
  const int64_t replaced =
      it == map->values.end() ? 0 : static_cast<int64_t>(it->first.size() + it->second.size());
  const int64_t growth = static_cast<int64_t>(key.size() + value.size()) - replaced;
  const std::string where = absl::StrCat("attempt ", attempt, " of job ", job_id);
  if (it == map->values.end() &&
      static_cast<int64_t>(map->values.size()) >= limits_.max_keys_per_attempt) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of ", where, " holds ", map->values.size(),
        " keys, the most an attempt may hold (kv_max_keys_per_attempt); key '", key, "' is new"));
  }
  if (map->bytes + growth > limits_.max_bytes_per_attempt) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous of ", where, " would hold ", map->bytes + growth,
                     " bytes of keys and values, more than the ", limits_.max_bytes_per_attempt,
                     " an attempt may hold (kv_max_bytes_per_attempt)"));
  }
  if (bytes_ + growth > limits_.max_bytes_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of all attempts would hold ", bytes_ + growth, " bytes, more than the ",
        limits_.max_bytes_total, " the coordinator allows (kv_max_bytes_total)"));
  }
  map->values.insert_or_assign(std::string(key), std::string(value));
  map->bytes += growth;
  bytes_ += growth;
  bytes_peak_ = std::max(bytes_peak_, bytes_);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> FleetRendezvous::Get(absl::string_view job_id,
                                                                int64_t attempt,
                                                                absl::string_view key) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptMap * map, Find(job_id, attempt));
  auto it = map->values.find(key);
  if (it == map->values.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

void FleetRendezvous::Await(absl::string_view job_id, int64_t attempt, absl::string_view key,
                            absl::Time until) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (shut_down_) return;
    absl::StatusOr<AttemptMap*> map = Find(job_id, attempt);
    if (!map.ok() || (*map)->values.find(key) != (*map)->values.end()) return;
    // WaitWithDeadline is true at `until`.
    if (changed_.WaitWithDeadline(&mu_, until)) return;
  }
}

int64_t FleetRendezvous::Bytes() {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

void FleetRendezvous::TrimFreedMemory() {
  {
    absl::MutexLock lock(&mu_);
    if (bytes_peak_ - bytes_ < kTrimAfterFreeing) return;
    bytes_peak_ = bytes_;
  }
  // Outside the lock: trimming a large heap takes a while, and a Set need not wait for it.
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace moetrain::server
