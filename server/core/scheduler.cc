#include "server/core/scheduler.h"

#include <algorithm>
#include <cstddef>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace moetrain::server {
namespace {

absl::Status Validate(const std::vector<PendingJob>& jobs,
                      const std::vector<SchedulerWorker>& workers) {
  std::set<std::string> job_ids;
  std::set<int64_t> sequences;
  for (const PendingJob& job : jobs) {
    if (job.job_id.empty()) return absl::InvalidArgumentError("pending job with an empty job_id");
    if (!job_ids.insert(job.job_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id, " is listed twice"));
    }
    if (!sequences.insert(job.submit_sequence).second) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job.job_id,
                                                     " submit_sequence = ", job.submit_sequence,
                                                     " is shared with another job"));
    }
    if (job.workers_needed < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", job.job_id, " workers_needed = ", job.workers_needed, " is not >= 1"));
    }
    if (job.device_memory_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", job.job_id, " device_memory_bytes = ", job.device_memory_bytes, " is negative"));
    }
    if (job.devices_per_worker < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", job.job_id, " devices_per_worker = ", job.devices_per_worker, " is negative"));
    }
  }
  std::set<std::string> worker_ids;
  for (const SchedulerWorker& worker : workers) {
    if (worker.worker_id.empty()) return absl::InvalidArgumentError("worker with an empty id");
    if (!worker_ids.insert(worker.worker_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker.worker_id, " is listed twice"));
    }
    if (worker.device_memory_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker.worker_id,
                       " device_memory_bytes = ", worker.device_memory_bytes, " is negative"));
    }
    if (worker.device_count < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker.worker_id, " device_count = ", worker.device_count, " is negative"));
    }
  }
  return absl::OkStatus();
}

bool Matches(const PendingJob& job, const SchedulerWorker& worker) {
  // Unknown memory on either side never excludes: only two known figures can disagree.
  const bool memory_fits = job.device_memory_bytes == 0 || worker.device_memory_bytes == 0 ||
                           worker.device_memory_bytes >= job.device_memory_bytes;
  return worker.device_kind == job.device_kind && worker.device_count >= job.devices_per_worker &&
         memory_fits;
}

// " with at least 2 devices of 80.0 GiB each": what a matching worker has, beyond its kind. One
// device is what any worker of the kind offers in practice; say more only when it matters.
std::string WorkerNeeds(const PendingJob& job) {
  std::string needs;
  constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;
  // Small jobs (the tests', a CPU-sized model on a GPU) in MiB, so that the figure is not 0.0.
  const std::string memory = job.device_memory_bytes <= 0 ? ""
                             : job.device_memory_bytes >= kGiB
                                 ? absl::StrFormat(" of %.1f GiB", job.device_memory_bytes / kGiB)
                                 : absl::StrFormat(" of %.1f MiB", job.device_memory_bytes / kMiB);
  if (job.devices_per_worker > 1) {
    absl::StrAppend(&needs, " with at least ", job.devices_per_worker, " devices", memory, " each");
  } else if (!memory.empty()) {
    absl::StrAppend(&needs, " with a device", memory);
  }
  return needs;
}

std::string UnschedulableReason(const PendingJob& job, int registered) {
  std::string reason =
      absl::StrCat("needs ", job.workers_needed, " ", DeviceKindName(job.device_kind),
                   job.workers_needed == 1 ? " worker" : " workers", WorkerNeeds(job));
  absl::StrAppend(&reason, ", ", registered, " registered");
  return reason;
}

// Names the workers as UnschedulableReason does; the counts say nothing about which are free, so
// the reason stays the same while the fleet does.
std::string WaitingReason(const PendingJob& job, int registered) {
  std::string reason =
      absl::StrCat("waiting for ", job.workers_needed, " ", DeviceKindName(job.device_kind),
                   job.workers_needed == 1 ? " worker" : " workers", WorkerNeeds(job));
  absl::StrAppend(&reason, job.workers_needed == 1 ? " to be free, " : " to be free at once, ",
                  registered, " registered");
  return reason;
}

}  // namespace

absl::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "CPU";
    case DeviceKind::kCuda:
      return "CUDA";
  }
  return "UNKNOWN";
}

absl::StatusOr<ScheduleDecision> Schedule(const std::vector<PendingJob>& jobs,
                                          const std::vector<SchedulerWorker>& workers) {
  if (absl::Status status = Validate(jobs, workers); !status.ok()) return status;

  std::vector<const PendingJob*> job_order;
  job_order.reserve(jobs.size());
  for (const PendingJob& job : jobs) job_order.push_back(&job);
  std::sort(job_order.begin(), job_order.end(), [](const PendingJob* a, const PendingJob* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->submit_sequence < b->submit_sequence;
  });

  // Best fit, then id: the order in which a job takes free workers (rule 6).
  std::vector<const SchedulerWorker*> worker_order;
  worker_order.reserve(workers.size());
  for (const SchedulerWorker& worker : workers) worker_order.push_back(&worker);
  std::sort(worker_order.begin(), worker_order.end(),
            [](const SchedulerWorker* a, const SchedulerWorker* b) {
              if (a->device_count != b->device_count) return a->device_count < b->device_count;
              return a->worker_id < b->worker_id;
            });
  // Per worker_order index: handed to a job in this decision, or held for the head.
  std::vector<bool> assigned(worker_order.size(), false);
  std::vector<bool> reserved(worker_order.size(), false);
  bool head_reserved = false;

  ScheduleDecision decision;
  for (const PendingJob* job : job_order) {
    int registered = 0;
    std::vector<size_t> free;  // indices into worker_order, in taking order
    for (size_t i = 0; i < worker_order.size(); ++i) {
      const SchedulerWorker& worker = *worker_order[i];
      if (!Matches(*job, worker)) continue;
      if (worker.state != WorkerState::kLost) ++registered;
      if (worker.state == WorkerState::kIdle && !assigned[i] && !reserved[i]) free.push_back(i);
    }
    if (registered < job->workers_needed) {
      decision.unschedulable.push_back({job->job_id, UnschedulableReason(*job, registered)});
      continue;
    }
    if (free.size() >= static_cast<size_t>(job->workers_needed)) {
      Assignment assignment{job->job_id, {}};
      for (int rank = 0; rank < job->workers_needed; ++rank) {
        assigned[free[rank]] = true;
        assignment.worker_ids.push_back(worker_order[free[rank]]->worker_id);
      }
      std::sort(assignment.worker_ids.begin(), assignment.worker_ids.end());
      decision.assignments.push_back(std::move(assignment));
      continue;
    }
    decision.waiting.push_back({job->job_id, WaitingReason(*job, registered)});
    // The head: fewer than workers_needed are free, so it holds all of them (rule 5).
    if (!head_reserved) {
      head_reserved = true;
      for (size_t i : free) reserved[i] = true;
    }
  }
  return decision;
}

}  // namespace moetrain::server
