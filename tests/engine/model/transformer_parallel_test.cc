// The model's layout for parallel training: expert-parallel ranks' slices of the experts, and the
// grad stages backward completes in order (what overlapped grad sync waits on).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/core/tensor.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"
#include "tests/engine/model/transformer_test_util.h"

namespace moetrain::transformer_test {
namespace {

// Expert parallel: rank j of an expert group of 2 holds experts [2j, 2j + 2) of the 4, with the
// values the single-rank model of the same seed gives them; everything else is whole.
TEST(TransformerTest, ExpertParallelRanksHoldTheirSliceOfTheSingleRankInit) {
  ModelConfig c = TinyConfig();
  c.num_layers = 3;  // two MoE blocks
  const Transformer whole = MakeModel(c, DType::kF32, 7);
  testutil::TempDir dir;
  std::vector<std::unique_ptr<GlooCommunicator>> group = comm_test::MakeGlooWorld(dir.path(), 2);
  ASSERT_EQ(group.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    absl::StatusOr<Transformer> part =
        Transformer::Create(c, DType::kF32, {.expert_group = group[rank].get()});
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_OK(part->Initialize(7));
    EXPECT_EQ(part->first_local_expert(), 2 * rank);
    EXPECT_EQ(part->num_local_experts(), 2);
    // 2 MoE layers × 2 other experts × (gate, up, down) fewer.
    EXPECT_EQ(part->parameters().size() + 12, whole.parameters().size());
    std::map<std::string, const NamedParameter*> by_name;
    for (const NamedParameter& p : whole.parameters()) by_name[p.name] = &p;
    for (const NamedParameter& p : part->parameters()) {
      SCOPED_TRACE(p.name);
      ASSERT_TRUE(by_name.contains(p.name));
      const NamedParameter& want = *by_name[p.name];
      EXPECT_EQ(p.expert, p.name.find(".mlp.experts.") != std::string::npos);
      EXPECT_EQ(p.expert, want.expert);
      if (p.expert) {
        const int expert = std::stoi(p.name.substr(p.name.find(".experts.") + 9));
        EXPECT_EQ(expert / 2, rank);
      }
      ASSERT_EQ(p.value.shape(), want.value.shape());
      EXPECT_EQ(Copy(p.value), Copy(want.value));
    }
  }
}

// The buffer holds the dense part first, then the routed experts, each in the order backward
// completes it; grad_stages() names those ranges.
TEST(TransformerTest, GradStagesTileTheBufferInBackwardOrder) {
  for (const ModelConfig& c : {TinyConfig(), TinySoftmaxTiedConfig()}) {
    const Transformer model = MakeModel(c, DType::kF32, 1);
    const std::vector<GradStage>& stages = model.grad_stages();
    const int64_t layers = c.num_layers;
    ASSERT_EQ(static_cast<int64_t>(stages.size()), layers + 2);
    int64_t dense = 0, expert = model.dense_size();
    for (const GradStage& s : stages) {
      EXPECT_EQ(s.dense_begin, dense);
      EXPECT_EQ(s.expert_begin, expert);
      dense = s.dense_end;
      expert = s.expert_end;
    }
    EXPECT_EQ(dense, model.dense_size());
    EXPECT_EQ(expert, model.grad_buffer().numel());
    // The stage each parameter's grad is final after.
    const auto stage_of = [&](const std::string& name) -> int64_t {
      if (name == "model.embed_tokens.weight") return layers + 1;
      if (name == "model.norm.weight" || name == "lm_head.weight") return 0;
      return layers - std::stoi(name.substr(std::string("model.layers.").size()));
    };
    const float* base = model.grad_buffer().data<float>();
    for (const NamedParameter& p : model.parameters()) {
      SCOPED_TRACE(p.name);
      const int64_t begin = p.grad.data<float>() - base, end = begin + p.grad.numel();
      const GradStage& s = stages[stage_of(p.name)];
      EXPECT_GE(begin, p.expert ? s.expert_begin : s.dense_begin);
      EXPECT_LE(end, p.expert ? s.expert_end : s.dense_end);
    }
  }
}

TEST(TransformerTest, BackwardReportsEveryStageInOrder) {
  Transformer model = MakeModel(TinyConfig(), DType::kF32, 3);
  const Tensor tokens = RandomTokens(2, 5, TinyConfig().vocab_size, 5);
  std::vector<int64_t> stages;
  BackwardOptions options;
  options.on_stage_done = [&](int64_t stage) {
    stages.push_back(stage);
    return absl::OkStatus();
  };
  ASSERT_OK(model.ForwardBackward(tokens, options).status());
  EXPECT_EQ(stages, (std::vector<int64_t>{0, 1, 2, 3}));
  // An error from the callback stops backward and is returned.
  options.on_stage_done = [](int64_t stage) {
    return stage == 1 ? absl::UnavailableError("peer lost") : absl::OkStatus();
  };
  EXPECT_EQ(model.ForwardBackward(tokens, options).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moetrain::transformer_test
