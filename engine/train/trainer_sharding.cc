// The trainer's AdamW moments in checkpoints. With a sharded optimizer (parallel.sharding =
// OPTIMIZER or GRADIENTS) each rank's AdamW holds the moments of its pieces of the parameters only
// (Trainer::pieces_); with bf16 moments they are bf16. Checkpoints hold whole f32 moments either
// way, as an unsharded f32 run writes them: GatherMoments assembles them for the writers, and
// RestoreMomentPieces takes each rank's pieces back out (rounded to bf16 when the moments are).
// FilesToRead says which files hold a rank's tensors when the checkpoint's layout was another.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/allocator.h"
#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/train/trainer.h"

namespace moetrain {
namespace {

// Elements [offset, offset + count) of the dense `tensor`, as a 1-D view.
TensorView Flat(const TensorView& tensor, int64_t offset, int64_t count) {
  return tensor.Reshape({tensor.numel()}).Slice(offset, offset + count);
}

// dst = src (1-D, f32 or bf16 each, either on the host or ctx's device): a copy when the dtypes
// agree, else converted where the source is and copied over.
absl::Status CopyConverting(const ExecContext& ctx, TensorView src, TensorView dst) {
  if (src.dtype() == dst.dtype()) return ops::CopyTensor(ctx, src, dst);
  if (src.device() == dst.device()) {
    return ops::ConvertTensor(src.device().is_cpu() ? ExecContext::Cpu() : ctx, src, dst);
  }
  // Across: convert where the source is, then copy over.
  const ExecContext& at_src = src.device().is_cpu() ? ExecContext::Cpu() : ctx;
  MOETRAIN_ASSIGN_OR_RETURN(
      Tensor converted, Tensor::Allocate(src.device().is_cpu() ? CpuAllocator() : ctx.allocator(),
                                         dst.dtype(), {src.numel()}));
  MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(at_src, src, converted));
  return ops::CopyTensor(ctx, converted, dst);
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> Trainer::GatherMoments() {
  const TensorView masters = model_->master_buffer();
  const int64_t n = masters.numel();
  const bool writes = WritesShard();
  // None unsharded: every rank then holds its moments whole.
  const std::vector<GradSync::BucketLayout> buckets = grad_sync_->buckets();
  // Allocated first, and agreed on: a rank that could not would leave the others waiting in the
  // gathers below until the timeout.
  std::vector<Tensor> moments;
  std::optional<Tensor> scratch;  // one bucket of f32 on the device: the gathers pass through it
  absl::Status allocated = [&]() -> absl::Status {
    int64_t largest = 0;
    for (const GradSync::BucketLayout& bucket : buckets) {
      largest = std::max(largest, bucket.end - bucket.begin);
    }
    if (largest > 0) {
      MOETRAIN_ASSIGN_OR_RETURN(scratch,
                                Tensor::Allocate(ctx_.allocator(), DType::kF32, {largest}));
    }
    for (int k = 0; k < 2 && writes; ++k) {
      // Zeros where no parameter trains (they have no moments) and in the alignment padding.
      MOETRAIN_ASSIGN_OR_RETURN(Tensor host, Tensor::Allocate(CpuAllocator(), DType::kF32, {n}));
      MOETRAIN_RETURN_IF_ERROR(ops::Fill(ExecContext::Cpu(), host, 0.0f));
      moments.push_back(std::move(host));
    }
    return absl::OkStatus();
  }();
  int64_t failed = !allocated.ok();
  MOETRAIN_RETURN_IF_ERROR(SumOverRanks(&groups_->world(), absl::MakeSpan(&failed, 1)));
  if (!allocated.ok()) return allocated;
  if (failed > 0) {
    return absl::AbortedError(
        absl::StrCat(failed, " other rank(s) could not allocate the checkpoint's moments"));
  }
  // Where each of this rank's pieces lies in the flat buffers.
  std::vector<int64_t> offsets;
  for (int64_t i = 0; i < optimizer_->num_params(); ++i) {
    offsets.push_back(static_cast<const float*>(optimizer_->param(i).value.raw()) -
                      static_cast<const float*>(masters.raw()));
  }
  for (int k = 0; k < 2; ++k) {
    const auto moment = [&](int64_t i) {
      const TensorView m = k == 0 ? optimizer_->exp_avg(i) : optimizer_->exp_avg_sq(i);
      return Flat(m, 0, m.numel());
    };
    // A writer's own pieces go straight to the host; the others' come bucket by bucket.
    for (int64_t i = 0; i < optimizer_->num_params() && writes; ++i) {
      MOETRAIN_RETURN_IF_ERROR(
          CopyConverting(ctx_, moment(i), Flat(moments[k], offsets[i], moment(i).numel())));
    }
    for (const GradSync::BucketLayout& bucket : buckets) {
      const TensorView window = Flat(*scratch, 0, bucket.end - bucket.begin);
      MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, window, 0.0f));
      for (int64_t i = 0; i < optimizer_->num_params(); ++i) {
        if (offsets[i] < bucket.begin || offsets[i] >= bucket.end) continue;
        MOETRAIN_RETURN_IF_ERROR(CopyConverting(
            ctx_, moment(i), Flat(window, offsets[i] - bucket.begin, moment(i).numel())));
      }
      if (!bucket.group->orders_after_device_work()) MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
      MOETRAIN_RETURN_IF_ERROR(bucket.group->AllGatherV(window.raw(), *bucket.blocks, DType::kF32));
      if (writes) {
        MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(
            ctx_, window, Flat(moments[k], bucket.begin, bucket.end - bucket.begin)));
      }
    }
  }
  return moments;
}

