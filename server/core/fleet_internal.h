// The fleet's in-memory records, shared by fleet.cc (the calls of workers and clients),
// fleet_control.cc (the control loop and the life of attempts), fleet_delete.cc, fleet_kv.cc and
// fleet_workers.cc.
// Internal to server/core.
#ifndef MOETRAIN_SERVER_CORE_FLEET_INTERNAL_H_
#define MOETRAIN_SERVER_CORE_FLEET_INTERNAL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "moetrain/v1/worker.pb.h"
#include "server/core/fleet.h"

namespace moetrain::server {

// The rank a worker was given, from assignment to the end it reports.
struct Fleet::Slot {
  v1::Assignment assignment;  // job_id, attempt, rank, ... as delivered
  absl::Time assigned_at;
  bool delivered = false;  // a poll returned it (it may be sent again until the rank starts)
  absl::Time delivered_at;
  bool started = false;    // seen in a heartbeat or a report
  bool stopping = false;   // told to stop; the worker stays busy until the rank is gone
  bool stop_sent = false;  // the stop order went out on a poll (heartbeats repeat it anyway)

  bool Is(absl::string_view job_id, int64_t attempt) const {
    return assignment.job_id() == job_id && assignment.attempt() == attempt;
  }
};

struct Fleet::WorkerEntry {
  std::string id;
  std::string name;
  std::string version;
  v1::WorkerResources resources;
  // SHA-256 of the secret issued at registration; empty for a worker stored before secrets.
  std::string secret_sha256;
  bool lost = false;
  // Known from the store after a coordinator restart, not heard from since: it has the longer of
  // heartbeat_timeout and reconcile_grace to reconnect (its channel backs off while we were away).
  bool reloaded = false;
  absl::Time last_heartbeat;  // for a lost worker: when it was declared lost
  std::optional<Slot> slot;
  // It stopped a rank on its own (SIGTERM): it is shutting down, so no new rank goes to it.
  bool draining = false;
  // Who registered it, as the transport names the client (its address without the port); empty
  // for an in-process caller, and for a worker reloaded from the store.
  std::string client;
  // It has sent a heartbeat since it registered (kept in the store): it did work, so it is
  // remembered for forget_lost_after once lost, not only forget_never_heartbeated_after.
  bool heartbeated = false;
  // GetAssignment calls so far; a waiting call whose number is not the latest returns, so the
  // worker has one long poll at most.
  int64_t polls = 0;
  // KvWait calls in flight: at most one per rank the worker runs.
  int32_t kv_waits = 0;
};

// The live attempt of a SCHEDULED or RUNNING job. Gang members are indexed 0..n-1; member i
// runs ranks [i·devices_per_worker, (i+1)·devices_per_worker).
struct Fleet::AttemptEntry {
  std::string job_id;
  int32_t attempt = 0;
  int32_t devices_per_worker = 1;
  int64_t max_restarts = 0;
  int64_t total_steps = 0;           // spec.train.steps: the last step a report may name
  std::vector<std::string> workers;  // by member
  std::vector<bool> started;         // by member
  std::vector<bool> succeeded;       // by member
  // Rank 0's newest accepted step report; one at or below it is refused (a retried call).
  int64_t last_step = 0;
  // tokens_seen at the newest report (or of the checkpoint the attempt resumed from), to turn
  // the cumulative count into increments for moetrain_train_tokens_total.
  int64_t last_tokens_seen = 0;
  std::map<int64_t, std::set<int32_t>> checkpoint_members;  // step → members that reported it

  int32_t world_size() const { return static_cast<int32_t>(workers.size()) * devices_per_worker; }
  // The member running `rank`, or -1 when the rank is out of range.
  int32_t MemberOf(int64_t rank) const {
    if (rank < 0 || rank >= world_size()) return -1;
    return static_cast<int32_t>(rank / devices_per_worker);
  }
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_CORE_FLEET_INTERNAL_H_
