// Linear, GroupedLinear and Fp8State on CUDA against the same on the CPU: the recorded statistics
// and the delayed scales bit for bit (the quantise ops compute the same bits on both), the
// products within FP8 GEMM accumulation differences, and every CUDA result bit-identical from run
// to run. Skips without a GPU.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"
#include "engine/fp8/linear.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/fp8/linear_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using fp8_test::Filled;
using fp8_test::Random;
using test_util::SameBytes;
using test_util::ToDevice;
using test_util::ToDoubles;
using test_util::ToHost;

// The CUDA result (host copy) against the CPU's. Both multiply the same FP8 values with f32
// accumulation, in different orders (and MXFP8 through bf16 operands, which hold E4M3 values
// times powers of two exactly): 2e-3 of the largest magnitude is far above that and far below
// what a wrong scale or operand gives (errors of a few percent of every element).
void ExpectClose(TensorView gpu, TensorView cpu, const std::string& what) {
  const std::vector<double> got = ToDoubles(gpu), want = ToDoubles(cpu);
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0.0;
  for (double v : want) largest = std::fmax(largest, std::fabs(v));
  const double tolerance = 2e-3 * largest + 1e-30;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tolerance) && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: cuda " << got[i] << ", cpu " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<Fp8RecipeConfig> Recipes() {
  std::vector<Fp8RecipeConfig> recipes(4);
  recipes[0].amax_history_len = 4;
  recipes[1].recipe = Fp8RecipeKind::kCurrent;
  recipes[2].recipe = Fp8RecipeKind::kBlockwise;
  recipes[2].pow2_scales = true;
  recipes[3].recipe = Fp8RecipeKind::kMxfp8;
  return recipes;
}

// Every slot's statistics and scale, on the host.
std::vector<float> SlotNumbers(const ExecContext& ctx, const Fp8State& state) {
  std::vector<float> numbers;
  for (int id = 0; id < static_cast<int>(state.linears().size()); ++id) {
    for (int64_t g = 0; g < state.linears()[id].groups; ++g) {
      for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
        const Fp8State::Slot slot = state.slot(id, g, role);
        numbers.push_back(ToHost(ctx, slot.scale).data<float>()[0]);
        numbers.push_back(ToHost(ctx, slot.amax).data<float>()[0]);
        numbers.push_back(static_cast<float>(ToHost(ctx, slot.saturated).data<int64_t>()[0]));
      }
    }
  }
  return numbers;
}

