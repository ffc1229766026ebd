#include "engine/train/parallel.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/local_communicator.h"
#include "engine/core/status.h"

namespace moetrain {

const char* ShardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNone:
      return "NONE";
    case Sharding::kOptimizer:
      return "OPTIMIZER";
    case Sharding::kGradients:
      return "GRADIENTS";
  }
  return "?";
}

std::optional<Sharding> ShardingFromName(std::string_view name) {
  for (const Sharding sharding : {Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients}) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               ShardingName(sharding))) {
      return sharding;
    }
  }
  return std::nullopt;
}

std::string ParallelConfig::DebugString() const {
  return absl::StrCat("dp=", data_parallel, " x ep=", expert_parallel, " (", world_size(),
                      world_size() == 1 ? " rank)" : " ranks)");
}

absl::Status ParallelConfig::Validate(const ModelConfig& model, int64_t batch_size,
                                      int64_t micro_batch_size) const {
  if (expert_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.expert_parallel = ", expert_parallel, " must be at least 1"));
  }
  if (data_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.data_parallel = ", data_parallel, " must be at least 1"));
  }
  if (model.moe.num_experts % expert_parallel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.expert_parallel = ", expert_parallel,
                     " does not divide model.moe.num_experts = ", model.moe.num_experts));
  }
  if (overlap_chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.overlap_chunks = ", overlap_chunks, " must not be negative"));
  }
  if (grad_reduce_dtype != DType::kF32 && grad_reduce_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.grad_reduce_dtype = ", std::string(DTypeName(grad_reduce_dtype)),
                     " is not F32 or BF16"));
  }
  if (grad_bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.grad_bucket_bytes = ", grad_bucket_bytes, " must be at least 1"));
  }
  const int64_t ranks = world_size();
  const auto divisible = [&](const char* field, int64_t value) -> absl::Status {
    if (value % ranks == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value,
                     " is not a multiple of the ranks, parallel.data_parallel × "
                     "parallel.expert_parallel = ",
                     data_parallel, " × ", expert_parallel, " = ", ranks));
  };
  MOETRAIN_RETURN_IF_ERROR(divisible("train.batch_size", batch_size));
  if (micro_batch_size > 0) {
    MOETRAIN_RETURN_IF_ERROR(divisible("train.micro_batch_size", micro_batch_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParallelGroups>> ParallelGroups::Create(
    const ParallelConfig& config, std::shared_ptr<Communicator> world) {
  if (world == nullptr) world = std::make_shared<LocalCommunicator>();
  if (world->size() != config.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the world communicator has ", world->size(),
        " ranks, but parallel.data_parallel × "
        "parallel.expert_parallel = ",
        config.data_parallel, " × ", config.expert_parallel, " = ", config.world_size()));
  }
  std::unique_ptr<ParallelGroups> groups(new ParallelGroups());
  groups->config_ = config;
  groups->world_ = std::move(world);
  const int ep = config.expert_parallel, dp = config.data_parallel;
  const int ep_rank = groups->expert_rank(), dp_rank = groups->data_rank();
  // Every rank makes the same calls in the same order: first the expert groups, then the
  // expert-data groups (each rank names the one it joins).
  if (ep > 1) {
    std::vector<int> ranks;
    for (int i = 0; i < ep; ++i) ranks.push_back(dp_rank * ep + i);
    MOETRAIN_ASSIGN_OR_RETURN(groups->expert_group_, groups->world_->Subgroup(ranks));
  }
  if (dp > 1) {
    std::vector<int> ranks;
    for (int j = 0; j < dp; ++j) ranks.push_back(j * ep + ep_rank);
    MOETRAIN_ASSIGN_OR_RETURN(groups->expert_data_group_, groups->world_->Subgroup(ranks));
  }
  return groups;
}

ExpertParallelConfig ParallelGroups::moe_parallel() const {
  ExpertParallelConfig parallel;
  parallel.expert_group = expert_group_.get();
  parallel.count_group = world_size() > 1 ? world_.get() : nullptr;
  parallel.overlap_chunks = config_.overlap_chunks;
  return parallel;
}

absl::Status SumOverRanks(Communicator* group, absl::Span<double> values) {
  if (group == nullptr || group->size() == 1 || values.empty()) return absl::OkStatus();
  // An f64 all-reduce is not in the interface, and a ring's summation order would differ by
  // rank anyway: gather every rank's values (as their bits) and add them up in rank order.
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<int64_t> send(n), gathered(n * group->size());
  std::memcpy(send.data(), values.data(), n * sizeof(double));
  MOETRAIN_RETURN_IF_ERROR(group->AllGather(send.data(), gathered.data(), n, DType::kI64));
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int r = 0; r < group->size(); ++r) {
      double value;
      std::memcpy(&value, &gathered[r * n + i], sizeof(double));
      sum += value;
    }
    values[i] = sum;
  }
  return absl::OkStatus();
}

absl::Status SumOverRanks(Communicator* group, absl::Span<int64_t> values) {
  if (group == nullptr || group->size() == 1 || values.empty()) return absl::OkStatus();
  return group->AllReduceSum(values.data(), static_cast<int64_t>(values.size()), DType::kI64);
}

}  // namespace moetrain
