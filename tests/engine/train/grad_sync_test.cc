// GradSync on dp = 2 × ep = 2 ranks (threads of this process, Gloo over TCP loopback): every
// bucket is summed over the right group, started in backward order, whatever stage backward
// stopped at.
#include "engine/train/grad_sync.h"

#include <memory>
#include <vector>

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

// What rank r puts into grad element i before the sums.
float Grad(int rank, int64_t i) { return static_cast<float>((rank + 1) * (i % 7)); }

void ExpectSums(int stop_stage) {
  TempDir dir;
  constexpr int kRanks = 4;
  std::vector<std::unique_ptr<GlooCommunicator>> world = MakeGlooWorld(dir.path(), kRanks);
  ASSERT_EQ(world.size(), static_cast<size_t>(kRanks));
  std::vector<std::unique_ptr<ParallelGroups>> groups(kRanks);
  std::vector<std::unique_ptr<Transformer>> models(kRanks);
  std::vector<int64_t> buckets(kRanks);
  std::vector<absl::Status> statuses(kRanks);
  RunRanks(kRanks, [&](int rank) {
    const ParallelConfig config = {
        .expert_parallel = 2, .data_parallel = 2, .grad_bucket_bytes = 4096};
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
    for (int64_t i = 0; i < grads.numel(); ++i) grads.data<float>()[i] = Grad(rank, i);
    GradSync sync(*groups[rank], *models[rank], ExecContext::Cpu());
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
    for (int64_t i = 0; i < model.grad_buffer().numel(); ++i) {
      // Dense: over the world; experts: over the replicas of this rank's shard.
      const float want = i < model.dense_size() ? Grad(0, i) + Grad(1, i) + Grad(2, i) + Grad(3, i)
                                                : Grad(ep_rank, i) + Grad(ep_rank + 2, i);
      ASSERT_EQ(grads[i], want) << "element " << i << " of " << model.grad_buffer().numel();
    }
  }
}

TEST(GradSyncTest, SumsDenseOverTheWorldAndExpertsOverTheirReplicas) { ExpectSums(4); }

TEST(GradSyncTest, FinishStartsWhatBackwardDidNotReach) { ExpectSums(1); }

}  // namespace
}  // namespace moetrain
