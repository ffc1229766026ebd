#include "engine/fp8/linear.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"
#include "engine/fp8/fp8_state.h"
#include "engine/ops/fp8/fp8.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/grouped_gemm/grouped_gemm.h"
#include "gtest/gtest.h"
#include "tests/engine/fp8/linear_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using fp8_test::Filled;
using fp8_test::Random;
using test_util::ToDoubles;

bool SameBits(TensorView a, TensorView b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

// The recipes under test, each as the job spec would set it.
std::vector<Fp8RecipeConfig> Recipes() {
  std::vector<Fp8RecipeConfig> recipes;
  Fp8RecipeConfig delayed;
  delayed.amax_history_len = 4;
  recipes.push_back(delayed);
  Fp8RecipeConfig current;
  current.recipe = Fp8RecipeKind::kCurrent;
  recipes.push_back(current);
  Fp8RecipeConfig current_pow2 = current;
  current_pow2.pow2_scales = true;
  current_pow2.amax_epsilon = 1e-3f;
  recipes.push_back(current_pow2);
  Fp8RecipeConfig blockwise;
  blockwise.recipe = Fp8RecipeKind::kBlockwise;
  blockwise.pow2_scales = true;
  recipes.push_back(blockwise);
  Fp8RecipeConfig blockwise_e4m3 = blockwise;
  blockwise_e4m3.hybrid = false;
  blockwise_e4m3.pow2_scales = false;
  recipes.push_back(blockwise_e4m3);
  Fp8RecipeConfig mxfp8;
  mxfp8.recipe = Fp8RecipeKind::kMxfp8;
  recipes.push_back(mxfp8);
  return recipes;
}

std::string Describe(const Fp8RecipeConfig& config, DType dtype) {
  return absl::StrCat(std::string(Fp8RecipeName(config.recipe)),
                      config.hybrid ? " hybrid" : " e4m3", config.pow2_scales ? " pow2" : "",
                      " eps ", config.amax_epsilon, " ", std::string(DTypeName(dtype)));
}

// Values of a (rows, cols) matrix, row-major.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<double> values;
  double at(int64_t i, int64_t j) const { return values[i * cols + j]; }
};

// What `src` stands for after the quantisation Linear gives it as `role` of slot `group`: the same
// ops::Fp8Quantize (the slot's scale for delayed scaling, a scale of its own for current), then
// ops::Fp8Dequantize. Records nothing.
Matrix Dequantized(const ExecContext& ctx, const Fp8State& state, int id, int64_t group,
                   Fp8Role role, TensorView src, bool transpose) {
  const Fp8RecipeConfig& config = state.config();
  Matrix m;
  m.rows = transpose ? src.dim(1) : src.dim(0);
  m.cols = transpose ? src.dim(0) : src.dim(1);
  absl::StatusOr<ops::OwnedFp8Tensor> q =
      ops::AllocateFp8Tensor(ctx, config.format(role), config.scaling(role), m.rows, m.cols);
  EXPECT_TRUE(q.ok()) << q.status();
  if (!q.ok()) return m;
  Tensor scratch = Tensor::Zeros(DType::kF32, {1});
  ops::Fp8QuantizeArgs args;
  args.src = src;
  args.transpose = transpose;
  args.out = q->view;
  if (config.recipe == Fp8RecipeKind::kDelayed) {
    args.scale = state.slot(id, group, role).scale;
  } else {
    args.pow2_scales = config.pow2_scales;
    args.amax_epsilon = config.amax_epsilon;
    if (config.recipe == Fp8RecipeKind::kCurrent) {
      args.scale = scratch;
      args.compute_scale = true;
    }
  }
  const absl::Status quantized = ops::Fp8Quantize(ctx, args);
  EXPECT_TRUE(quantized.ok()) << quantized;
  Tensor values = Tensor::Empty(DType::kF32, {m.rows, m.cols});
  const absl::Status dequantized = ops::Fp8Dequantize(ctx, q->view, values);
  EXPECT_TRUE(dequantized.ok()) << dequantized;
  m.values = ToDoubles(values);
  return m;
}