TEST(LinearCudaTest, MatchesTheCpuForEachRecipe) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const ExecContext cpu = ExecContext::Cpu();
  // Sizes that are multiples of neither 16, 32 nor 128; groups of 0, 1, 37 and 130 rows.
  const int64_t t = 150, k = 200, n = 140;
  const std::vector<int64_t> offsets = {0, 0, 1, 38, 168};
  const int64_t local = 4, first = 1, rows = 168;
  for (const Fp8RecipeConfig& config : Recipes()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(std::string(Fp8RecipeName(config.recipe)), " ",
                                std::string(DTypeName(dtype))));
      Fp8State cpu_state(config, cpu), gpu_state(config, gpu);
      for (Fp8State* state : {&cpu_state, &gpu_state}) {
        ASSERT_EQ(state->Register("dense", 1), 0);
        ASSERT_EQ(state->Register("experts", first + local), 1);
        ASSERT_TRUE(state->Allocate().ok());
      }
      const Linear cpu_dense(cpu, &cpu_state, 0), gpu_dense(gpu, &gpu_state, 0);
      const GroupedLinear cpu_experts(cpu, &cpu_state, 1), gpu_experts(gpu, &gpu_state, 1);
      // Two steps, so that the second quantises with delayed scales from the first.
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE(absl::StrCat("step ", step));
        const Tensor x = Random(dtype, {t, k}, rng, 1.0f), w = Random(dtype, {n, k}, rng, 0.1f);
        const Tensor dy = Random(dtype, {t, n}, rng, 0.02f);
        const Tensor xs = Random(dtype, {rows, k}, rng, 1.0f);
        const Tensor ws = Random(dtype, {local, n, k}, rng, 0.1f);
        const Tensor dys = Random(dtype, {rows, n}, rng, 0.02f);
        const Tensor x_d = ToDevice(gpu, x), w_d = ToDevice(gpu, w), dy_d = ToDevice(gpu, dy);
        const Tensor xs_d = ToDevice(gpu, xs), ws_d = ToDevice(gpu, ws);
        const Tensor dys_d = ToDevice(gpu, dys);

        Tensor y = Filled({t, n}, 0.0f), dx = Filled({t, k}, 0.0f), dw = Filled({n, k}, 0.5f);
        Tensor ys = Filled({rows, n}, 0.0f), dxs = Filled({rows, k}, 0.0f);
        Tensor dws = Filled({local, n, k}, 0.5f);
        Tensor y_d = ToDevice(gpu, y), dx_d = ToDevice(gpu, dx), dw_d = ToDevice(gpu, dw);
        Tensor ys_d = ToDevice(gpu, ys), dxs_d = ToDevice(gpu, dxs), dws_d = ToDevice(gpu, dws);

        const auto run = [&](const Linear& dense, const GroupedLinear& experts, TensorView x_,
                             TensorView w_, TensorView dy_, TensorView xs_, TensorView ws_,
                             TensorView dys_, TensorView y_, TensorView dx_, TensorView dw_,
                             TensorView ys_, TensorView dxs_, TensorView dws_) {
          ASSERT_TRUE(dense.Forward(x_, w_, y_).ok());
          ASSERT_TRUE(dense.BackwardData(dy_, w_, dx_).ok());
          ASSERT_TRUE(dense.BackwardWeight(dy_, x_, dw_).ok());
          ASSERT_TRUE(experts.Forward(xs_, ws_, offsets, first, ys_).ok());
          ASSERT_TRUE(experts.BackwardData(dys_, ws_, offsets, first, dxs_).ok());
          ASSERT_TRUE(experts.BackwardWeight(dys_, xs_, offsets, first, dws_, true).ok());
        };
        run(cpu_dense, cpu_experts, x, w, dy, xs, ws, dys, y, dx, dw, ys, dxs, dws);
        run(gpu_dense, gpu_experts, x_d, w_d, dy_d, xs_d, ws_d, dys_d, y_d, dx_d, dw_d, ys_d, dxs_d,
            dws_d);
        const Tensor y_h = ToHost(gpu, y_d), dx_h = ToHost(gpu, dx_d), dw_h = ToHost(gpu, dw_d);
        const Tensor ys_h = ToHost(gpu, ys_d), dxs_h = ToHost(gpu, dxs_d);
        const Tensor dws_h = ToHost(gpu, dws_d);
        ExpectClose(y_h, y, "dense forward");
        ExpectClose(dx_h, dx, "dense backward data");
        ExpectClose(dw_h, dw, "dense backward weight");
        ExpectClose(ys_h, ys, "grouped forward");
        ExpectClose(dxs_h, dxs, "grouped backward data");
        ExpectClose(dws_h, dws, "grouped backward weight");
        EXPECT_EQ(SlotNumbers(gpu, gpu_state), SlotNumbers(cpu, cpu_state));

        // Run to run: the same inputs give the same bits (not recorded, so the step's
        // statistics stay as they are).
        gpu_state.set_recording(false);
        Tensor y2_d = ToDevice(gpu, Filled({t, n}, 0.0f));
        Tensor dx2_d = ToDevice(gpu, Filled({t, k}, 0.0f));
        Tensor dw2_d = ToDevice(gpu, Filled({n, k}, 0.5f));
        Tensor ys2_d = ToDevice(gpu, Filled({rows, n}, 0.0f));
        Tensor dxs2_d = ToDevice(gpu, Filled({rows, k}, 0.0f));
        Tensor dws2_d = ToDevice(gpu, Filled({local, n, k}, 0.5f));
        run(gpu_dense, gpu_experts, x_d, w_d, dy_d, xs_d, ws_d, dys_d, y2_d, dx2_d, dw2_d, ys2_d,
            dxs2_d, dws2_d);
        gpu_state.set_recording(true);
        EXPECT_TRUE(SameBytes(ToHost(gpu, y2_d), y_h));
        EXPECT_TRUE(SameBytes(ToHost(gpu, dx2_d), dx_h));
        EXPECT_TRUE(SameBytes(ToHost(gpu, ys2_d), ys_h));
        EXPECT_TRUE(SameBytes(ToHost(gpu, dxs2_d), dxs_h));
        EXPECT_TRUE(SameBytes(ToHost(gpu, dw2_d), dw_h));
        EXPECT_TRUE(SameBytes(ToHost(gpu, dws2_d), dws_h));

        ASSERT_TRUE(cpu_state.EndStep(nullptr).ok());
        ASSERT_TRUE(gpu_state.EndStep(nullptr).ok());
        EXPECT_EQ(SlotNumbers(gpu, gpu_state), SlotNumbers(cpu, cpu_state));
        for (int id = 0; id < 2; ++id) {
          for (int64_t g = 0; g < cpu_state.linears()[id].groups; ++g) {
            const Fp8State::SlotStats& a = gpu_state.last_stats(id)[g];
            const Fp8State::SlotStats& b = cpu_state.last_stats(id)[g];
            EXPECT_EQ(a.amax, b.amax) << id << " " << g;
            EXPECT_EQ(a.scale, b.scale) << id << " " << g;
            EXPECT_EQ(a.saturated, b.saturated) << id << " " << g;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace moetrain
