#include "engine/train/grad_sync.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/core/status.h"
#include "engine/ops/elementwise/elementwise.h"

namespace moetrain {
namespace {

struct Range {
  int64_t begin, end, last_stage;
};

// Cuts the ranges `range_of(stage)` of consecutive stages (which tile one part of the buffer in
// stage order) into buckets of at least `bucket_elements`, the last one possibly smaller.
template <typename RangeOf>
std::vector<Range> CutBuckets(int64_t num_stages, int64_t bucket_elements, RangeOf range_of) {
  std::vector<Range> buckets;
  Range open = {0, 0, -1};
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    const auto [begin, end] = range_of(stage);
    if (begin == end) continue;
    if (open.last_stage < 0) open.begin = begin;
    open.end = end;
    open.last_stage = stage;
    if (open.end - open.begin >= bucket_elements) {
      buckets.push_back(open);
      open = {0, 0, -1};
    }
  }
  if (open.last_stage >= 0) buckets.push_back(open);
  return buckets;
}

}  // namespace

GradSync::GradSync(const ParallelGroups& groups, const Transformer& model, const ExecContext& ctx)
    : ctx_(ctx),
      sharded_(groups.config().sharding == Sharding::kOptimizer),
      reduce_dtype_(groups.config().grad_reduce_dtype),
      size_(model.grad_buffer().numel()),
      grads_(static_cast<float*>(model.grad_buffer().raw())) {
  const std::vector<GradStage>& stages = model.grad_stages();
  const int64_t num_stages = static_cast<int64_t>(stages.size());
  const int64_t bucket_elements =
      std::max<int64_t>(1, groups.config().grad_bucket_bytes / static_cast<int64_t>(sizeof(float)));
  std::vector<Range> dense, expert;
  if (groups.world_size() > 1) {
    dense = CutBuckets(num_stages, bucket_elements, [&](int64_t s) {
      return std::pair{stages[s].dense_begin, stages[s].dense_end};
    });
  }
  if (groups.expert_data_group() != nullptr) {
    expert = CutBuckets(num_stages, bucket_elements, [&](int64_t s) {
      return std::pair{stages[s].expert_begin, stages[s].expert_end};
    });
  }
  // Merged by the stage that completes them, dense first on a tie: the same order on every rank.
  size_t d = 0, e = 0;
  while (d < dense.size() || e < expert.size()) {
    const bool take_dense =
        e == expert.size() || (d < dense.size() && dense[d].last_stage <= expert[e].last_stage);
    const Range& r = take_dense ? dense[d++] : expert[e++];
    Communicator* group = take_dense ? &groups.world() : groups.expert_data_group();
    std::vector<int64_t> blocks;
    if (sharded_) {
      const int64_t n = group->size(), length = r.end - r.begin;
      for (int64_t j = 0; j < n; ++j) blocks.push_back(length / n + (j < length % n ? 1 : 0));
    }
    buckets_.push_back({group, r.begin, r.end, r.last_stage, std::move(blocks), nullptr});
  }
}

std::pair<int64_t, int64_t> GradSync::KeptRange(const Bucket& bucket) const {
  if (!sharded_) return {bucket.begin, bucket.end};
  const int rank = bucket.group->rank();
  int64_t begin = bucket.begin;
  for (int j = 0; j < rank; ++j) begin += bucket.blocks[j];
  return {begin, begin + bucket.blocks[rank]};
}

std::vector<std::pair<int64_t, int64_t>> GradSync::OwnedRanges() const {
  if (!sharded_) return {{0, size_}};
  // Every element of the buffer is in at most one bucket; those in none are this rank's.
  std::vector<std::pair<int64_t, int64_t>> covered, owned;
  for (const Bucket& bucket : buckets_) {
    covered.push_back({bucket.begin, bucket.end});
    const auto [begin, end] = KeptRange(bucket);
    if (begin < end) owned.push_back({begin, end});
  }
  std::sort(covered.begin(), covered.end());
  int64_t at = 0;
  for (const auto& [begin, end] : covered) {
    if (at < begin) owned.push_back({at, begin});
    at = end;
  }
  if (at < size_) owned.push_back({at, size_});
  std::sort(owned.begin(), owned.end());
  return owned;
}

std::vector<GradSync::BucketLayout> GradSync::buckets() const {
  std::vector<BucketLayout> layouts;
  if (!sharded_) return layouts;
  for (const Bucket& bucket : buckets_) {
    layouts.push_back({bucket.group, bucket.begin, bucket.end, &bucket.blocks});
  }
  return layouts;
}

