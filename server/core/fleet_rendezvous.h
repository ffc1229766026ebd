// The rendezvous of the fleet's live attempts: one key/value map per attempt, through which the
// ranks of a gang find each other (rank 0's address, a communicator's unique id). Its size is
// bounded per worker (by the ranks it runs), per attempt (by its world size, and absolutely) and
// in all, so that no worker and no attempt can take what the others need; an attempt's keys go
// when it closes. Who may use an
// attempt's map is the fleet's business (Fleet::KvSet and the others check it first); this class
// keeps the maps.
//
// Thread-safe, with its own mutex, so that Await blocks without the fleet's lock. The fleet calls
// the others under its lock: that lock first, then this one, never the other way round.
#ifndef MOETRAIN_SERVER_CORE_FLEET_RENDEZVOUS_H_
#define MOETRAIN_SERVER_CORE_FLEET_RENDEZVOUS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace moetrain::server {

// The bounds of FleetOptions::kv_max_*, under those names in the errors. A worker may hold the
// per-rank allowance times the ranks it runs, an attempt that allowance times its world size,
// and never more than the per-attempt bounds.
struct RendezvousLimits {
  int64_t max_keys_per_rank = 64;
  int64_t max_bytes_per_rank = int64_t{2} << 20;  // keys and values
  int64_t max_keys_per_attempt = 1024;
  int64_t max_bytes_per_attempt = int64_t{64} << 20;  // keys and values of one attempt
  int64_t max_bytes_total = int64_t{256} << 20;       // of all attempts together
};

class FleetRendezvous {
 public:
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = size_t{1} << 20;

  explicit FleetRendezvous(RendezvousLimits limits) : limits_(limits) {}
  FleetRendezvous(const FleetRendezvous&) = delete;
  FleetRendezvous& operator=(const FleetRendezvous&) = delete;

  // InvalidArgument for a key that is empty or over kMaxKeyBytes, a value over kMaxValueBytes.
  static absl::Status CheckKey(absl::string_view key);
  static absl::Status CheckValue(absl::string_view value);

  // Attempt `attempt` of the job, of `world_size` ranks, starts with an empty map, which replaces
  // the map of the job's previous attempt, if it still had one.
  void Open(absl::string_view job_id, int64_t attempt, int64_t world_size);
  // The job's attempt is over: its keys go, and Await calls about it return.
  void Close(absl::string_view job_id);
  // Makes every Await return, now and from now on (the fleet is stopping).
  void Shutdown();

  // Set replaces the value of a key that is set already; the key counts against `worker`, which
  // runs `worker_ranks` ranks of the attempt, from then on. Both are FailedPrecondition for an
  // attempt that is not open, InvalidArgument as CheckKey and CheckValue say; Set is
  // ResourceExhausted when the key would pass a limit (nothing is stored then).
  absl::Status Set(absl::string_view job_id, int64_t attempt, absl::string_view key,
                   absl::string_view value, absl::string_view worker, int64_t worker_ranks);
  // The key's value, or nullopt when it is not set.
  absl::StatusOr<std::optional<std::string>> Get(absl::string_view job_id, int64_t attempt,
                                                 absl::string_view key);
  // Returns once `key` of the attempt is set, the attempt is not open (closed, or replaced by
  // another), Shutdown was called, or at `until`, whichever comes first; Get tells which.
  void Await(absl::string_view job_id, int64_t attempt, absl::string_view key, absl::Time until);

  // Bytes of keys and values that the maps of all open attempts hold.
  int64_t Bytes();
  // Hands the heap pages of freed values back to the system once enough were freed since the
  // last time (the allocator keeps them otherwise). The fleet's control loop calls it.
  void TrimFreedMemory();

 private:
  struct Entry {
    std::string value;
    std::string worker;  // who set it
  };
  struct AttemptMap {
    int64_t attempt = 0;
    int64_t world_size = 1;
    std::map<std::string, Entry, std::less<>> values;
    int64_t bytes = 0;  // of its keys and values
  };
  // What one worker's keys hold, over every open map.
  struct Usage {
    int64_t keys = 0;
    int64_t bytes = 0;
  };

  // The map of the job's attempt `attempt`, or FailedPrecondition.
  absl::StatusOr<AttemptMap*> Find(absl::string_view job_id, int64_t attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `key` off the usage of the worker that set it (it is being replaced or dropped).
  void Release(const std::string& key, const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every key of `map` from the totals.
  void Drop(const AttemptMap& map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RendezvousLimits limits_;
  absl::Mutex mu_;
  // Signalled on every Set, Close, Open and Shutdown.
  absl::CondVar changed_;
  std::map<std::string, AttemptMap, std::less<>> maps_ ABSL_GUARDED_BY(mu_);  // by job id
  std::map<std::string, Usage, std::less<>> usage_ ABSL_GUARDED_BY(mu_);      // by worker id
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;                                    // of all maps
  // The most bytes held since the heap was last trimmed.
  int64_t bytes_peak_ ABSL_GUARDED_BY(mu_) = 0;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_FLEET_RENDEZVOUS_H_