// c (a.rows, b.rows) f32 == prior + a · bᵀ in float64 (prior empty: none), within f32
// accumulation: K·2^-24 relative to Σ|a||b| bounds the error of any summation order; 2e-5 is
// that for K up to ~300.
void ExpectTN(TensorView c, const Matrix& a, const Matrix& b, const std::vector<double>& prior,
              const std::string& what) {
  ASSERT_EQ(a.cols, b.cols) << what;
  ASSERT_EQ(c.dim(0), a.rows) << what;
  ASSERT_EQ(c.dim(1), b.rows) << what;
  const std::vector<double> got = ToDoubles(c);
  int64_t bad = 0;
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.rows; ++j) {
      double sum = prior.empty() ? 0.0 : prior[i * b.rows + j], magnitude = std::fabs(sum);
      for (int64_t l = 0; l < a.cols; ++l) {
        sum += a.at(i, l) * b.at(j, l);
        magnitude += std::fabs(a.at(i, l) * b.at(j, l));
      }
      const double tolerance = 2e-5 * magnitude + 1e-30;
      if (!(std::fabs(got[i * b.rows + j] - sum) <= tolerance) && ++bad <= 5) {
        ADD_FAILURE() << what << " (" << i << ", " << j << "): got " << got[i * b.rows + j]
                      << ", want " << sum << " ± " << tolerance;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Distinct delayed scales per slot (not 1): one EndStep with made-up amaxes of the size of the
// test's data. The other recipes keep no scale.
void SetDelayedScales(Fp8State& state, int id) {
  for (int64_t g = 0; g < state.linears()[id].groups; ++g) {
    const float bump = 1.0f + 0.3f * static_cast<float>(g);
    const Fp8State::Slot input = state.slot(id, g, Fp8Role::kInput);
    const Fp8State::Slot weight = state.slot(id, g, Fp8Role::kWeight);
    const Fp8State::Slot grad = state.slot(id, g, Fp8Role::kGrad);
    input.amax.data<float>()[0] = 3.1f * bump;
    weight.amax.data<float>()[0] = 0.35f * bump;
    grad.amax.data<float>()[0] = 0.07f * bump;
  }
  ASSERT_TRUE(state.EndStep(nullptr).ok());
}

float Amax(const Fp8State& state, int id, int64_t group, Fp8Role role) {
  return state.slot(id, group, role).amax.data<float>()[0];
}
int64_t Saturated(const Fp8State& state, int id, int64_t group, Fp8Role role) {
  return state.slot(id, group, role).saturated.data<int64_t>()[0];
}
float MaxAbs(TensorView t) {
  float m = 0.0f;
  for (double v : ToDoubles(t)) m = std::fmax(m, static_cast<float>(std::fabs(v)));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Without FP8: exactly the ops::Gemm / ops::GroupedGemm* calls.

TEST(LinearTest, WithoutFp8IsTheGemmBitForBit) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(7);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const int64_t t = 37, k = 70, n = 29;
    Tensor x = Random(dtype, {t, k}, rng), w = Random(dtype, {n, k}, rng);
    Tensor dy = Random(dtype, {t, n}, rng);
    const Linear linear(ctx);
    ASSERT_FALSE(linear.is_fp8());
    for (bool accumulate : {false, true}) {
      Tensor y = Filled({t, n}, 0.5f), y_ref = Filled({t, n}, 0.5f);
      ASSERT_TRUE(linear.Forward(x, w, y, accumulate).ok());
      ASSERT_TRUE(
          ops::Gemm(ctx, {.a = x, .b = w, .c = y_ref, .trans_b = true, .accumulate = accumulate})
              .ok());
      EXPECT_TRUE(SameBits(y, y_ref));
      Tensor dx = Filled({t, k}, 0.5f), dx_ref = Filled({t, k}, 0.5f);
      ASSERT_TRUE(linear.BackwardData(dy, w, dx, accumulate).ok());
      ASSERT_TRUE(ops::Gemm(ctx, {.a = dy, .b = w, .c = dx_ref, .accumulate = accumulate}).ok());
      EXPECT_TRUE(SameBits(dx, dx_ref));
      Tensor dw = Filled({n, k}, 0.5f), dw_ref = Filled({n, k}, 0.5f);
      ASSERT_TRUE(linear.BackwardWeight(dy, x, dw, accumulate).ok());
      ASSERT_TRUE(
          ops::Gemm(ctx, {.a = dy, .b = x, .c = dw_ref, .trans_a = true, .accumulate = accumulate})
              .ok());
      EXPECT_TRUE(SameBits(dw, dw_ref));
    }
    // The defaults: forward and data gradient overwrite, weight gradient accumulates.
    Tensor dw = Filled({n, k}, 0.5f), dw_ref = Filled({n, k}, 0.5f);
    ASSERT_TRUE(linear.BackwardWeight(dy, x, dw).ok());
    ASSERT_TRUE(
        ops::Gemm(ctx, {.a = dy, .b = x, .c = dw_ref, .trans_a = true, .accumulate = true}).ok());
    EXPECT_TRUE(SameBits(dw, dw_ref));
  }
}

TEST(LinearTest, GroupedWithoutFp8IsTheGroupedGemmBitForBit) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(8);
  const std::vector<int64_t> offsets = {0, 0, 1, 38, 38, 95};
  const int64_t groups = 5, rows = 95, k = 48, n = 33;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    Tensor x = Random(dtype, {rows, k}, rng), w = Random(dtype, {groups, n, k}, rng);
    Tensor dy = Random(dtype, {rows, n}, rng);
    const GroupedLinear linear(ctx);
    Tensor y = Filled({rows, n}, 0.5f), y_ref = Filled({rows, n}, 0.5f);
    ASSERT_TRUE(linear.Forward(x, w, offsets, /*first_group=*/3, y).ok());
    ASSERT_TRUE(ops::GroupedGemmForward(ctx, x, w, offsets, y_ref).ok());
    EXPECT_TRUE(SameBits(y, y_ref));
    Tensor dx = Filled({rows, k}, 0.5f), dx_ref = Filled({rows, k}, 0.5f);
    ASSERT_TRUE(linear.BackwardData(dy, w, offsets, 3, dx).ok());
    ASSERT_TRUE(ops::GroupedGemmBackwardData(ctx, dy, w, offsets, dx_ref).ok());
    EXPECT_TRUE(SameBits(dx, dx_ref));
    for (bool accumulate : {false, true}) {
      Tensor dw = Filled({groups, n, k}, 0.5f), dw_ref = Filled({groups, n, k}, 0.5f);
      ASSERT_TRUE(linear.BackwardWeight(dy, x, offsets, 3, dw, accumulate).ok());
      ASSERT_TRUE(ops::GroupedGemmBackwardWeight(ctx, dy, x, offsets, dw_ref, accumulate).ok());
      EXPECT_TRUE(SameBits(dw, dw_ref));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// With FP8: the products of the quantised-then-dequantised operands.

// Sizes that are multiples of neither 16, 32 nor 128, with K and T over one 128-block.
TEST(LinearTest, Fp8ProductsOfEachRecipe) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(11);
  const int64_t t = 150, k = 200, n = 140;
  for (const Fp8RecipeConfig& config : Recipes()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(Describe(config, dtype));
      Fp8State state(config, ctx);
      const int id = state.Register("model.layers.0.self_attn.q_proj", 1);
      ASSERT_TRUE(state.Allocate().ok());
      if (config.recipe == Fp8RecipeKind::kDelayed) SetDelayedScales(state, id);
      const Linear linear(ctx, &state, id);
      ASSERT_TRUE(linear.is_fp8());
      Tensor x = Random(dtype, {t, k}, rng), w = Random(dtype, {n, k}, rng, 0.1f);
      Tensor dy = Random(dtype, {t, n}, rng, 0.02f);

      const Matrix qx = Dequantized(ctx, state, id, 0, Fp8Role::kInput, x, false);
      const Matrix qw = Dequantized(ctx, state, id, 0, Fp8Role::kWeight, w, false);
      const Matrix qdy = Dequantized(ctx, state, id, 0, Fp8Role::kGrad, dy, false);
      const Matrix qwt = Dequantized(ctx, state, id, 0, Fp8Role::kWeight, w, true);
      const Matrix qdyt = Dequantized(ctx, state, id, 0, Fp8Role::kGrad, dy, true);
      const Matrix qxt = Dequantized(ctx, state, id, 0, Fp8Role::kInput, x, true);

      Tensor y = Filled({t, n}, 7.0f);
      ASSERT_TRUE(linear.Forward(x, w, y).ok());
      ExpectTN(y, qx, qw, {}, "forward");
      Tensor y_acc = Filled({t, n}, 0.25f);
      ASSERT_TRUE(linear.Forward(x, w, y_acc, /*accumulate=*/true).ok());
      ExpectTN(y_acc, qx, qw, std::vector<double>(t * n, 0.25), "forward, accumulating");

      Tensor dx = Filled({t, k}, 7.0f);
      ASSERT_TRUE(linear.BackwardData(dy, w, dx).ok());
      ExpectTN(dx, qdy, qwt, {}, "backward data");
      Tensor dx_acc = Filled({t, k}, -0.5f);
      ASSERT_TRUE(linear.BackwardData(dy, w, dx_acc, /*accumulate=*/true).ok());
      ExpectTN(dx_acc, qdy, qwt, std::vector<double>(t * k, -0.5), "backward data, accumulating");

      Tensor dw = Filled({n, k}, 0.125f);
      ASSERT_TRUE(linear.BackwardWeight(dy, x, dw).ok());
      ExpectTN(dw, qdyt, qxt, std::vector<double>(n * k, 0.125), "backward weight");
      Tensor dw_new = Filled({n, k}, 7.0f);
      ASSERT_TRUE(linear.BackwardWeight(dy, x, dw_new, /*accumulate=*/false).ok());
      ExpectTN(dw_new, qdyt, qxt, {}, "backward weight, overwriting");
    }
  }
}

