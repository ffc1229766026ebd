// Who the ranks of a group are and where they meet: the part of the options every communicator
// that spans processes (Gloo, NCCL) shares.
#ifndef MOETRAIN_ENGINE_COMM_GROUP_OPTIONS_H_
#define MOETRAIN_ENGINE_COMM_GROUP_OPTIONS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"

namespace moetrain {

struct GroupOptions {
  // Where the ranks publish their addresses (Gloo) or the unique id (NCCL). Subgroups made later
  // meet through it too, so the communicator keeps a reference. NCCL needs none for a world of one
  // (it makes its id locally and splits subgroups without the store).
  std::shared_ptr<KeyValueStore> store;
  // Namespaces this group's keys in the store. Make it unique per job attempt (e.g.
  // "job-7/attempt-2/world"): ranks of two groups under one prefix would meet the wrong peers.
  std::string prefix = "world";
  int rank = 0;
  int size = 1;
  // Bounds the rendezvous and every collective: a peer that never joins, dies or stalls makes the
  // others fail within this much time (DeadlineExceeded or Unavailable), not hang.
  absl::Duration timeout = absl::Seconds(60);

  // InvalidArgument naming the field: no store (unless !needs_store), rank outside [0, size),
  // timeout not positive.
  absl::Status Validate(bool needs_store = true) const;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_GROUP_OPTIONS_H_
