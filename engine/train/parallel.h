// How the ranks of one job split the work, and the communicators that follow from it.
//
// World W = data_parallel (dp) × expert_parallel (ep). Rank r has ep_rank = r % ep and
// dp_rank = r / ep:
//   expert group       ranks {dp_rank·ep + i, i < ep}: they share their routed experts (tokens
//                      travel between them by all-to-all); ep_rank j owns experts
//                      [j·E/ep, (j+1)·E/ep) of every MoE layer.
//   expert-data group  ranks {j·ep + ep_rank, j < dp}: the dp replicas of this rank's experts.
// Every rank holds the dense weights (attention, norms, dense FFNs, routers, expert biases,
// shared experts, embeddings) and reads its own slice of each global batch.
#ifndef MOETRAIN_ENGINE_TRAIN_PARALLEL_H_
#define MOETRAIN_ENGINE_TRAIN_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/comm/communicator.h"
#include "engine/core/dtype.h"
#include "engine/model/model_config.h"
#include "engine/moe/moe_layer.h"

namespace moetrain {

// The most ranks a job can have: as many as a job spec can ask for (2^20 workers of 1,024 devices
// each). Layouts of [1, kMaxRanks] ranks keep their arithmetic within an int.
inline constexpr int kMaxRanks = 1 << 30;

// What the data-parallel replicas of a parameter split among themselves (JobSpec's
// parallel.sharding): the replicas of a dense parameter are the whole world, those of an expert
// its expert-data group. In order of what a rank lets go of (the layout search relies on it).
enum class Sharding : uint8_t {
  kNone,       // each replica keeps the whole optimizer state; gradients are all-reduced
  kOptimizer,  // ZeRO-1: each keeps the AdamW moments of its part of the parameters only;
               // gradients are reduce-scattered, each updates its part, the updated weights are
               // all-gathered (grad_sync.h)
  kGradients,  // ZeRO-2: as kOptimizer, and each keeps the summed gradients of its part only:
               // every micro-batch's gradients are reduce-scattered during its backward, and
               // the others' parts let go of once summed (grad_sync.h)
};
// "NONE", "OPTIMIZER", "GRADIENTS".
const char* ShardingName(Sharding sharding);
// The stage named `name` (ShardingName's, in any case), or nullopt.
std::optional<Sharding> ShardingFromName(std::string_view name);

// Field names mirror JobSpec.parallel.
struct ParallelConfig {
  int expert_parallel = 1;  // ep ≥ 1: ranks that split the routed experts; divides num_experts
  int data_parallel = 1;    // dp ≥ 1: replicas of each expert shard
  // Chunks each MoE layer's expert-parallel exchange is split into, so that one chunk's
  // all-to-all overlaps another's expert GEMMs: 0 = 2 when ep > 1, 1 = no overlap.
  int overlap_chunks = 0;
  Sharding sharding = Sharding::kNone;
  // The dtype gradients travel and are summed in between the ranks (f32 or bf16); each rank
  // accumulates its own in f32 either way, and the sums come back into f32 (grad_sync.h).
  DType grad_reduce_dtype = DType::kF32;
  // Gradients are summed over the ranks in buckets of about this many bytes, each started as
  // soon as backward has finished it. Not part of the job spec; tests make it small.
  int64_t grad_bucket_bytes = int64_t{4} << 20;

  int world_size() const { return expert_parallel * data_parallel; }
  // "dp=2 x ep=4 (8 ranks)": how errors and logs name a layout.
  std::string DebugString() const;

  // OK, or InvalidArgument naming the field and its value: both sizes ≥ 1;
  // model.moe.num_experts divisible by expert_parallel; train.batch_size and the (global)
  // micro-batch divisible by the world size. `micro_batch_size` 0 means batch_size.
  absl::Status Validate(const ModelConfig& model, int64_t batch_size,
                        int64_t micro_batch_size) const;
};

// The communicators of one rank. Built once per job attempt by every rank, in the same order.
class ParallelGroups {
 public:
  // `world` (null = a single-rank LocalCommunicator) must have config.world_size() ranks, else
  // InvalidArgument naming both. Creates the expert group (when ep > 1) and then the
  // expert-data group (when dp > 1) with Communicator::Subgroup: a collective over the world.
  static absl::StatusOr<std::unique_ptr<ParallelGroups>> Create(
      const ParallelConfig& config, std::shared_ptr<Communicator> world);

  const ParallelConfig& config() const { return config_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int expert_rank() const { return rank() % config_.expert_parallel; }  // ep_rank
  int data_rank() const { return rank() / config_.expert_parallel; }    // dp_rank

  Communicator& world() const { return *world_; }
  // Null when ep = 1 (every expert is local) or dp = 1 (no replicas) respectively.
  Communicator* expert_group() const { return expert_group_.get(); }
  Communicator* expert_data_group() const { return expert_data_group_.get(); }

  // What the MoE layers of this rank are built with: the expert group, and the world as the
  // group whose token counts make the aux loss's f_e (null when single-rank).
  ExpertParallelConfig moe_parallel() const;

 private:
  ParallelGroups() = default;

  ParallelConfig config_;
  std::shared_ptr<Communicator> world_;
  std::unique_ptr<Communicator> expert_group_;
  std::unique_ptr<Communicator> expert_data_group_;
};

// values[i] ← Σ over the group's ranks of values[i], summed in f64 in rank order, so that every
// rank gets the same bits. A null group (or one of size 1) leaves the values as they are.
absl::Status SumOverRanks(Communicator* group, absl::Span<double> values);
// The same for integers (one all-reduce).
absl::Status SumOverRanks(Communicator* group, absl::Span<int64_t> values);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_PARALLEL_H_
