#include "engine/fp8/fp8_state.h"

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/comm/local_communicator.h"
#include "engine/core/fp8_math.h"
#include "gtest/gtest.h"
#include "tests/engine/comm/comm_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Fp8RecipeConfig Delayed(int64_t history_len, int margin, bool most_recent) {
  Fp8RecipeConfig config;
  config.recipe = Fp8RecipeKind::kDelayed;
  config.amax_history_len = history_len;
  config.margin = margin;
  config.amax_most_recent = most_recent;
  return config;
}

// On a CPU context the slots are host memory: a test stands in for the quantise ops by writing
// the step's statistics there.
void Record(const Fp8State& state, int linear, int64_t group, Fp8Role role, float amax,
            int64_t saturated = 0) {
  const Fp8State::Slot slot = state.slot(linear, group, role);
  ASSERT_FALSE(slot.amax.empty());
  slot.amax.data<float>()[0] = amax;
  slot.saturated.data<int64_t>()[0] = saturated;
}

float Scale(const Fp8State& state, int linear, int64_t group, Fp8Role role) {
  return state.slot(linear, group, role).scale.data<float>()[0];
}

uint32_t Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

TEST(Fp8StateTest, SlotsStartAtScaleOneAndZeroStatistics) {
  Fp8State state(Delayed(4, 0, false), ExecContext::Cpu());
  EXPECT_EQ(state.Register("model.layers.0.self_attn.q_proj", 1), 0);
  EXPECT_EQ(state.Register("model.layers.0.mlp.experts.gate_up_proj", 3), 1);
  EXPECT_EQ(state.Register("bad", 0), -1);
  EXPECT_TRUE(state.slot(0, 0, Fp8Role::kInput).scale.empty());  // not allocated yet
  ASSERT_OK(state.Allocate());
  EXPECT_EQ(state.Register("late", 1), -1);
  EXPECT_EQ(state.Allocate().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(state.linears().size(), 2u);
  EXPECT_EQ(state.linears()[1].name, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(state.linears()[1].groups, 3);
  for (int linear = 0; linear < 2; ++linear) {
    for (int64_t g = 0; g < state.linears()[linear].groups; ++g) {
      for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
        const Fp8State::Slot slot = state.slot(linear, g, role);
        ASSERT_EQ(slot.scale.numel(), 1);
        EXPECT_EQ(slot.scale.data<float>()[0], 1.0f);
        EXPECT_EQ(slot.amax.data<float>()[0], 0.0f);
        EXPECT_EQ(slot.saturated.data<int64_t>()[0], 0);
      }
    }
    EXPECT_EQ(state.last_stats(linear).size(), static_cast<size_t>(state.linears()[linear].groups));
  }
  // Distinct slots.
  EXPECT_NE(state.slot(1, 2, Fp8Role::kGrad).amax.raw(),
            state.slot(1, 1, Fp8Role::kGrad).amax.raw());
  EXPECT_NE(state.slot(1, 0, Fp8Role::kInput).amax.raw(),
            state.slot(0, 0, Fp8Role::kGrad).amax.raw());
  EXPECT_TRUE(state.slot(1, 3, Fp8Role::kInput).amax.empty());
  EXPECT_TRUE(state.slot(2, 0, Fp8Role::kInput).amax.empty());
  EXPECT_TRUE(state.slot(-1, 0, Fp8Role::kInput).amax.empty());
  EXPECT_TRUE(state.recording());
  state.set_recording(false);
  EXPECT_FALSE(state.recording());
}

// History length 3, margin 1, amax = max of the history: scale = 448·2^-1 / amax for the E4M3
// input. Worked by hand from the roll new = [0, h[2], h[0]].
TEST(Fp8StateTest, DelayedMaxOverTheHistoryByHand) {
  Fp8State state(Delayed(3, 1, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  struct Step {
    float amax;        // this step's input amax
    float used_scale;  // the scale the step quantised with (last_stats)
    float new_scale;   // after EndStep
  };
  const Step steps[] = {
      {2.0f, 1.0f, 112.0f},    // h = [2, 0, 0]   → max 2; h' = [0, 0, 2]
      {4.0f, 112.0f, 56.0f},   // h = [4, 0, 2]   → max 4; h' = [0, 2, 4]
      {1.0f, 56.0f, 56.0f},    // h = [1, 2, 4]   → max 4; h' = [0, 4, 1]
      {0.5f, 56.0f, 56.0f},    // h = [0.5, 4, 1] → max 4; h' = [0, 1, 0.5]
      {0.25f, 56.0f, 224.0f},  // h = [.25, 1, .5] → max 1; h' = [0, .5, .25]
      {0.0f, 224.0f, 448.0f},  // h = [0, .5, .25] → max .5
      {0.0f, 448.0f, 896.0f},  // h = [0, .25, 0]  → max .25
      {0.0f, 896.0f, 896.0f},  // h = [0, 0, 0]    → 0: the old scale stays
  };
  for (const Step& step : steps) {
    SCOPED_TRACE(step.amax);
    Record(state, id, 0, Fp8Role::kInput, step.amax, 3);
    ASSERT_OK(state.EndStep(nullptr));
    const Fp8State::SlotStats& stats = state.last_stats(id)[0];
    EXPECT_EQ(stats.amax[0], step.amax);
    EXPECT_EQ(stats.saturated[0], 3);
    EXPECT_EQ(stats.scale[0], step.used_scale);
    EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), step.new_scale);
    // The step's statistics are zeroed for the next.
    EXPECT_EQ(state.slot(id, 0, Fp8Role::kInput).amax.data<float>()[0], 0.0f);
    EXPECT_EQ(state.slot(id, 0, Fp8Role::kInput).saturated.data<int64_t>()[0], 0);
    // The other roles saw amax 0 throughout: their scales stay 1.
    EXPECT_EQ(Scale(state, id, 0, Fp8Role::kWeight), 1.0f);
    EXPECT_EQ(Scale(state, id, 0, Fp8Role::kGrad), 1.0f);
  }
}

TEST(Fp8StateTest, DelayedMostRecentKeepsTheOldScaleForZeroInfAndNaN) {
  Fp8State state(Delayed(3, 0, true), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  const struct {
    float amax, new_scale;
  } steps[] = {{2.0f, 224.0f}, {0.0f, 224.0f}, {kInf, 224.0f}, {kNaN, 224.0f},
               {448.0f, 1.0f}, {0.5f, 896.0f}, {8.0f, 56.0f}};  // most_recent: the larger amaxes in
                                                                // the history do not count
  for (const auto& step : steps) {
    SCOPED_TRACE(step.amax);
    Record(state, id, 0, Fp8Role::kInput, step.amax);
    ASSERT_OK(state.EndStep(nullptr));
    EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), step.new_scale);
  }
}

