// The registry of workers as clients see it and as registrations fill it: the paged listing, the
// cap on registrations that never heartbeat, and how long a lost worker stays listed.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/status.h"
#include "moetrain/v1/proto_time.h"
#include "server/core/fleet.h"
#include "server/core/fleet_internal.h"
#include "server/core/limits.h"

namespace moetrain::server {
namespace {

constexpr int kDefaultWorkersPageSize = 100;
constexpr int kMaxWorkersPageSize = 1000;

v1::WorkerState ToProto(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return v1::WORKER_STATE_IDLE;
    case WorkerState::kBusy:
      return v1::WORKER_STATE_BUSY;
    case WorkerState::kDraining:
      return v1::WORKER_STATE_DRAINING;
    case WorkerState::kLost:
      return v1::WORKER_STATE_LOST;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<WorkerPage> Fleet::ListWorkers(const ListWorkersOptions& options) {
  if (options.page_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", options.page_size, " is negative"));
  }
  const size_t page_size =
      options.page_size == 0
          ? kDefaultWorkersPageSize
          : static_cast<size_t>(std::min(options.page_size, kMaxWorkersPageSize));
  absl::MutexLock lock(&mu_);
  WorkerPage page;
  size_t page_bytes = 0;
  // The token is the id of the last worker of the previous page: the next page goes on after it,
  // whether or not that worker is still known.
  for (auto it = workers_.upper_bound(options.page_token); it != workers_.end(); ++it) {
    const WorkerEntry& worker = *it->second;
    v1::WorkerInfo info;
    info.set_id(worker.id);
    info.set_name(worker.name);
    info.set_device(worker.resources.device());
    info.set_device_count(worker.resources.device_count());
    info.set_device_memory_bytes(worker.resources.device_memory_bytes());
    info.set_threads(worker.resources.threads());
    info.set_version(worker.version);
    info.set_state(ToProto(StateOf(worker)));
    ToProtoTimestamp(worker.last_heartbeat, info.mutable_last_heartbeat());
    if (worker.slot.has_value()) {
      info.set_current_job_id(worker.slot->assignment.job_id());
      info.set_current_attempt(worker.slot->assignment.attempt());
    }
    const size_t bytes = info.ByteSizeLong();
    // A page holds at least one worker, so that every worker can be listed.
    if (page.workers.size() == page_size ||
        (!page.workers.empty() && page_bytes + bytes > kMaxListPageBytes)) {
      page.next_page_token = page.workers.back().id();
      break;
    }
    page_bytes += bytes;
    page.workers.push_back(std::move(info));
  }
  return page;
}

absl::Status Fleet::CheckRegistrationQuota(absl::string_view client) {
  if (client.empty()) return absl::OkStatus();
  const int64_t waiting = std::count_if(workers_.begin(), workers_.end(), [&](const auto& entry) {
    const WorkerEntry& worker = *entry.second;
    return worker.client == client && !worker.heartbeated && !worker.lost;
  });
  if (waiting < options_.max_unheartbeated_registrations_per_client) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "client ", client, " has registered ", waiting,
      " workers that have not sent a heartbeat yet, the most one client may "
      "(max_unheartbeated_registrations_per_client); retry once they heartbeat or are lost (",
      absl::FormatDuration(options_.heartbeat_timeout), ")"));
}

absl::Status Fleet::MarkHeartbeated(WorkerEntry& worker) {
  worker.heartbeated = true;
  absl::Status persisted = PersistWorker(worker);
  if (!persisted.ok()) worker.heartbeated = false;  // as the store has it: the next one retries
  return persisted;
}

absl::Duration Fleet::ForgetAfter(const WorkerEntry& worker) const {
  return worker.heartbeated ? options_.forget_lost_after : options_.forget_never_heartbeated_after;
}

}  // namespace moetrain::server