absl::Status GradSync::GatherOwned(float* buffer) {
  if (!sharded_ || buckets_.empty()) return absl::OkStatus();
  const bool ordered = std::all_of(buckets_.begin(), buckets_.end(), [](const Bucket& b) {
    return b.group->orders_after_device_work();
  });
  if (!ordered) MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
  std::vector<std::unique_ptr<CommRequest>> requests;
  absl::Status status;
  for (const Bucket& bucket : buckets_) {
    absl::StatusOr<std::unique_ptr<CommRequest>> started =
        bucket.group->StartAllGatherV(buffer + bucket.begin, bucket.blocks, DType::kF32);
    if (!started.ok()) {
      status = started.status();
      break;
    }
    requests.push_back(*std::move(started));
  }
  // Every request started is waited for, an error or not: the buffer must outlive them.
  for (const std::unique_ptr<CommRequest>& request : requests) {
    const absl::Status waited = request->Wait();
    if (status.ok()) status = waited;
  }
  return status;
}

GradSync::~GradSync() {
  // After an error: the buffers must outlive whatever is still in flight.
  for (Bucket& bucket : buckets_) {
    if (bucket.request != nullptr) (void)bucket.request->Wait();
  }
}

TensorView GradSync::GradView(int64_t begin, int64_t end) const {
  return TensorView(grads_ + begin, DType::kF32, {end - begin}, ctx_.device());
}

TensorView GradSync::StagingView(int64_t begin, int64_t end) const {
  return TensorView(static_cast<uint16_t*>(staging_.view().raw()) + begin, DType::kBF16,
                    {end - begin}, ctx_.device());
}

absl::Status GradSync::StartThrough(int64_t stage) {
  size_t last = next_;
  while (last < buckets_.size() && buckets_[last].last_stage <= stage) ++last;
  if (last == next_) return absl::OkStatus();
  const bool bf16 = reduce_dtype_ == DType::kBF16;
  if (bf16) {
    if (staging_.empty()) {
      MOETRAIN_ASSIGN_OR_RETURN(staging_,
                                Tensor::Allocate(ctx_.allocator(), DType::kBF16, {size_}));
    }
    for (size_t b = next_; b < last; ++b) {
      MOETRAIN_RETURN_IF_ERROR(ops::ConvertTensor(ctx_,
                                                  GradView(buckets_[b].begin, buckets_[b].end),
                                                  StagingView(buckets_[b].begin, buckets_[b].end)));
    }
  }
  // A bucket's sum reads what backward (and the bf16 rounding) wrote: a group that does not order
  // its collectives after the queued device work (NCCL does, with an event) needs the ops done.
  for (size_t b = next_; b < last; ++b) {
    if (!buckets_[b].group->orders_after_device_work()) {
      MOETRAIN_RETURN_IF_ERROR(ctx_.Synchronize());
      break;
    }
  }
  for (; next_ < last; ++next_) {
    Bucket& bucket = buckets_[next_];
    void* data = bf16 ? StagingView(bucket.begin, bucket.end).raw()
                      : static_cast<void*>(grads_ + bucket.begin);
    MOETRAIN_ASSIGN_OR_RETURN(
        bucket.request,
        sharded_ ? bucket.group->StartReduceScatterSum(data, bucket.blocks, reduce_dtype_)
                 : bucket.group->StartAllReduceSum(data, bucket.end - bucket.begin, reduce_dtype_));
  }
  return absl::OkStatus();
}

absl::Status GradSync::StageDone(int64_t stage) { return StartThrough(stage); }

absl::Status GradSync::Finish() {
  absl::Status status = StartThrough(std::numeric_limits<int64_t>::max());
  for (Bucket& bucket : buckets_) {
    if (bucket.request == nullptr) continue;
    const absl::Status waited = bucket.request->Wait();
    if (status.ok()) status = waited;
    bucket.request.reset();
    if (!status.ok() || reduce_dtype_ != DType::kBF16) continue;
    // The sums this rank keeps, back into its f32 grads.
    const auto [begin, end] = KeptRange(bucket);
    if (begin < end) {
      status = ops::ConvertTensor(ctx_, StagingView(begin, end), GradView(begin, end));
    }
  }
  next_ = 0;
  return status;
}

}  // namespace moetrain