TEST(Fp8StateTest, DelayedMaxSkipsNaNAndKeepsTheScaleForInf) {
  Fp8State state(Delayed(2, 0, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  Record(state, id, 0, Fp8Role::kInput, 7.0f);
  ASSERT_OK(state.EndStep(nullptr));  // h = [7, 0]: 64; h' = [0, 7]
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 64.0f);
  // Transformer Engine reduces the history with fmaxf from 0: a NaN drops out of the max.
  Record(state, id, 0, Fp8Role::kInput, kNaN);
  ASSERT_OK(state.EndStep(nullptr));  // h = [NaN, 7]: 64; h' = [0, NaN]
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 64.0f);
  EXPECT_TRUE(std::isnan(state.last_stats(id)[0].amax[0]));
  Record(state, id, 0, Fp8Role::kInput, 14.0f);
  ASSERT_OK(state.EndStep(nullptr));  // h = [14, NaN]: 32; h' = [0, 14]
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 32.0f);
  Record(state, id, 0, Fp8Role::kInput, kInf);
  ASSERT_OK(state.EndStep(nullptr));  // h = [inf, 14]: inf keeps 32; h' = [0, inf]
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 32.0f);
  Record(state, id, 0, Fp8Role::kInput, 1.0f);
  ASSERT_OK(state.EndStep(nullptr));  // h = [1, inf]: still inf; h' = [0, 1]
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 32.0f);
  Record(state, id, 0, Fp8Role::kInput, 0.0f);
  ASSERT_OK(state.EndStep(nullptr));  // h = [0, 1]: 448
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 448.0f);
}