TEST(LinearTest, Fp8GroupedProductsOfEachRecipe) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(12);
  // Local groups 0..3 are the registered linear's groups 2..5 (expert parallel: this rank's
  // experts); sizes 0, 1, 37 and 130.
  const std::vector<int64_t> offsets = {0, 0, 1, 38, 168};
  const int64_t local = 4, first = 2, rows = 168, k = 136, n = 72;
  for (const Fp8RecipeConfig& config : Recipes()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(Describe(config, dtype));
      Fp8State state(config, ctx);
      state.Register("model.layers.0.self_attn.o_proj", 1);
      const int id = state.Register("model.layers.1.mlp.experts.down_proj", first + local);
      ASSERT_TRUE(state.Allocate().ok());
      if (config.recipe == Fp8RecipeKind::kDelayed) SetDelayedScales(state, id);
      const GroupedLinear linear(ctx, &state, id);
      Tensor x = Random(dtype, {rows, k}, rng), w = Random(dtype, {local, n, k}, rng, 0.1f);
      Tensor dy = Random(dtype, {rows, n}, rng, 0.02f);

      Tensor y = Filled({rows, n}, 7.0f), dx = Filled({rows, k}, 7.0f);
      Tensor dw = Filled({local, n, k}, 0.125f), dw_new = Filled({local, n, k}, 7.0f);
      ASSERT_TRUE(linear.Forward(x, w, offsets, first, y).ok());
      ASSERT_TRUE(linear.BackwardData(dy, w, offsets, first, dx).ok());
      ASSERT_TRUE(linear.BackwardWeight(dy, x, offsets, first, dw, /*accumulate=*/true).ok());
      ASSERT_TRUE(linear.BackwardWeight(dy, x, offsets, first, dw_new, false).ok());
      for (int64_t g = 0; g < local; ++g) {
        SCOPED_TRACE(absl::StrCat("group ", g));
        const int64_t begin = offsets[g], end = offsets[g + 1];
        const std::vector<double> accumulated(n * k, 0.125);
        if (begin == end) {
          // No rows: the weight gradient is zero, or left as it was when accumulating.
          EXPECT_EQ(ToDoubles(dw.view().Select(g)), accumulated);
          EXPECT_EQ(ToDoubles(dw_new.view().Select(g)), std::vector<double>(n * k, 0.0));
          continue;
        }
        const TensorView xg = x.view().Slice(begin, end), dyg = dy.view().Slice(begin, end);
        const TensorView wg = w.view().Select(g);
        const int64_t slot = first + g;
        const Matrix qx = Dequantized(ctx, state, id, slot, Fp8Role::kInput, xg, false);
        const Matrix qw = Dequantized(ctx, state, id, slot, Fp8Role::kWeight, wg, false);
        const Matrix qdy = Dequantized(ctx, state, id, slot, Fp8Role::kGrad, dyg, false);
        const Matrix qwt = Dequantized(ctx, state, id, slot, Fp8Role::kWeight, wg, true);
        const Matrix qdyt = Dequantized(ctx, state, id, slot, Fp8Role::kGrad, dyg, true);
        const Matrix qxt = Dequantized(ctx, state, id, slot, Fp8Role::kInput, xg, true);
        ExpectTN(y.view().Slice(begin, end), qx, qw, {}, "forward");
        ExpectTN(dx.view().Slice(begin, end), qdy, qwt, {}, "backward data");
        ExpectTN(dw.view().Select(g), qdyt, qxt, accumulated, "backward weight");
        ExpectTN(dw_new.view().Select(g), qdyt, qxt, {}, "backward weight, overwriting");
      }
    }
  }
}

