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
// With Sharding::kGradients (ZeRO-2) as kOptimizer, and a rank keeps the summed gradients of its
// own blocks only. Every micro-batch's backward reduces (BeginMicroBatch), not the last one's
// alone: a bucket's reduce-scatter starts once backward has finished it, and once it is done
// (waited for on the CPU when backward has gone two stages further, else at the micro-batch's
// end) the elements of the bucket this rank does not keep are let go of (on the CPU their pages go
// back to the system: DiscardHostRange; on a device they are zeroed, the memory kept) and read as
// zero at the next backward. The sums of a step's earlier micro-batches are added up in f32 in an
// accumulator as large as the kept blocks, and added to the last micro-batch's sums, so a rank
// holds its blocks, the accumulator and the buckets in flight, not the whole buffer. With one
// micro-batch a step the sums are kOptimizer's bits; with several, each micro-batch is summed over
// the ranks before the micro-batches are added (kOptimizer adds each rank's micro-batches first),
// which rounds differently.
//
// With ParallelConfig::grad_reduce_dtype = bf16 a bucket is rounded to bf16 into a staging
// buffer (2 bytes a gradient element of the buckets) when it starts, summed there in bf16
// (Communicator::StartAllReduceSum: on Gloo in f32 and rounded once), and the sums this rank keeps
// widened back into the f32 grads once the bucket's collective is done. With kGradients that is
// every micro-batch's gradients, each rounded and summed on its own (the accumulator is f32).
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

  // Micro-batch m of the step's `micro_batches` begins its forward and backward. Its backward
  // reduces when it is the last or the gradients are sharded (kGradients).
  void BeginMicroBatch(int64_t m, int64_t micro_batches);
  // Backward stage `stage` of a micro-batch that reduces is done: starts the buckets it completes
  // (BackwardOptions::on_stage_done); with kGradients, ends those two stages older.
  absl::Status StageDone(int64_t stage);
  // A micro-batch but the step's last is done: with kGradients, starts and ends its remaining
  // buckets, adding the sums this rank keeps into the accumulator; else nothing to do.
  absl::Status EndMicroBatch();
  // The step's last micro-batch (or the one backward stopped early in) is done: starts the
  // buckets not started yet (all of them when backward stopped early), then waits for every one.
  // With kGradients, a step that stopped before its last micro-batch first runs the reductions of
  // the micro-batches it skipped, as the ranks that did not stop run them: every rank's
  // collectives pair up. After it the grads are summed; the next step starts from no bucket in
  // flight.
  absl::Status Finish();
  // Zeros the grads for the next step: the whole buffer, or with kGradients the ranges this rank
  // keeps (OwnedRanges), the others let go of.
  absl::Status ZeroGrads();
  // With kGradients, the f32 accumulator of the kept sums of a step's earlier micro-batches
  // (allocated at the first step with several); else empty.
  const Tensor& accumulator() const { return accumulated_; }

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
    int64_t accumulated_at = 0;            // kGradients: its kept block's offset in accumulated_
    std::unique_ptr<CommRequest> request;  // in flight, from its start to its end
  };

  // The elements [begin, end) of the buffer whose sums this rank keeps of `bucket`: all of them
  // unsharded, its own block sharded.
  std::pair<int64_t, int64_t> KeptRange(const Bucket& bucket) const;
  // Starts buckets_[next_ …] while their last stage is ≤ `stage`.
  absl::Status StartThrough(int64_t stage);
  // Waits for the started buckets buckets_[ended_ …] while their last stage is ≤ `stage`, and
  // ends each (EndBucket).
  absl::Status EndThrough(int64_t stage);
  // After its collective: the bf16 sums this rank keeps widened into the f32 grads; with
  // kGradients, the kept sums added into the accumulator (not the last micro-batch) or the
  // accumulator's added to them (the last), and the rest of the bucket let go of.
  absl::Status EndBucket(Bucket& bucket);
  // Elements [begin, end) of the grads read as zero, their memory let go of where it can be.
  absl::Status Discard(int64_t begin, int64_t end);

  // The grads of [begin, end) as f32 and their staging copy as bf16, on ctx_'s device.
  TensorView GradView(int64_t begin, int64_t end) const;
  TensorView StagingView(int64_t begin, int64_t end) const;

  ExecContext ctx_;
  bool sharded_;                 // kOptimizer or kGradients
  bool frees_;                   // kGradients
  DType reduce_dtype_;           // f32 or bf16
  Tensor staging_;               // (N) bf16, allocated at the first bf16 start
  int64_t size_;                 // N, the grad buffer's elements
  float* grads_;                 // (N) f32: the model's grad buffer, on ctx_'s device
  std::vector<Bucket> buckets_;  // in start order
  size_t next_ = 0;              // the first bucket not started
  size_t ended_ = 0;             // the first bucket not ended
  int64_t micro_batch_ = 0;      // the micro-batch under way, of micro_batches_
  int64_t micro_batches_ = 1;
  bool reducing_ = true;  // this micro-batch's backward reduces
  bool last_ = true;      // this micro-batch is the step's last
  // kGradients: Σ of the kept blocks' elements, and their sums over the step's micro-batches so
  // far (f32, on ctx_'s device); `accumulating_`: it holds some this step.
  int64_t kept_elements_ = 0;
  Tensor accumulated_;
  bool accumulating_ = false;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_GRAD_SYNC_H_
