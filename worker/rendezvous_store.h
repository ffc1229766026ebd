// The coordinator's per-attempt key/value API as a KeyValueStore: how the ranks of a gang find
// each other (the Gloo store, the NCCL unique id). Keys are scoped to one job attempt, so the
// ranks of a restarted gang never read what an earlier attempt left behind.
#ifndef MOETRAIN_WORKER_RENDEZVOUS_STORE_H_
#define MOETRAIN_WORKER_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "engine/comm/communicator.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/worker.grpc.pb.h"

namespace moetrain {

class CoordinatorKeyValueStore : public KeyValueStore {
 public:
  // `connection` carries the worker's id and secret (Connection::worker_id, worker_secret): the
  // coordinator serves the rendezvous of an attempt only to the workers that hold its ranks.
  CoordinatorKeyValueStore(Connection connection, std::string job_id, int64_t attempt);

  // Retries an unreachable coordinator with backoff for up to set_timeout.
  absl::Status Set(const std::string& key, const std::string& value) override;
  // Long-polls the coordinator (KvWait) until the key is set or `timeout` passes, riding out an
  // unreachable coordinator; FailedPrecondition once the attempt is over.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

  absl::Duration set_timeout = absl::Seconds(60);

 private:
  std::string Describe(const std::string& key) const;

  Connection connection_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string job_id_;
  int64_t attempt_;
};

// The local address of this host's route to `target` (a coordinator address: host:port,
// [v6]:port, or with a dns:/// or ipv4: scheme): what the other ranks of a gang reach this one at.
// Connects a UDP socket (nothing is sent). Unavailable naming the target when it does not resolve.
absl::StatusOr<std::string> LocalAddressToward(const std::string& target);

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RENDEZVOUS_STORE_H_