// Rows padded to 16 (what CUDA does, linear.h) give the unpadded products and statistics: the
// padding is zero rows. Each group's row count is no multiple of 16 but one.
TEST(LinearTest, RowPaddingChangesNeitherProductsNorStatistics) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(16);
  const std::vector<int64_t> offsets = {0, 0, 1, 6, 22, 39, 79};
  const int64_t groups = 6, rows = 79, k = 136, n = 40;
  // Within f32 accumulation of the same products (a padded sum adds exact zeros, possibly in
  // another order).
  const auto expect_close = [](TensorView got, TensorView want, const std::string& what) {
    const std::vector<double> g = ToDoubles(got), w = ToDoubles(want);
    ASSERT_EQ(g.size(), w.size()) << what;
    double scale = 0.0;
    for (double v : w) scale = std::fmax(scale, std::fabs(v));
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_LE(std::fabs(g[i] - w[i]), 1e-5 * scale) << what << " element " << i;
    }
  };
  for (const Fp8RecipeConfig& config : Recipes()) {
    SCOPED_TRACE(Describe(config, DType::kBF16));
    Tensor x = Random(DType::kBF16, {rows, k}, rng);
    Tensor w = Random(DType::kBF16, {groups, n, k}, rng, 0.1f);
    Tensor dy = Random(DType::kBF16, {rows, n}, rng, 0.02f);
    struct Run {
      Tensor y, dx, dw, y_dense, dx_dense, dw_dense;
    };
    std::vector<Run> runs;
    std::vector<std::unique_ptr<Fp8State>> states;
    for (int64_t multiple : {1, 16}) {
      states.push_back(std::make_unique<Fp8State>(config, ctx));
      Fp8State& state = *states.back();
      const int grouped_id = state.Register("experts", groups);
      const int dense_id = state.Register("o_proj", 1);
      ASSERT_TRUE(state.Allocate().ok());
      if (config.recipe == Fp8RecipeKind::kDelayed) {
        SetDelayedScales(state, grouped_id);
        SetDelayedScales(state, dense_id);
      }
      const GroupedLinear grouped(ctx, &state, grouped_id, multiple);
      const Linear dense(ctx, &state, dense_id, multiple);
      Run run{.y = Filled({rows, n}, 7.0f),
              .dx = Filled({rows, k}, 7.0f),
              .dw = Filled({groups, n, k}, 0.125f),
              .y_dense = Filled({rows, n}, 0.5f),
              .dx_dense = Filled({rows, k}, 7.0f),
              .dw_dense = Filled({n, k}, 0.125f)};
      ASSERT_TRUE(grouped.Forward(x, w, offsets, 0, run.y).ok());
      ASSERT_TRUE(grouped.BackwardData(dy, w, offsets, 0, run.dx).ok());
      ASSERT_TRUE(grouped.BackwardWeight(dy, x, offsets, 0, run.dw, /*accumulate=*/true).ok());
      const TensorView w0 = w.view().Select(0);
      ASSERT_TRUE(dense.Forward(x, w0, run.y_dense, /*accumulate=*/true).ok());
      ASSERT_TRUE(dense.BackwardData(dy, w0, run.dx_dense).ok());
      ASSERT_TRUE(dense.BackwardWeight(dy, x, run.dw_dense).ok());
      runs.push_back(std::move(run));
    }
    expect_close(runs[1].y, runs[0].y, "grouped forward");
    expect_close(runs[1].dx, runs[0].dx, "grouped backward data");
    expect_close(runs[1].dw, runs[0].dw, "grouped backward weight");
    expect_close(runs[1].y_dense, runs[0].y_dense, "dense forward, accumulating");
    expect_close(runs[1].dx_dense, runs[0].dx_dense, "dense backward data");
    expect_close(runs[1].dw_dense, runs[0].dw_dense, "dense backward weight");
    for (int id : {0, 1}) {
      for (int64_t g = 0; g < states[0]->linears()[id].groups; ++g) {
        for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
          EXPECT_EQ(Amax(*states[1], id, g, role), Amax(*states[0], id, g, role));
          EXPECT_EQ(Saturated(*states[1], id, g, role), Saturated(*states[0], id, g, role));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Statistics: once per operand and pass, into the operand's own slot, and only when recording.

TEST(LinearTest, RecordsEachOperandOnce) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(13);
  const int64_t t = 40, k = 50, n = 30;
  Fp8RecipeConfig config;  // delayed, hybrid; scales 1
  Fp8State state(config, ctx);
  const int id = state.Register("linear", 1);
  ASSERT_TRUE(state.Allocate().ok());
  const Linear linear(ctx, &state, id);
  // One value over each format's max at scale 1: each quantisation that records counts it.
  Tensor x = Random(DType::kF32, {t, k}, rng), w = Random(DType::kF32, {n, k}, rng);
  Tensor dy = Random(DType::kF32, {t, n}, rng);
  x.data<float>()[17] = -1000.0f;
  w.data<float>()[5] = 500.0f;
  dy.data<float>()[3] = 1e5f;
  Tensor y = Filled({t, n}, 0.0f), dx = Filled({t, k}, 0.0f), dw = Filled({n, k}, 0.0f);

  ASSERT_TRUE(linear.Forward(x, w, y).ok());
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kInput), 1000.0f);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kInput), 1);
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kWeight), 500.0f);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kWeight), 1);
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kGrad), 0.0f);

  ASSERT_TRUE(linear.BackwardData(dy, w, dx).ok());
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kGrad), 1e5f);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kGrad), 1);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kWeight), 1);  // wᵀ records nothing

  ASSERT_TRUE(linear.BackwardWeight(dy, x, dw).ok());
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kGrad), 1);   // dyᵀ records nothing
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kInput), 1);  // xᵀ records nothing

  // A second micro-batch adds its counts; the amax is the max of both.
  x.data<float>()[17] = 900.0f;
  ASSERT_TRUE(linear.Forward(x, w, y).ok());
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kInput), 1000.0f);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kInput), 2);
  EXPECT_EQ(Saturated(state, id, 0, Fp8Role::kWeight), 2);

  ASSERT_TRUE(state.EndStep(nullptr).ok());
  EXPECT_EQ(state.last_stats(id)[0].amax[0], 1000.0f);
  EXPECT_EQ(state.last_stats(id)[0].saturated[0], 2);
  EXPECT_EQ(state.last_stats(id)[0].saturated[2], 1);
}