absl::Status Trainer::RestoreMomentPieces(const LoadedCheckpoint& loaded) {
  for (int64_t i = 0; i < optimizer_->num_params(); ++i) {
    const ParameterPiece& piece = pieces_[i];
    for (const auto& [suffix, moment] : {std::pair(kExpAvgSuffix, optimizer_->exp_avg(i)),
                                         std::pair(kExpAvgSqSuffix, optimizer_->exp_avg_sq(i))}) {
      const std::string name = piece.parameter + suffix;
      const auto it = loaded.optim_tensors.find(name);
      if (it == loaded.optim_tensors.end()) {
        return absl::DataLossError(absl::StrCat(loaded.path, ": tensor ", name, " is missing"));
      }
      const Tensor& whole = it->second;
      if (whole.dtype() != DType::kF32 ||
          whole.view().shape() != absl::MakeConstSpan(piece.shape)) {
        return absl::DataLossError(absl::StrCat(loaded.path, ": tensor ", name, " is ",
                                                whole.view().DebugString(), ", expected f32 [",
                                                absl::StrJoin(piece.shape, ", "), "]"));
      }
      MOETRAIN_RETURN_IF_ERROR(CopyConverting(
          ctx_, Flat(whole.view(), piece.offset, moment.numel()), Flat(moment, 0, moment.numel())));
    }
  }
  return absl::OkStatus();
}

CheckpointReadOptions Trainer::FilesToRead(int written_ep) const {
  // Rank 0's file holds the dense part; file j the experts [j·E/ep', (j+1)·E/ep') of the writing
  // layout's ep'. This rank needs those that overlap its own experts.
  const int64_t experts = config_.model.moe.num_experts, ep = config_.parallel.expert_parallel;
  const int64_t begin = groups_->expert_rank() * experts / ep;
  const int64_t end = (groups_->expert_rank() + 1) * experts / ep;
  CheckpointReadOptions read;
  read.ranks = {0};
  for (int j = 1; j < written_ep; ++j) {
    if (j * experts / written_ep < end && begin < (j + 1) * experts / written_ep) {
      read.ranks.push_back(j);
    }
  }
  return read;
}

}  // namespace moetrain
