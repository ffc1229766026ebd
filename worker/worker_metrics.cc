#include "worker/worker_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/core/status.h"

namespace moetrain {
namespace {

constexpr const char* kPhaseNames[] = {"forward", "backward", "communication", "optimizer"};

// A process's resident memory now (/proc/<pid>/statm) and at most (VmHWM in
// /proc/<pid>/status); -1 where Linux does not say (a process that has ended).
int64_t ResidentBytes(const std::string& process) {
  std::ifstream statm(absl::StrCat("/proc/", process, "/statm"));
  int64_t size_pages = 0, resident_pages = -1;
  if (!(statm >> size_pages >> resident_pages)) return -1;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

int64_t PeakResidentBytes(const std::string& process) {
  std::ifstream status(absl::StrCat("/proc/", process, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::string number = line.substr(6);
    number.erase(
        std::remove_if(number.begin(), number.end(), [](char c) { return c < '0' || c > '9'; }),
        number.end());
    int64_t kib = 0;
    return absl::SimpleAtoi(number, &kib) ? kib * 1024 : -1;
  }
  return -1;
}

}  // namespace

RankMetrics::~RankMetrics() { owner_->RankEnded(job_id_, pid_, device_); }

void RankMetrics::Observe(const rank::Metrics& metrics) {
  if (metrics.phase_seconds_size() == static_cast<int>(phases_.size())) {
    for (size_t i = 0; i < phases_.size(); ++i) {
      phases_[i]->Observe(metrics.phase_seconds(static_cast<int>(i)));
    }
  }
  for (const rank::CommTraffic& traffic : metrics.comm()) {
    const int i = traffic.op();
    if (i < 0 || i >= kNumCommOps) continue;  // not an op of this build's: nothing to count
    if (traffic.bytes_sent() > 0) sent_[i]->Increment(static_cast<double>(traffic.bytes_sent()));
    if (traffic.bytes_received() > 0) {
      received_[i]->Increment(static_cast<double>(traffic.bytes_received()));
    }
    if (traffic.seconds() > 0) seconds_[i]->Increment(traffic.seconds());
  }
  if (metrics.has_device()) {
    device_ = metrics.device().device();
    owner_->SetDeviceMemory(metrics.device());
  }
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    server::MetricsRegistry* registry, int64_t host_memory_limit_bytes) {
  std::unique_ptr<WorkerMetrics> metrics(new WorkerMetrics(host_memory_limit_bytes));
  // 0.5 ms to about 2 min: a tiny CPU model's step to a large model's optimizer on a CPU.
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->phase_family_,
      registry->AddHistogram("moetrain_worker_step_phase_duration_seconds",
                             "Wall time of each phase of every optimizer step of a rank on this "
                             "worker (forward, backward, communication, optimizer).",
                             {"job_id", "rank", "phase"},
                             server::ExponentialBuckets(0.0005, 4, 10)));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->sent_family_,
      registry->AddCounter("moetrain_worker_comm_sent_bytes_total",
                           "Payload bytes a rank on this worker handed to the other ranks of its "
                           "job, by collective.",
                           {"job_id", "rank", "op"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->received_family_,
      registry->AddCounter("moetrain_worker_comm_received_bytes_total",
                           "Payload bytes a rank on this worker took from the other ranks of its "
                           "job, by collective.",
                           {"job_id", "rank", "op"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->seconds_family_,
      registry->AddCounter("moetrain_worker_comm_seconds_total",
                           "Seconds a rank on this worker spent waiting in collectives (starting "
                           "and waiting for them), by collective.",
                           {"job_id", "rank", "op"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->memory_used_,
      registry->AddGauge("moetrain_worker_device_memory_used_bytes",
                         "Memory in use on a device of this worker: the worker process's resident "
                         "memory on the CPU, the allocator's bytes in tensors on a GPU.",
                         {"device"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->memory_peak_,
      registry->AddGauge("moetrain_worker_device_memory_peak_bytes",
                         "The most memory in use at once on a device of this worker since it "
                         "was opened (the worker process's peak resident memory on the CPU).",
                         {"device"}));
  MOETRAIN_ASSIGN_OR_RETURN(
      metrics->memory_capacity_,
      registry->AddGauge("moetrain_worker_device_memory_capacity_bytes",
                         "Memory of a device of this worker: the worker's --memory-limit on the "
                         "CPU, the GPU's memory on a GPU.",
                         {"device"}));
  WorkerMetrics* raw = metrics.get();
  registry->AddCollector([raw] { raw->CollectMemory(); });
  return metrics;
}

absl::StatusOr<std::shared_ptr<RankMetrics>> WorkerMetrics::StartRank(const std::string& job_id,
                                                                      int rank, pid_t pid) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = live_ranks_.begin(); it != live_ranks_.end();) {
      if (it->second > 0 || it->first == job_id) {
        ++it;
        continue;
      }
      for (server::FamilyBase* family : std::initializer_list<server::FamilyBase*>{
               phase_family_, sent_family_, received_family_, seconds_family_}) {
        family->RemoveWhere("job_id", it->first);
      }
      it = live_ranks_.erase(it);
    }
    // Counted before its children are looked up: a lookup that fails ends the RankMetrics, and
    // its end (RankEnded, which takes mu_) takes the count back.
    ++live_ranks_[job_id];
    rank_processes_.push_back(pid);
  }
  std::shared_ptr<RankMetrics> metrics(new RankMetrics(this, job_id, pid));
  const std::string rank_text = absl::StrCat(rank);
  for (size_t i = 0; i < metrics->phases_.size(); ++i) {
    MOETRAIN_ASSIGN_OR_RETURN(metrics->phases_[i],
                              phase_family_->WithLabels({job_id, rank_text, kPhaseNames[i]}));
  }
  for (int i = 0; i < kNumCommOps; ++i) {
    const absl::string_view op = CommOpName(static_cast<CommOp>(i));
    MOETRAIN_ASSIGN_OR_RETURN(metrics->sent_[i], sent_family_->WithLabels({job_id, rank_text, op}));
    MOETRAIN_ASSIGN_OR_RETURN(metrics->received_[i],
                              received_family_->WithLabels({job_id, rank_text, op}));
    MOETRAIN_ASSIGN_OR_RETURN(metrics->seconds_[i],
                              seconds_family_->WithLabels({job_id, rank_text, op}));
  }
  return metrics;
}

void WorkerMetrics::RankEnded(const std::string& job_id, pid_t pid, const std::string& device) {
  std::lock_guard<std::mutex> lock(mu_);
  --live_ranks_[job_id];
  auto it = std::find(rank_processes_.begin(), rank_processes_.end(), pid);
  if (it != rank_processes_.end()) rank_processes_.erase(it);
  // Its tensors went with its process; the peak and the capacity stay shown.
  auto gpu = devices_.find(device);
  if (gpu != devices_.end()) gpu->second.in_use_bytes = 0;
}

void WorkerMetrics::SetDeviceMemory(const rank::DeviceMemory& memory) {
  DeviceMemoryStats stats;
  stats.in_use_bytes = memory.in_use_bytes();
  stats.peak_bytes = memory.peak_bytes();
  stats.total_bytes = memory.total_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded by the worker's GPUs: a rank reports the one it computes on.
  devices_[memory.device()] = stats;
}

void WorkerMetrics::CollectMemory() {
  std::vector<std::pair<std::string, DeviceMemoryStats>> devices;
  DeviceMemoryStats host;
  host.total_bytes = host_memory_limit_bytes_ > 0 ? host_memory_limit_bytes_ : -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The worker and its rank processes: what the CPU's memory holds for this worker.
    host.in_use_bytes = ResidentBytes("self");
    int64_t peaks = PeakResidentBytes("self");
    for (pid_t pid : rank_processes_) {
      const std::string process = absl::StrCat(pid);
      const int64_t in_use = ResidentBytes(process), peak = PeakResidentBytes(process);
      if (in_use > 0 && host.in_use_bytes >= 0) host.in_use_bytes += in_use;
      if (peak > 0 && peaks >= 0) peaks += peak;
    }
    host_peak_bytes_ = std::max({host_peak_bytes_, peaks, host.in_use_bytes});
    host.peak_bytes = host_peak_bytes_ > 0 ? host_peak_bytes_ : -1;
    for (const auto& [device, stats] : devices_) devices.emplace_back(device, stats);
  }
  devices.insert(devices.begin(), {"cpu", host});
  for (const auto& [device, stats] : devices) {
    const absl::string_view label = device;
    const std::pair<server::Family<server::Gauge>*, int64_t> values[] = {
        {memory_used_, stats.in_use_bytes},
        {memory_peak_, stats.peak_bytes},
        {memory_capacity_, stats.total_bytes}};
    for (const auto& [family, value] : values) {
      if (value < 0) continue;  // not known here
      absl::StatusOr<server::Gauge*> gauge = family->WithLabels({label});
      if (gauge.ok()) (*gauge)->Set(static_cast<double>(value));
    }
  }
}

}  // namespace moetrain