TEST(LinearTest, GroupedRecordsIntoItsGlobalGroups) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(14);
  const std::vector<int64_t> offsets = {0, 3, 3, 10};
  const int64_t local = 3, first = 1, rows = 10, k = 20, n = 12;
  for (const Fp8RecipeConfig& config : Recipes()) {
    SCOPED_TRACE(Describe(config, DType::kF32));
    Fp8State state(config, ctx);
    const int id = state.Register("experts", 5);
    ASSERT_TRUE(state.Allocate().ok());
    const GroupedLinear linear(ctx, &state, id);
    Tensor x = Random(DType::kF32, {rows, k}, rng), w = Random(DType::kF32, {local, n, k}, rng);
    Tensor dy = Random(DType::kF32, {rows, n}, rng);
    Tensor y = Filled({rows, n}, 0.0f), dx = Filled({rows, k}, 0.0f);
    Tensor dw = Filled({local, n, k}, 0.0f);
    ASSERT_TRUE(linear.Forward(x, w, offsets, first, y).ok());
    ASSERT_TRUE(linear.BackwardData(dy, w, offsets, first, dx).ok());
    ASSERT_TRUE(linear.BackwardWeight(dy, x, offsets, first, dw, true).ok());
    for (int64_t group = 0; group < 5; ++group) {
      SCOPED_TRACE(group);
      const int64_t g = group - first;
      const bool filled = g >= 0 && g < local && offsets[g + 1] > offsets[g];
      const float want_x = filled ? MaxAbs(x.view().Slice(offsets[g], offsets[g + 1])) : 0.0f;
      const float want_w = filled ? MaxAbs(w.view().Select(g)) : 0.0f;
      const float want_dy = filled ? MaxAbs(dy.view().Slice(offsets[g], offsets[g + 1])) : 0.0f;
      EXPECT_EQ(Amax(state, id, group, Fp8Role::kInput), want_x);
      EXPECT_EQ(Amax(state, id, group, Fp8Role::kWeight), want_w);
      EXPECT_EQ(Amax(state, id, group, Fp8Role::kGrad), want_dy);
      // Current scaling computes its scales elsewhere: the slots' scales stay 1.
      EXPECT_EQ(state.slot(id, group, Fp8Role::kInput).scale.data<float>()[0], 1.0f);
    }
  }
}