TEST(Fp8StateTest, DelayedHistoryOfOneIsTheStepsAmax) {
  Fp8State state(Delayed(1, 0, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  for (float amax : {4.0f, 0.0f, 8.0f, kNaN, 2.0f}) {
    Record(state, id, 0, Fp8Role::kInput, amax);
    ASSERT_OK(state.EndStep(nullptr));
  }
  // 4 → 112; 0 and NaN keep the scale; 8 → 56; 2 → 224.
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 224.0f);
}

TEST(Fp8StateTest, DelayedMarginAndFormatPerRole) {
  // margin 3: 448/8 = 56 for E4M3, 57344/8 = 7168 for the E5M2 gradient.
  Fp8State state(Delayed(4, 3, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  Record(state, id, 0, Fp8Role::kInput, 0.5f);
  Record(state, id, 0, Fp8Role::kWeight, 0.25f);
  Record(state, id, 0, Fp8Role::kGrad, 2.0f);
  ASSERT_OK(state.EndStep(nullptr));
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), 112.0f);
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kWeight), 224.0f);
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kGrad), 3584.0f);

  // Not hybrid: the gradient is E4M3 too.
  Fp8RecipeConfig e4m3 = Delayed(4, 0, false);
  e4m3.hybrid = false;
  Fp8State all_e4m3(e4m3, ExecContext::Cpu());
  const int other = all_e4m3.Register("linear", 1);
  ASSERT_OK(all_e4m3.Allocate());
  Record(all_e4m3, other, 0, Fp8Role::kGrad, 57344.0f);
  ASSERT_OK(all_e4m3.EndStep(nullptr));
  EXPECT_EQ(Scale(all_e4m3, other, 0, Fp8Role::kGrad), 448.0f / 57344.0f);
}

TEST(Fp8StateTest, DelayedScaleThatOverflowsIsFltMax) {
  Fp8State state(Delayed(2, 0, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  const float tiny = std::numeric_limits<float>::denorm_min();
  ASSERT_TRUE(std::isinf(448.0f / tiny));
  Record(state, id, 0, Fp8Role::kInput, tiny);
  ASSERT_OK(state.EndStep(nullptr));
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kInput), FLT_MAX);
  // A finite quotient is kept as it is, however large.
  Record(state, id, 0, Fp8Role::kWeight, 1e-30f);
  ASSERT_OK(state.EndStep(nullptr));
  EXPECT_EQ(Scale(state, id, 0, Fp8Role::kWeight), 448.0f / 1e-30f);
}

// IEEE division as the kernel does it, for amaxes whose quotient is not exact.
TEST(Fp8StateTest, DelayedScaleIsOneFloatDivision) {
  Fp8State state(Delayed(1, 2, false), ExecContext::Cpu());
  const int id = state.Register("linear", 1);
  ASSERT_OK(state.Allocate());
  for (float amax : {3.0f, 0.1f, 123.456f, 1e-3f}) {
    Record(state, id, 0, Fp8Role::kInput, amax);
    Record(state, id, 0, Fp8Role::kGrad, amax);
    ASSERT_OK(state.EndStep(nullptr));
    const volatile float e4m3_scaled = 448.0f * 0.25f, e5m2_scaled = 57344.0f * 0.25f;
    EXPECT_EQ(Bits(Scale(state, id, 0, Fp8Role::kInput)), Bits(e4m3_scaled / amax)) << amax;
    EXPECT_EQ(Bits(Scale(state, id, 0, Fp8Role::kGrad)), Bits(e5m2_scaled / amax)) << amax;
  }
}

