// FleetRendezvous (fleet_rendezvous.h): the key/value maps of the live attempts.
#include "server/core/fleet_rendezvous.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain::server {
namespace {

// Freed rendezvous bytes worth handing back to the system at once.
constexpr int64_t kTrimAfterFreeing = int64_t{16} << 20;

constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

// min(per_rank × ranks, cap), without overflowing.
int64_t Scaled(int64_t per_rank, int64_t ranks, int64_t cap) {
  if (ranks <= 0) return 0;
  return per_rank > cap / ranks ? cap : std::min(cap, per_rank * ranks);
}

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

void FleetRendezvous::Release(const std::string& key, const Entry& entry) {
  auto it = usage_.find(entry.worker);
  if (it == usage_.end()) return;
  it->second.keys -= 1;
  it->second.bytes -= static_cast<int64_t>(key.size() + entry.value.size());
  if (it->second.keys <= 0) usage_.erase(it);
}

void FleetRendezvous::Drop(const AttemptMap& map) {
  for (const auto& [key, entry] : map.values) Release(key, entry);
  bytes_ -= map.bytes;
}

void FleetRendezvous::Open(absl::string_view job_id, int64_t attempt, int64_t world_size) {
  absl::MutexLock lock(&mu_);
  AttemptMap& map = maps_[std::string(job_id)];
  Drop(map);
  map = AttemptMap();
  map.attempt = attempt;
  map.world_size = world_size;
  changed_.SignalAll();
}

void FleetRendezvous::Close(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  auto it = maps_.find(job_id);
  if (it == maps_.end()) return;
  Drop(it->second);
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
                                  absl::string_view value, absl::string_view worker,
                                  int64_t worker_ranks) {
  MOETRAIN_RETURN_IF_ERROR(CheckKey(key));
  MOETRAIN_RETURN_IF_ERROR(CheckValue(value));
  absl::MutexLock lock(&mu_);
  MOETRAIN_ASSIGN_OR_RETURN(AttemptMap * map, Find(job_id, attempt));
  auto it = map->values.find(key);
  const bool is_new = it == map->values.end();
  const int64_t size = static_cast<int64_t>(key.size() + value.size());
  const int64_t replaced =
      is_new ? 0 : static_cast<int64_t>(it->first.size() + it->second.value.size());
  const int64_t growth = size - replaced;
  const std::string where = absl::StrCat("attempt ", attempt, " of job ", job_id);

  // The worker's own keys, as they would be: a key it replaces is its own already or not.
  Usage mine;
  if (auto found = usage_.find(worker); found != usage_.end()) mine = found->second;
  const bool own = !is_new && it->second.worker == worker;
  const int64_t worker_keys = mine.keys + (own ? 0 : 1);
  const int64_t worker_bytes = mine.bytes + size - (own ? replaced : 0);
  const int64_t worker_max_keys = Scaled(limits_.max_keys_per_rank, worker_ranks, kUnbounded);
  const int64_t worker_max_bytes = Scaled(limits_.max_bytes_per_rank, worker_ranks, kUnbounded);
  if (worker_keys > worker_max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker ", worker, " holds ", mine.keys, " rendezvous keys, the most a worker of ",
        worker_ranks, " rank(s) may hold (", limits_.max_keys_per_rank,
        " per rank, kv_max_keys_per_rank); key '", key, "' of ", where, " would be one more"));
  }
  if (worker_bytes > worker_max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("worker ", worker, " would hold ", worker_bytes,
                     " bytes of rendezvous keys and values, more than the ", worker_max_bytes,
                     " a worker of ", worker_ranks, " rank(s) may hold (",
                     limits_.max_bytes_per_rank, " per rank, kv_max_bytes_per_rank)"));
  }
  // The attempt's bounds grow with its world, up to the absolute ones.
  const int64_t max_keys =
      Scaled(limits_.max_keys_per_rank, map->world_size, limits_.max_keys_per_attempt);
  const int64_t max_bytes =
      Scaled(limits_.max_bytes_per_rank, map->world_size, limits_.max_bytes_per_attempt);
  if (is_new && static_cast<int64_t>(map->values.size()) >= max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of ", where, " holds ", map->values.size(),
        " keys, the most an attempt of ", map->world_size, " ranks may hold (",
        limits_.max_keys_per_rank, " per rank, kv_max_keys_per_rank, and at most ",
        limits_.max_keys_per_attempt, ", kv_max_keys_per_attempt); key '", key, "' is new"));
  }
  if (map->bytes + growth > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the rendezvous of ", where, " would hold ", map->bytes + growth,
                     " bytes of keys and values, more than the ", max_bytes, " an attempt of ",
                     map->world_size, " ranks may hold (", limits_.max_bytes_per_rank,
                     " per rank, kv_max_bytes_per_rank, and at most ",
                     limits_.max_bytes_per_attempt, ", kv_max_bytes_per_attempt)"));
  }
  if (bytes_ + growth > limits_.max_bytes_total) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the rendezvous of all attempts would hold ", bytes_ + growth, " bytes, more than the ",
        limits_.max_bytes_total, " the coordinator allows (kv_max_bytes_total)"));
  }
  if (!is_new) Release(it->first, it->second);
  Usage& usage = usage_[std::string(worker)];
  usage.keys += 1;
  usage.bytes += size;
  map->values.insert_or_assign(std::string(key), Entry{std::string(value), std::string(worker)});
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
  return std::optional<std::string>(it->second.value);
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