TEST(LinearTest, NotRecordingRecordsNothing) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(15);
  const int64_t t = 20, k = 40, n = 24;
  for (const Fp8RecipeConfig& config : Recipes()) {
    SCOPED_TRACE(Describe(config, DType::kF32));
    Fp8State state(config, ctx);
    const int id = state.Register("linear", 1);
    const int experts = state.Register("experts", 2);
    ASSERT_TRUE(state.Allocate().ok());
    state.set_recording(false);
    Tensor x = Random(DType::kF32, {t, k}, rng, 1000.0f), w = Random(DType::kF32, {n, k}, rng);
    Tensor w2 = Random(DType::kF32, {2, n, k}, rng), dy = Random(DType::kF32, {t, n}, rng, 1e5f);
    Tensor y = Filled({t, n}, 0.0f), dx = Filled({t, k}, 0.0f), dw = Filled({n, k}, 0.0f);
    Tensor dw2 = Filled({2, n, k}, 0.0f);
    const Linear linear(ctx, &state, id);
    ASSERT_TRUE(linear.Forward(x, w, y).ok());
    ASSERT_TRUE(linear.BackwardData(dy, w, dx).ok());
    ASSERT_TRUE(linear.BackwardWeight(dy, x, dw).ok());
    const GroupedLinear grouped(ctx, &state, experts);
    const std::vector<int64_t> offsets = {0, 5, t};
    ASSERT_TRUE(grouped.Forward(x, w2, offsets, 0, y).ok());
    ASSERT_TRUE(grouped.BackwardData(dy, w2, offsets, 0, dx).ok());
    ASSERT_TRUE(grouped.BackwardWeight(dy, x, offsets, 0, dw2, true).ok());
    for (const auto& [linear_id, group] : {std::pair{id, 0}, {experts, 0}, {experts, 1}}) {
      for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGrad}) {
        EXPECT_EQ(Amax(state, linear_id, group, role), 0.0f);
        EXPECT_EQ(Saturated(state, linear_id, group, role), 0);
        EXPECT_EQ(state.slot(linear_id, group, role).scale.data<float>()[0], 1.0f);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Edges and errors.

TEST(LinearTest, Fp8WithNoTokens) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(16);
  Fp8State state(Fp8RecipeConfig(), ctx);
  const int id = state.Register("linear", 1);
  ASSERT_TRUE(state.Allocate().ok());
  const Linear linear(ctx, &state, id);
  Tensor x = Tensor::Empty(DType::kF32, {0, 8}), dy = Tensor::Empty(DType::kF32, {0, 4});
  Tensor w = Random(DType::kF32, {4, 8}, rng);
  Tensor y = Tensor::Empty(DType::kF32, {0, 4}), dx = Tensor::Empty(DType::kF32, {0, 8});
  EXPECT_TRUE(linear.Forward(x, w, y).ok());
  EXPECT_TRUE(linear.BackwardData(dy, w, dx).ok());
  Tensor dw = Filled({4, 8}, 3.0f);
  ASSERT_TRUE(linear.BackwardWeight(dy, x, dw).ok());
  EXPECT_EQ(ToDoubles(dw), std::vector<double>(32, 3.0));
  ASSERT_TRUE(linear.BackwardWeight(dy, x, dw, /*accumulate=*/false).ok());
  EXPECT_EQ(ToDoubles(dw), std::vector<double>(32, 0.0));
  EXPECT_EQ(Amax(state, id, 0, Fp8Role::kWeight), 0.0f);
}