TEST(Fp8StateTest, StatsOfTheOtherRecipes) {
  // Current scaling reports the scale of the step's amax by the quantise op's formula; the block
  // scalings report 0; none keeps a scale between steps.
  for (Fp8RecipeKind recipe :
       {Fp8RecipeKind::kCurrent, Fp8RecipeKind::kBlockwise, Fp8RecipeKind::kMxfp8}) {
    SCOPED_TRACE(std::string(Fp8RecipeName(recipe)));
    Fp8RecipeConfig config;
    config.recipe = recipe;
    config.pow2_scales = recipe == Fp8RecipeKind::kCurrent;
    Fp8State state(config, ExecContext::Cpu());
    const int id = state.Register("linear", 2);
    ASSERT_OK(state.Allocate());
    Record(state, id, 1, Fp8Role::kInput, 3.0f, 5);
    Record(state, id, 1, Fp8Role::kGrad, 0.0f, 0);
    ASSERT_OK(state.EndStep(nullptr));
    const Fp8State::SlotStats& stats = state.last_stats(id)[1];
    EXPECT_EQ(stats.amax[0], 3.0f);
    EXPECT_EQ(stats.saturated[0], 5);
    if (recipe == Fp8RecipeKind::kCurrent) {
      EXPECT_EQ(stats.scale[0], 128.0f);  // 448/3 = 149.3, rounded down to a power of two
      EXPECT_EQ(stats.scale[2], 1.0f);    // amax 0
    } else {
      EXPECT_EQ(stats.scale[0], 0.0f);
      EXPECT_EQ(stats.scale[2], 0.0f);
    }
    EXPECT_EQ(Scale(state, id, 1, Fp8Role::kInput), 1.0f);
    EXPECT_EQ(state.slot(id, 1, Fp8Role::kInput).amax.data<float>()[0], 0.0f);
    EXPECT_EQ(state.slot(id, 1, Fp8Role::kInput).saturated.data<int64_t>()[0], 0);
  }
}

TEST(Fp8StateTest, LocalWorldOfOneIsThisRankAlone) {
  LocalCommunicator local;
  Fp8State state(Delayed(2, 0, false), ExecContext::Cpu());
  const int id = state.Register("experts", 2);
  ASSERT_OK(state.Allocate());
  Record(state, id, 1, Fp8Role::kWeight, 4.0f, 9);
  ASSERT_OK(state.EndStep(&local));
  EXPECT_EQ(state.last_stats(id)[1].amax[1], 4.0f);
  EXPECT_EQ(state.last_stats(id)[1].saturated[1], 9);
  EXPECT_EQ(Scale(state, id, 1, Fp8Role::kWeight), 112.0f);
}

