// The worker's own Prometheus metrics, which `moetrain-worker --metrics-listen` serves on /metrics:
// what each rank spends its steps on, what it sends to and receives from the other ranks, and the
// memory of the worker's devices. Families (labels):
//
//   moetrain_worker_step_phase_duration_seconds{job_id,rank,phase}
//       histogram of every step's forward, backward, communication and optimizer phases
//       (StepPhaseSeconds in engine/train/trainer.h)
//   moetrain_worker_comm_sent_bytes_total{job_id,rank,op}
//   moetrain_worker_comm_received_bytes_total{job_id,rank,op}
//   moetrain_worker_comm_seconds_total{job_id,rank,op}
//       the payload and waiting time of the rank's collectives, by op (all_to_all, all_reduce,
//       all_gather, broadcast, barrier; engine/comm/metered_communicator.h)
//   moetrain_worker_device_memory_used_bytes{device}
//   moetrain_worker_device_memory_peak_bytes{device}
//   moetrain_worker_device_memory_capacity_bytes{device}
//       device "cpu": the resident memory of the worker and its rank processes together, the
//       most of their peaks summed, and the --memory-limit; "cuda:N": the allocator's bytes in
//       tensors, their peak, and the GPU's memory, as the rank on it last reported them (every
//       step; in use 0 once that rank has ended)
//
// The CPU's capacity is the worker's --memory-limit (the machine's memory by default). A GPU
// appears once a rank has reported it. A rank's series start at zero when a rank of
// its job first starts on this worker (a later attempt of the job adds to them) and stay until
// the worker starts a rank of another job after it ended. The job's label is job_id, as on the
// coordinator's series: Prometheus gives every scraped series a `job` label of its own.
//
//   MOETRAIN_ASSIGN_OR_RETURN(std::unique_ptr<WorkerMetrics> metrics,
//                             WorkerMetrics::Create(&registry, memory_limit_bytes));
//   options.metrics = metrics.get();   // WorkerOptions: every rank process reports into it
#ifndef MOETRAIN_WORKER_WORKER_METRICS_H_
#define MOETRAIN_WORKER_WORKER_METRICS_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "engine/backend/device_runtime.h"
#include "engine/comm/metered_communicator.h"
#include "engine/train/trainer.h"
#include "server/http/metrics.h"
#include "worker/rank_channel.pb.h"

namespace moetrain {

class WorkerMetrics;

// The series of one rank, alive as long as its process. Thread-safe.
class RankMetrics final {
 public:
  ~RankMetrics();
  RankMetrics(const RankMetrics&) = delete;
  RankMetrics& operator=(const RankMetrics&) = delete;

  // What the rank process sent after a step: its phase times, its collectives' traffic since the
  // last step, its GPU's memory.
  void Observe(const rank::Metrics& metrics);

 private:
  friend class WorkerMetrics;
  RankMetrics(WorkerMetrics* owner, std::string job_id, pid_t pid)
      : owner_(owner), job_id_(std::move(job_id)), pid_(pid) {}

  WorkerMetrics* const owner_;
  const std::string job_id_;
  const pid_t pid_;     // the rank's process, whose memory the CPU's gauges count
  std::string device_;  // the GPU it reported ("cuda:0"); empty on the CPU
  // forward, backward, communication, optimizer
  std::array<server::Histogram*, 4> phases_ = {};
  std::array<server::Counter*, kNumCommOps> sent_ = {};
  std::array<server::Counter*, kNumCommOps> received_ = {};
  std::array<server::Counter*, kNumCommOps> seconds_ = {};
};

class WorkerMetrics {
 public:
  // Adds the families to `registry` (which outlives this), and a collector that reads the
  // devices' memory at each scrape. `host_memory_limit_bytes`: the CPU's capacity; 0 = unknown
  // (not written). AlreadyExists when the registry has them already.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(server::MetricsRegistry* registry,
                                                               int64_t host_memory_limit_bytes);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // The series of rank `rank` of `job_id`, running as process `pid`, which its metrics go to;
  // they outlive every RankMetrics of this object. Drops first the series of the jobs no
  // RankMetrics is alive for (any but `job_id`). InvalidArgument for a job id that is not UTF-8.
  absl::StatusOr<std::shared_ptr<RankMetrics>> StartRank(const std::string& job_id, int rank,
                                                         pid_t pid);

 private:
  friend class RankMetrics;
  explicit WorkerMetrics(int64_t host_memory_limit_bytes)
      : host_memory_limit_bytes_(host_memory_limit_bytes) {}
  // `device`: the GPU the rank reported, in use no more.
  void RankEnded(const std::string& job_id, pid_t pid, const std::string& device);
  void SetDeviceMemory(const rank::DeviceMemory& memory);
  // Sets the memory gauges: the collector's body.
  void CollectMemory();

  const int64_t host_memory_limit_bytes_;
  server::Family<server::Histogram>* phase_family_ = nullptr;
  server::Family<server::Counter>* sent_family_ = nullptr;
  server::Family<server::Counter>* received_family_ = nullptr;
  server::Family<server::Counter>* seconds_family_ = nullptr;
  server::Family<server::Gauge>* memory_used_ = nullptr;
  server::Family<server::Gauge>* memory_peak_ = nullptr;
  server::Family<server::Gauge>* memory_capacity_ = nullptr;

  std::mutex mu_;
  std::map<std::string, int> live_ranks_ ABSL_GUARDED_BY(mu_);  // by job id; 0 = ended
  std::vector<pid_t> rank_processes_ ABSL_GUARDED_BY(mu_);      // of the live RankMetrics
  // The CPU's peak gauge: the most that the worker's and its ranks' peaks have summed to.
  int64_t host_peak_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, DeviceMemoryStats> devices_ ABSL_GUARDED_BY(mu_);  // by "cuda:N"
};

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_WORKER_METRICS_H_