TEST(LinearTest, Fp8Errors) {
  const ExecContext ctx = ExecContext::Cpu();
  std::mt19937 rng(17);
  Fp8State state(Fp8RecipeConfig(), ctx);
  const int id = state.Register("experts", 3);
  Tensor x = Random(DType::kF32, {6, 8}, rng), w = Random(DType::kF32, {2, 4, 8}, rng);
  Tensor y = Filled({6, 4}, 0.0f);
  const std::vector<int64_t> offsets = {0, 2, 6};
  // Not allocated yet.
  EXPECT_EQ(GroupedLinear(ctx, &state, id).Forward(x, w, offsets, 0, y).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(state.Allocate().ok());
  const GroupedLinear grouped(ctx, &state, id);
  EXPECT_TRUE(grouped.Forward(x, w, offsets, 1, y).ok());
  // Groups [2, 4) of 3.
  EXPECT_EQ(grouped.Forward(x, w, offsets, 2, y).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GroupedLinear(ctx, &state, 1).Forward(x, w, offsets, 0, y).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Linear(ctx, &state, -1).Forward(x, w.view().Select(0), y).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(test_util::IsInvalidArgument(grouped.Forward(x, w, {0, 2}, 0, y), "offsets"));
  EXPECT_TRUE(test_util::IsInvalidArgument(grouped.Forward(x, w, {0, 4, 5}, 0, y), "offsets"));
  EXPECT_TRUE(test_util::IsInvalidArgument(grouped.Forward(x, w, {0, 4, 2}, 0, y), "offsets"));
  Tensor short_y = Filled({5, 4}, 0.0f), short_dx = Filled({5, 8}, 0.0f);
  EXPECT_TRUE(test_util::IsInvalidArgument(grouped.Forward(x, w, offsets, 0, short_y), "y"));
  EXPECT_TRUE(test_util::IsInvalidArgument(grouped.BackwardData(y, w, offsets, 0, short_dx), "dx"));
  Tensor dw = Filled({2, 4, 8}, 0.0f);
  EXPECT_TRUE(test_util::IsInvalidArgument(
      grouped.BackwardWeight(y, x.view().Slice(0, 5), offsets, 0, dw, true), "x"));
  EXPECT_TRUE(test_util::IsInvalidArgument(
      Linear(ctx, &state, id).Forward(x.view().Reshape({48}), w.view().Select(0), y), "x"));
}

}  // namespace
}  // namespace moetrain