// Two ranks (Gloo over loopback, a thread each): a dense linear both fill, and an expert linear
// with one group per global expert, each rank filling only its own experts' slots. Amaxes are
// max-reduced (NaN wins), counts summed, and the delayed scales come out the same on both.
TEST(Fp8StateTest, EndStepReducesOverTheRanks) {
  testutil::TempDir dir;
  std::vector<std::unique_ptr<GlooCommunicator>> world = comm_test::MakeGlooWorld(dir.path(), 2);
  ASSERT_EQ(world.size(), 2u);
  constexpr int64_t kExperts = 4;
  std::vector<std::vector<Fp8State::SlotStats>> dense(2), experts(2);
  std::vector<std::vector<float>> scales(2);
  std::vector<absl::Status> statuses(2);
  comm_test::RunRanks(2, [&](int rank) {
    Fp8State state(Delayed(4, 0, false), ExecContext::Cpu());
    const int dense_id = state.Register("dense", 1);
    const int experts_id = state.Register("experts", kExperts);
    statuses[rank] = state.Allocate();
    if (!statuses[rank].ok()) return;
    const auto write = [&](int linear, int64_t group, Fp8Role role, float amax, int64_t count) {
      const Fp8State::Slot slot = state.slot(linear, group, role);
      slot.amax.data<float>()[0] = amax;
      slot.saturated.data<int64_t>()[0] = count;
    };
    // Dense: rank 0 sees the larger input, rank 1 the larger weight and a NaN gradient.
    write(dense_id, 0, Fp8Role::kInput, rank == 0 ? 8.0f : 2.0f, 1 + rank);
    write(dense_id, 0, Fp8Role::kWeight, rank == 0 ? 0.5f : 1.0f, 10 * rank);
    write(dense_id, 0, Fp8Role::kGrad, rank == 0 ? 3.0f : kNaN, 0);
    // Experts 0, 1 live on rank 0, experts 2, 3 on rank 1.
    for (int64_t e = rank * 2; e < rank * 2 + 2; ++e) {
      write(experts_id, e, Fp8Role::kInput, static_cast<float>(e + 1), e);
      write(experts_id, e, Fp8Role::kGrad, 0.25f * static_cast<float>(e + 1), 100 + e);
    }
    statuses[rank] = state.EndStep(world[rank].get());
    dense[rank] = state.last_stats(dense_id);
    experts[rank] = state.last_stats(experts_id);
    for (int64_t e = 0; e < kExperts; ++e) {
      scales[rank].push_back(Scale(state, experts_id, e, Fp8Role::kInput));
      scales[rank].push_back(Scale(state, experts_id, e, Fp8Role::kGrad));
    }
    scales[rank].push_back(Scale(state, dense_id, 0, Fp8Role::kInput));
    scales[rank].push_back(Scale(state, dense_id, 0, Fp8Role::kGrad));
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    ASSERT_OK(statuses[rank]);
    const Fp8State::SlotStats& d = dense[rank][0];
    EXPECT_EQ(d.amax[0], 8.0f);
    EXPECT_EQ(d.amax[1], 1.0f);
    EXPECT_TRUE(std::isnan(d.amax[2]));
    EXPECT_EQ(d.saturated[0], 3);
    EXPECT_EQ(d.saturated[1], 10);
    EXPECT_EQ(d.saturated[2], 0);
    ASSERT_EQ(experts[rank].size(), static_cast<size_t>(kExperts));
    for (int64_t e = 0; e < kExperts; ++e) {
      SCOPED_TRACE(e);
      EXPECT_EQ(experts[rank][e].amax[0], static_cast<float>(e + 1));
      EXPECT_EQ(experts[rank][e].amax[1], 0.0f);
      EXPECT_EQ(experts[rank][e].amax[2], 0.25f * static_cast<float>(e + 1));
      EXPECT_EQ(experts[rank][e].saturated[0], e);
      EXPECT_EQ(experts[rank][e].saturated[2], 100 + e);
      EXPECT_EQ(scales[rank][2 * e], 448.0f / static_cast<float>(e + 1));
      EXPECT_EQ(scales[rank][2 * e + 1], 57344.0f / (0.25f * static_cast<float>(e + 1)));
    }
    EXPECT_EQ(scales[rank][2 * kExperts], 56.0f);
    // The NaN gradient amax drops out of the history's max: only zeros are left, so 1 stays.
    EXPECT_EQ(scales[rank][2 * kExperts + 1], 1.0f);
  }
  EXPECT_EQ(scales[0], scales[1]);
}

TEST(Fp8StateTest, SaveAndLoadRoundTrip) {
  const Fp8RecipeConfig config = Delayed(3, 0, false);
  Fp8State state(config, ExecContext::Cpu());
  state.Register("a", 1);
  state.Register("b", 2);
  ASSERT_OK(state.Allocate());
  const float amaxes[] = {2.0f, 5.0f, 0.75f};
  for (float amax : amaxes) {
    for (int64_t g = 0; g < 2; ++g) {
      Record(state, 1, g, Fp8Role::kGrad, amax * static_cast<float>(g + 1));
    }
    Record(state, 0, 0, Fp8Role::kInput, amax);
    ASSERT_OK(state.EndStep(nullptr));
  }
  absl::StatusOr<Tensor> saved = state.SaveState();
  ASSERT_OK(saved.status());
  ASSERT_EQ(saved->rank(), 2);
  EXPECT_EQ(saved->dim(0), 9);  // 3 linears' groups × 3 roles
  EXPECT_EQ(saved->dim(1), 4);  // the scale, then 3 history steps
  // Row 0: the input slot of "a": scale 448/5, history [0, 5, 0.75] (rolled after step 3).
  EXPECT_EQ(saved->data<float>()[0], 448.0f / 5.0f);
  EXPECT_EQ(saved->data<float>()[1], 0.0f);
  EXPECT_EQ(saved->data<float>()[2], 5.0f);
  EXPECT_EQ(saved->data<float>()[3], 0.75f);

  Fp8State resumed(config, ExecContext::Cpu());
  resumed.Register("a", 1);
  resumed.Register("b", 2);
  ASSERT_OK(resumed.Allocate());
  ASSERT_OK(resumed.LoadState(*saved));
  // Both continue with the same bits.
  for (float amax : {0.5f, 0.25f, 0.125f}) {
    for (Fp8State* s : {&state, &resumed}) {
      Record(*s, 0, 0, Fp8Role::kInput, amax);
      Record(*s, 1, 1, Fp8Role::kGrad, amax);
      ASSERT_OK(s->EndStep(nullptr));
    }
    for (int64_t g = 0; g < 2; ++g) {
      for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
        EXPECT_EQ(Bits(Scale(state, 1, g, role)), Bits(Scale(resumed, 1, g, role)));
      }
    }
    EXPECT_EQ(Bits(Scale(state, 0, 0, Fp8Role::kInput)),
              Bits(Scale(resumed, 0, 0, Fp8Role::kInput)));
  }
  absl::StatusOr<Tensor> again = state.SaveState(), resumed_saved = resumed.SaveState();
  ASSERT_OK(again.status());
  ASSERT_OK(resumed_saved.status());
  ASSERT_EQ(again->numel(), resumed_saved->numel());
  EXPECT_EQ(std::memcmp(again->data<float>(), resumed_saved->data<float>(),
                        again->numel() * sizeof(float)),
            0);
}

