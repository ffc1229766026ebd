#include "worker/assignment_ranks.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace moetrain {
namespace {

// Larger is worse: the order in which outcomes win when the ranks of one assignment disagree.
int Severity(v1::AttemptOutcome outcome) {
  switch (outcome) {
    case v1::ATTEMPT_OUTCOME_SUCCEEDED:
      return 0;
    case v1::ATTEMPT_OUTCOME_STOPPED:
      return 1;
    case v1::ATTEMPT_OUTCOME_CANCELLED:
      return 2;
    default:  // FAILED, and an outcome no rank should send (taken as a failure)
      return 3;
  }
}

}  // namespace

absl::StatusOr<std::vector<LocalRank>> ExpandAssignment(const v1::Assignment& assignment,
                                                        v1::ResourceConfig::Device worker_device,
                                                        int worker_device_count) {
  const v1::ResourceConfig& resources = assignment.spec().resources();
  const int64_t devices_per_worker =
      resources.has_devices_per_worker() ? resources.devices_per_worker() : 1;
  if (devices_per_worker < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the assignment's resources.devices_per_worker = ", devices_per_worker, " is below 1"));
  }
  if (devices_per_worker > worker_device_count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs resources.devices_per_worker = ", devices_per_worker, " ",
        v1::ResourceConfig::Device_Name(resources.device()), " devices per worker, but this ",
        v1::ResourceConfig::Device_Name(worker_device), " worker has ", worker_device_count,
        " (the scheduler should not have sent it here)"));
  }
  const int64_t first = assignment.rank();
  if (first < 0 || first + devices_per_worker > assignment.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the assignment's ranks ", first, " .. ", first + devices_per_worker - 1,
                     " are not within world_size = ", assignment.world_size()));
  }
  std::vector<LocalRank> ranks;
  ranks.reserve(static_cast<size_t>(devices_per_worker));
  for (int local = 0; local < devices_per_worker; ++local) {
    LocalRank& rank = ranks.emplace_back();
    rank.assignment = assignment;
    rank.assignment.set_rank(static_cast<int32_t>(first + local));
    rank.device = worker_device == v1::ResourceConfig::CUDA ? Device::Cuda(local) : Device::Cpu();
  }
  return ranks;
}

v1::ReportAttemptEndRequest CombineRankEnds(int32_t first_rank,
                                            const std::vector<v1::ReportAttemptEndRequest>& ends) {
  v1::ReportAttemptEndRequest combined;
  if (ends.empty()) {
    combined.set_rank(first_rank);
    combined.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
    combined.set_message("no rank of the assignment reported its end");
    combined.set_failure_kind(v1::FAILURE_KIND_TRANSIENT);
    return combined;
  }
  // The end that speaks for the assignment: the worst outcome, the first PERMANENT failure
  // before any other failure, else the first to end among the worst.
  const v1::ReportAttemptEndRequest* chosen = &ends.front();
  for (const v1::ReportAttemptEndRequest& end : ends) {
    const int severity = Severity(end.outcome()), chosen_severity = Severity(chosen->outcome());
    const bool more_permanent = severity == 3 && chosen_severity == 3 &&
                                end.failure_kind() == v1::FAILURE_KIND_PERMANENT &&
                                chosen->failure_kind() != v1::FAILURE_KIND_PERMANENT;
    if (severity > chosen_severity || more_permanent) chosen = &end;
  }
  combined = *chosen;
  combined.set_rank(first_rank);
  if (Severity(chosen->outcome()) == 3) combined.set_outcome(v1::ATTEMPT_OUTCOME_FAILED);
  if (ends.size() > 1 && !chosen->message().empty()) {
    combined.set_message(absl::StrCat("rank ", chosen->rank(), ": ", chosen->message()));
  }
  int64_t step = chosen->step();
  bool draining = false;
  for (const v1::ReportAttemptEndRequest& end : ends) {
    step = std::min(step, end.step());
    draining |= end.worker_draining();
  }
  combined.set_step(step);
  combined.set_worker_draining(draining);
  return combined;
}

}  // namespace moetrain
