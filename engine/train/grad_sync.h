// Sums one optimizer step's gradients over the ranks that hold the same parameters, while the
// last micro-batch's backward is still running.
//
// Dense grads (the model's buffer [0, dense_size)) are summed over the world, the local experts'
// grads ([dense_size, N)) over the expert-data group. Each part is cut into buckets of whole
// backward stages of about ParallelConfig::grad_bucket_bytes; a bucket's all-reduce starts as
// soon as backward has finished its last stage, so the all-reduces of later layers run while
// the earlier layers' backward computes, and the dense and expert all-reduces run side by side.
// The trainer folds the 1/W of the global mean into the loss scale, so the sums are the
// single-process gradients.
//
// Every rank starts the same buckets in the same order: by the stage that completes them, dense
// before expert, so the collectives of each communicator pair up.
//
// With Sharding::kOptimizer each bucket is cut into one near-equal block per rank of its group
// (the first size % n blocks one element longer) and reduce-scattered instead: after Finish a rank
// holds the summed gradient of its own blocks only (OwnedRanges), updates those, and GatherOwned
// brings every rank the others' updated blocks. On Gloo both sums add the ranks' values in rank
// order, so the sharded gradients are the unsharded ones, bit for bit.
//
// With ParallelConfig::grad_reduce_dtype = bf16 a bucket is rounded to bf16 into a staging
// buffer (2 bytes a gradient element of the buckets) when it starts, summed there in bf16
// (Communicator::StartAllReduceSum: on Gloo in f32 and rounded once), and the sums this rank keeps
// widened back into the f32 grads by Finish.
#ifndef MOETRAIN_ENGINE_TRAIN_GRAD_SYNC_H_
#define MOETRAIN_ENGINE_TRAIN_GRAD_SYNC_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"
#include "engine/model/transformer.h"
#include "engine/train/parallel.h"

namespace moetrain {

class GradSync {
 public:
  // Buckets over `model`'s grad buffer; `groups` and `model` must outlive this object. No
  // buckets (nothing to do) for a single rank. Backward writes the grads through ops on `ctx`:
  // a bucket's all-reduce starts once they are done there.
  GradSync(const ParallelGroups& groups, const Transformer& model, const ExecContext& ctx);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  ~GradSync();

  // Backward stage `stage` of the step's last micro-batch is done: starts the buckets it
  // completes (BackwardOptions::on_stage_done).
  absl::Status StageDone(int64_t stage);
  // Starts the buckets not started yet (all of them when backward stopped early), then waits for
  // every one. After it the grads are summed; the next step starts from no bucket in flight.
  absl::Status Finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

  // The ranges [begin, end) of the grad buffer whose sums this rank holds after Finish, ascending:
  // the whole buffer unsharded; sharded, its block of each bucket and whatever no bucket covers
  // (a part with no replicas to share it with).
  std::vector<std::pair<int64_t, int64_t>> OwnedRanges() const;
  // Sharded: every rank's blocks of `buffer` (f32, laid out as the grad buffer, on ctx's device:
  // the master weights) to every rank, through the buckets' groups; waits for all. Unsharded:
  // nothing to do.
  absl::Status GatherOwned(float* buffer);

  // A sharded bucket: elements [begin, end) of the buffer, summed over `group`, whose rank j holds
  // block j (`blocks[j]` elements from begin + Σ blocks[<j]).
  struct BucketLayout {
    Communicator* group;
    int64_t begin, end;
    const std::vector<int64_t>* blocks;
  };
  // Sharded: every bucket, in start order (the order every rank runs their collectives in).
  // Unsharded: none, as every rank holds the whole sums.
  std::vector<BucketLayout> buckets() const;

 private:
  struct Bucket {
    Communicator* group;                   // the world (dense) or the expert-data group (experts)
    int64_t begin, end;                    // elements of the grad buffer
    int64_t last_stage;                    // the backward stage that completes it
    std::vector<int64_t> blocks;           // sharded: elements of each group rank's block
    std::unique_ptr<CommRequest> request;  // in flight, from its start to Finish
  };

  // The elements [begin, end) of the buffer whose sums this rank keeps of `bucket`: all of them
  // unsharded, its own block sharded.
  std::pair<int64_t, int64_t> KeptRange(const Bucket& bucket) const;
  // Starts buckets_[next_ …] while their last stage is ≤ `stage`.
  absl::Status StartThrough(int64_t stage);

  // The grads of [begin, end) as f32 and their staging copy as bf16, on ctx_'s device.
  TensorView GradView(int64_t begin, int64_t end) const;
  TensorView StagingView(int64_t begin, int64_t end) const;

  ExecContext ctx_;
  bool sharded_;
  DType reduce_dtype_;           // f32 or bf16
  Tensor staging_;               // (N) bf16, allocated at the first bf16 start
  int64_t size_;                 // N, the grad buffer's elements
  float* grads_;                 // (N) f32: the model's grad buffer, on ctx_'s device
  std::vector<Bucket> buckets_;  // in start order
  size_t next_ = 0;              // the first bucket not started
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_GRAD_SYNC_H_
