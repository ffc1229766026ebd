#include "engine/train/grad_sync.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "engine/core/host_pages.h"
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
      sharded_(groups.config().sharding != Sharding::kNone),
      frees_(groups.config().sharding == Sharding::kGradients),
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
    buckets_.push_back({group, r.begin, r.end, r.last_stage, std::move(blocks), 0, nullptr});
    if (frees_) {
      const auto [begin, end] = KeptRange(buckets_.back());
      buckets_.back().accumulated_at = kept_elements_;
      kept_elements_ += end - begin;
    }
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

void GradSync::BeginMicroBatch(int64_t m, int64_t micro_batches) {
  micro_batch_ = m;
  micro_batches_ = micro_batches;
  last_ = m == micro_batches - 1;
  reducing_ = last_ || frees_;
}

absl::Status GradSync::StageDone(int64_t stage) {
  if (!reducing_) return absl::OkStatus();
  MOETRAIN_RETURN_IF_ERROR(StartThrough(stage));
  // Two stages back: its sums are most likely done, and waiting for them bounds what the CPU
  // holds. A device keeps its memory anyway: it ends them at the micro-batch's end, without
  // holding the host back from queueing backward.
  return frees_ && ctx_.device().is_cpu() ? EndThrough(stage - 2) : absl::OkStatus();
}

absl::Status GradSync::EndMicroBatch() {
  if (!frees_ || last_) return absl::OkStatus();
  MOETRAIN_RETURN_IF_ERROR(StartThrough(std::numeric_limits<int64_t>::max()));
  const absl::Status status = EndThrough(std::numeric_limits<int64_t>::max());
  next_ = ended_ = 0;
  accumulating_ = true;  // the next micro-batch's sums add to this one's
  return status;
}

absl::Status GradSync::Finish() {
  absl::Status status;
  // Stopped early with kGradients: this micro-batch's reduction, then each skipped one's.
  while (frees_ && !last_ && status.ok()) {
    status = EndMicroBatch();
    BeginMicroBatch(micro_batch_ + 1, micro_batches_);
  }
  last_ = true;  // without kGradients, the micro-batch backward stopped early in is the last
  if (status.ok()) status = StartThrough(std::numeric_limits<int64_t>::max());
  if (status.ok()) {
    status = EndThrough(std::numeric_limits<int64_t>::max());
  }
  // After an error: every request started is still waited for, as the buffers must outlive it.
  for (Bucket& bucket : buckets_) {
    if (bucket.request == nullptr) continue;
    (void)bucket.request->Wait();
    bucket.request.reset();
  }
  next_ = ended_ = 0;
  accumulating_ = false;
  return status;
}

absl::Status GradSync::EndThrough(int64_t stage) {
  while (ended_ < next_ && buckets_[ended_].last_stage <= stage) {
    Bucket& bucket = buckets_[ended_++];
    const absl::Status waited = bucket.request->Wait();
    bucket.request.reset();
    MOETRAIN_RETURN_IF_ERROR(waited);
    MOETRAIN_RETURN_IF_ERROR(EndBucket(bucket));
  }
  return absl::OkStatus();
}

absl::Status GradSync::EndBucket(Bucket& bucket) {
  const auto [begin, end] = KeptRange(bucket);
  if (reduce_dtype_ == DType::kBF16 && begin < end) {
    // The sums this rank keeps, back into its f32 grads.
    MOETRAIN_RETURN_IF_ERROR(
        ops::ConvertTensor(ctx_, StagingView(begin, end), GradView(begin, end)));
  }
  if (!frees_) return absl::OkStatus();
  if (begin < end && (accumulating_ || !last_)) {
    if (accumulated_.empty()) {
      MOETRAIN_ASSIGN_OR_RETURN(accumulated_,
                                Tensor::Allocate(ctx_.allocator(), DType::kF32, {kept_elements_}));
    }
    // As rows for ops::Add, which takes them in parallel: of up to 4,096 elements, as many as
    // divide the block.
    int64_t row = 4096;
    while ((end - begin) % row != 0) row /= 2;
    const TensorView kept = GradView(begin, end).Reshape({(end - begin) / row, row});
    const TensorView accumulated =
        accumulated_.view()
            .Slice(bucket.accumulated_at, bucket.accumulated_at + end - begin)
            .Reshape({(end - begin) / row, row});
    if (last_) {  // the earlier micro-batches' sums, added to the last one's
      MOETRAIN_RETURN_IF_ERROR(ops::Add(ctx_, kept, accumulated, kept));
    } else if (accumulating_) {
      MOETRAIN_RETURN_IF_ERROR(ops::Add(ctx_, accumulated, kept, accumulated));
    } else {  // the step's first
      MOETRAIN_RETURN_IF_ERROR(ops::CopyTensor(ctx_, kept, accumulated));
    }
  }
  if (reduce_dtype_ == DType::kBF16 && ctx_.device().is_cpu()) {
    // The staging copy is only needed while the bucket travels.
    MOETRAIN_RETURN_IF_ERROR(DiscardHostRange(StagingView(bucket.begin, bucket.end).raw(),
                                              (bucket.end - bucket.begin) * sizeof(uint16_t)));
  }
  if (!last_) return Discard(bucket.begin, bucket.end);  // its kept sums are in the accumulator
  MOETRAIN_RETURN_IF_ERROR(Discard(bucket.begin, begin));
  return Discard(end, bucket.end);
}

absl::Status GradSync::Discard(int64_t begin, int64_t end) {
  if (begin >= end) return absl::OkStatus();
  const TensorView grads = GradView(begin, end);
  if (ctx_.device().is_cpu()) return DiscardHostRange(grads.raw(), (end - begin) * sizeof(float));
  return ops::Fill(ctx_, grads, 0.0f);
}

absl::Status GradSync::ZeroGrads() {
  if (!frees_) return ops::Fill(ctx_, GradView(0, size_), 0.0f);
  int64_t at = 0;
  for (const auto& [begin, end] : OwnedRanges()) {
    MOETRAIN_RETURN_IF_ERROR(Discard(at, begin));
    MOETRAIN_RETURN_IF_ERROR(ops::Fill(ctx_, GradView(begin, end), 0.0f));
    at = end;
  }
  return Discard(at, size_);
}

}  // namespace moetrain