TEST(Fp8StateTest, LoadOfAnotherShapeIsDataLossNamingBoth) {
  Fp8State small(Delayed(3, 0, false), ExecContext::Cpu());
  small.Register("a", 1);
  ASSERT_OK(small.Allocate());
  absl::StatusOr<Tensor> saved = small.SaveState();
  ASSERT_OK(saved.status());

  Fp8State longer(Delayed(5, 0, false), ExecContext::Cpu());
  longer.Register("a", 1);
  ASSERT_OK(longer.Allocate());
  const absl::Status status = longer.LoadState(*saved);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("(3, 6)"), std::string::npos) << status;
  EXPECT_NE(status.message().find("(3, 4)"), std::string::npos) << status;

  Fp8State more(Delayed(3, 0, false), ExecContext::Cpu());
  more.Register("a", 2);
  ASSERT_OK(more.Allocate());
  EXPECT_EQ(more.LoadState(*saved).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(more.LoadState(TensorView()).code(), absl::StatusCode::kDataLoss);
  Tensor wrong_dtype = Tensor::Zeros(DType::kI32, {6, 4});
  EXPECT_EQ(more.LoadState(wrong_dtype).code(), absl::StatusCode::kDataLoss);

  // A recipe without state saves nothing, loads nothing, and refuses a delayed checkpoint.
  Fp8RecipeConfig current;
  current.recipe = Fp8RecipeKind::kCurrent;
  Fp8State stateless(current, ExecContext::Cpu());
  stateless.Register("a", 1);
  ASSERT_OK(stateless.Allocate());
  absl::StatusOr<Tensor> none = stateless.SaveState();
  ASSERT_OK(none.status());
  EXPECT_TRUE(none->empty());
  ASSERT_OK(stateless.LoadState(TensorView()));
  const absl::Status refused = stateless.LoadState(*saved);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("(3, 4)"), std::string::npos) << refused;
}

TEST(Fp8StateTest, EndStepBeforeAllocateFails) {
  Fp8State state(Delayed(3, 0, false), ExecContext::Cpu());
  state.Register("a", 1);
  EXPECT_EQ(state.EndStep(nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

// Why train.fp8.margin stops at kMaxFp8Margin (fp8_recipe.h): the GEMMs dequantise with the
// scale's inverse, and an infinite inverse turns a 0 into NaN. Up to the bound, even the largest
// finite amax gets a scale (a subnormal one) whose inverse is finite; one past it, E4M3's is not.
TEST(Fp8StateTest, AMarginWithinItsBoundKeepsEveryScaleInverseFinite) {
  for (const int margin : {0, kMaxFp8Margin, kMaxFp8Margin + 1}) {
    SCOPED_TRACE(margin);
    Fp8State state(Delayed(2, margin, false), ExecContext::Cpu());
    ASSERT_EQ(state.Register("model.layers.0.self_attn.q_proj", 1), 0);
    ASSERT_OK(state.Allocate());
    for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
      Record(state, 0, 0, role, FLT_MAX);
    }
    ASSERT_OK(state.EndStep(nullptr));
    for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
      const float scale = Scale(state, 0, 0, role);
      EXPECT_GT(scale, 0.0f);
      const bool finite = std::isfinite(Fp8ScaleInv(scale));
      // E5M2's gradients (max 57344 = 2^15.8) have room past the bound; E4M3 (448) has not.
      EXPECT_EQ(finite, margin <= kMaxFp8Margin || role == Fp8Role::kGrad) << scale;
    }
  }
}

}  // namespace
}  // namespace moetrain
