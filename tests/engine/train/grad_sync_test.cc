// GradSync on dp = 2 × ep = 2 ranks (threads of this process, Gloo over TCP loopback): every
// bucket is summed over the right group, started in backward order, whatever stage backward
// stopped at; sharded gradients keep only their blocks, over several micro-batches too.
#include "engine/train/grad_sync.h"

#include <unistd.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "engine/core/dtype_math.h"
#include "engine/core/host_pages.h"
#include "engine/core/status.h"
#include "engine/train/parallel.h"
#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"

namespace moetrain {
namespace {

using comm_test::MakeGlooWorld;
using comm_test::RunRanks;
using testutil::TempDir;

ModelConfig TinyModel() {
  ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 16;
  c.num_layers = 3;
  c.num_heads = 2;
  c.num_kv_heads = 2;
  c.ffn_dim = 32;
  c.first_dense_layers = 1;
  c.max_seq_len = 8;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.expert_ffn_dim = 16;
  c.moe.num_shared_experts = 1;
  return c;
}

// What rank r puts into grad element i before the sums: integers, exact in f32 sums; with
// `fractional`, values bf16 cannot hold.
float Grad(int rank, int64_t i, bool fractional = false) {
  const float whole = static_cast<float>((rank + 1) * (i % 7));
  return fractional ? 1.0f + whole / 1000.0f : whole;
}

// The sum over `ranks` (in rank order) of their grads of element i, as a bf16 reduction gives it:
// each rounded to bf16, added in f32, the sum rounded to bf16 and widened back.
float Bf16Sum(std::initializer_list<int> ranks, int64_t i) {
  float sum = 0;
  for (int r : ranks) sum += BF16BitsToFloat(FloatToBF16Bits(Grad(r, i, true)));
  return BF16BitsToFloat(FloatToBF16Bits(sum));
}

void ExpectSums(int stop_stage, DType reduce = DType::kF32, Sharding sharding = Sharding::kNone) {
  const bool bf16 = reduce == DType::kBF16;
  TempDir dir;
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<GlooCommunicator>> world = MakeGlooWorld(dir.path(), kRanks);
  ASSERT_EQ(world.size(), static_cast<size_t>(kRanks));
  std::vector<std::unique_ptr<ParallelGroups>> groups(kRanks);
  std::vector<std::unique_ptr<Transformer>> models(kRanks);
  std::vector<int64_t> buckets(kRanks);
  std::vector<absl::Status> statuses(kRanks);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> owned(kRanks);
  RunRanks(kRanks, [&](int rank) {
    const ParallelConfig config = {.expert_parallel = 2,
                                   .data_parallel = 2,
                                   .sharding = sharding,
                                   .grad_reduce_dtype = reduce,
                                   .grad_bucket_bytes = 4096};
    absl::StatusOr<std::unique_ptr<ParallelGroups>> made =
        ParallelGroups::Create(config, std::shared_ptr<Communicator>(std::move(world[rank])));
    if (!made.ok()) {
      statuses[rank] = made.status();
      return;
    }
    groups[rank] = *std::move(made);
    absl::StatusOr<Transformer> model =
        Transformer::Create(TinyModel(), DType::kF32, groups[rank]->moe_parallel());
    if (!model.ok()) {
      statuses[rank] = model.status();
      return;
    }
    models[rank] = std::make_unique<Transformer>(*std::move(model));
    TensorView grads = models[rank]->grad_buffer();
    for (int64_t i = 0; i < grads.numel(); ++i) grads.data<float>()[i] = Grad(rank, i, bf16);
    GradSync sync(*groups[rank], *models[rank], ExecContext::Cpu());
    owned[rank] = sync.OwnedRanges();
    buckets[rank] = sync.num_buckets();
    // Backward reports its stages up to `stop_stage` (as when it stopped early); Finish starts
    // the rest.
    for (int64_t stage = 0; stage <= stop_stage && statuses[rank].ok(); ++stage) {
      statuses[rank] = sync.StageDone(stage);
    }
    if (statuses[rank].ok()) statuses[rank] = sync.Finish();
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_TRUE(statuses[rank].ok()) << statuses[rank];
    EXPECT_GT(buckets[rank], 4) << "the test wants several buckets of each kind";
    const Transformer& model = *models[rank];
    const float* grads = model.grad_buffer().data<float>();
    const int ep_rank = rank % 2;
    int64_t checked = 0;
    for (const auto& [begin, end] : owned[rank]) {
      for (int64_t i = begin; i < end; ++i, ++checked) {
        // Dense: over the world; experts: over the replicas of this rank's shard.
        const bool dense = i < model.dense_size();
        const float want =
            bf16    ? (dense ? Bf16Sum({0, 1, 2, 3}, i) : Bf16Sum({ep_rank, ep_rank + 2}, i))
            : dense ? Grad(0, i) + Grad(1, i) + Grad(2, i) + Grad(3, i)
                    : Grad(ep_rank, i) + Grad(ep_rank + 2, i);
        ASSERT_EQ(grads[i], want) << "element " << i << " of " << model.grad_buffer().numel();
      }
    }
    // Sharded, each rank holds about a quarter of the dense sums and half of its experts'.
    EXPECT_GT(checked, sharding == Sharding::kNone ? model.grad_buffer().numel() - 1
                                                   : model.grad_buffer().numel() / 5);
    // Sharded gradients: the rest was let go of, and reads zero.
    if (sharding == Sharding::kGradients) {
      int64_t at = 0;
      for (const auto& [begin, end] : owned[rank]) {
        for (int64_t i = at; i < begin; ++i) ASSERT_EQ(grads[i], 0.0f) << "element " << i;
        at = end;
      }
      for (int64_t i = at; i < model.grad_buffer().numel(); ++i) ASSERT_EQ(grads[i], 0.0f) << i;
    }
  }
}

TEST(GradSyncTest, SumsDenseOverTheWorldAndExpertsOverTheirReplicas) { ExpectSums(4); }

TEST(GradSyncTest, FinishStartsWhatBackwardDidNotReach) {
  ExpectSums(1);
  ExpectSums(1, DType::kF32, Sharding::kGradients);
}

TEST(GradSyncTest, ShardedGradientsKeepTheirBlocksAndLetGoOfTheRest) {
  ExpectSums(4, DType::kF32, Sharding::kGradients);
}

// parallel.grad_reduce_dtype = BF16: each rank's grads rounded to bf16, summed in f32 in rank
// order on Gloo and rounded once, widened back into the f32 grads; all-reduced or, sharded,
// reduce-scattered (the rank's own blocks only).
TEST(GradSyncTest, Bf16ReductionRoundsEachRanksGradsAndTheSumOnce) {
  ExpectSums(4, DType::kBF16);
  ExpectSums(2, DType::kBF16, Sharding::kOptimizer);
  ExpectSums(4, DType::kBF16, Sharding::kGradients);
}

// Runs `body` on dp 2 × ep 2 ranks (threads, Gloo over TCP loopback) grouped with sharded
// gradients in buckets of `bucket_bytes`, and expects every rank to return OK.
void OnShardedGradientRanks(
    int64_t bucket_bytes,
    const std::function<absl::Status(int rank, const ParallelGroups& groups)>& body) {
  TempDir dir;
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<GlooCommunicator>> world = MakeGlooWorld(dir.path(), kRanks);
  ASSERT_EQ(world.size(), static_cast<size_t>(kRanks));
  std::vector<absl::Status> statuses(kRanks);
  RunRanks(kRanks, [&](int rank) {
    const ParallelConfig config = {.expert_parallel = 2,
                                   .data_parallel = 2,
                                   .sharding = Sharding::kGradients,
                                   .grad_bucket_bytes = bucket_bytes};
    absl::StatusOr<std::unique_ptr<ParallelGroups>> groups =
        ParallelGroups::Create(config, std::shared_ptr<Communicator>(std::move(world[rank])));
    statuses[rank] = groups.ok() ? body(rank, **groups) : groups.status();
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
  }
}

// Sharded gradients reduce every micro-batch: a rank whose backward stopped early (a non-finite
// forward) runs the reductions of the micro-batches it skipped in Finish, so that its collectives
// pair up with those of the ranks that trained on.
TEST(GradSyncTest, ARankThatStopsEarlyStillRunsTheStepsReductions) {
  constexpr int kMicroBatches = 3;
  OnShardedGradientRanks(4096, [&](int rank, const ParallelGroups& groups) -> absl::Status {
    MOETRAIN_ASSIGN_OR_RETURN(Transformer model,
                              Transformer::Create(TinyModel(), DType::kF32, groups.moe_parallel()));
    GradSync sync(groups, model, ExecContext::Cpu());
    const int64_t stages = static_cast<int64_t>(model.grad_stages().size());
    for (int step = 0; step < 2; ++step) {  // the step after pairs up too
      MOETRAIN_RETURN_IF_ERROR(sync.ZeroGrads());
      for (int m = 0; m < kMicroBatches; ++m) {
        sync.BeginMicroBatch(m, kMicroBatches);
        // Rank 0 stops in the first micro-batch of the first step, after its first stage.
        const bool stops = rank == 0 && step == 0 && m == 0;
        for (int64_t stage = 0; stage < (stops ? 1 : stages); ++stage) {
          MOETRAIN_RETURN_IF_ERROR(sync.StageDone(stage));
        }
        if (stops) break;
        if (m < kMicroBatches - 1) MOETRAIN_RETURN_IF_ERROR(sync.EndMicroBatch());
      }
      MOETRAIN_RETURN_IF_ERROR(sync.Finish());
    }
    return absl::OkStatus();
  });
}

// Sharded gradients over three micro-batches, as the trainer drives them (each backward adds its
// grads; each micro-batch's stages reduce): every rank ends with the sum over the ranks and the
// micro-batches of its blocks, the rest zero, and the pages of what it let go of out of memory.
TEST(GradSyncTest, ShardedGradientsAddUpMicroBatchesAndLetTheirPagesGo) {
  constexpr int kMicroBatches = 3;
  OnShardedGradientRanks(64 << 10, [&](int rank, const ParallelGroups& groups) -> absl::Status {
    ModelConfig big = TinyModel();  // blocks of several pages
    big.vocab_size = 2048;
    big.hidden_size = 128;
    big.ffn_dim = 512;
    big.moe.expert_ffn_dim = 256;
    MOETRAIN_ASSIGN_OR_RETURN(Transformer model,
                              Transformer::Create(big, DType::kF32, groups.moe_parallel()));
    GradSync sync(groups, model, ExecContext::Cpu());
    MOETRAIN_RETURN_IF_ERROR(sync.ZeroGrads());
    float* grads = model.grad_buffer().data<float>();
    const int64_t n = model.grad_buffer().numel();
    const int64_t stages = static_cast<int64_t>(model.grad_stages().size());
    for (int m = 0; m < kMicroBatches; ++m) {
      sync.BeginMicroBatch(m, kMicroBatches);
      for (int64_t i = 0; i < n; ++i) grads[i] += Grad(rank, i);
      for (int64_t stage = 0; stage < stages; ++stage) {
        MOETRAIN_RETURN_IF_ERROR(sync.StageDone(stage));
      }
      MOETRAIN_RETURN_IF_ERROR(m == kMicroBatches - 1 ? sync.Finish() : sync.EndMicroBatch());
    }
    // Measured before the reads below, which map the kernel's zero page where they look.
    MOETRAIN_ASSIGN_OR_RETURN(const int64_t resident, ResidentHostBytes(grads, n * sizeof(float)));
    const int ep_rank = rank % 2;
    int64_t at = 0, kept = 0;
    for (const auto& [begin, end] : sync.OwnedRanges()) {
      for (int64_t i = at; i < begin; ++i) EXPECT_EQ(grads[i], 0.0f) << "element " << i;
      for (int64_t i = begin; i < end; ++i) {
        const float once = i < model.dense_size()
                               ? Grad(0, i) + Grad(1, i) + Grad(2, i) + Grad(3, i)
                               : Grad(ep_rank, i) + Grad(ep_rank + 2, i);
        EXPECT_EQ(grads[i], kMicroBatches * once) << "element " << i;
      }
      kept += end - begin;
      at = end;
    }
    for (int64_t i = at; i < n; ++i) EXPECT_EQ(grads[i], 0.0f) << "element " << i;
    EXPECT_EQ(sync.accumulator().view().numel(), kept);
    // What stays in memory: the kept blocks and the pages they share with let-go neighbours.
    EXPECT_GE(resident, kept * 4);
    EXPECT_LT(resident, kept * 4 + 3 * sync.num_buckets() * sysconf(_SC_PAGESIZE))
        << "of " << n * 4 << " bytes";
    EXPECT_LT(kept, n * 2 / 5);
    return absl::OkStatus();
  });
}

}  // namespace
}  // namespace moetrain
