// The grad helpers next to AdamW: the global grad norm and clipping against float64, the NaN/Inf
// check, and zeroing.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/train/optimizer.h"
#include "gtest/gtest.h"
#include "tests/engine/train/optimizer_test_util.h"

namespace moetrain::optimizer_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Global grad norm and clipping.
// ---------------------------------------------------------------------------------------------

double ReferenceNorm(const Model& model) {
  double sum = 0.0;
  for (const Tensor& grad : model.grads) {
    for (float g : Contents(grad)) sum += static_cast<double>(g) * g;
  }
  return std::sqrt(sum);
}

TEST(GradNormTest, MatchesFloat64Reference) {
  // Three large grads so the norm spans several blocks, with ragged tails.
  std::vector<ParamSpec> specs = MixedSpecs();
  specs.push_back({"big.a", {70001}, true});
  specs.push_back({"big.b", {3, 65537}, true});
  Model model = MakeModel(specs, 121);
  FillGrads(&model, 122, 0);
  absl::StatusOr<double> norm = GlobalGradNorm(Cpu(), model.params);
  ASSERT_TRUE(norm.ok()) << norm.status();
  const double reference = ReferenceNorm(model);
  EXPECT_NEAR(*norm, reference, 1e-12 * reference);
  // The same bits every time.
  for (int run = 0; run < 3; ++run) {
    absl::StatusOr<double> again = GlobalGradNorm(Cpu(), model.params);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(std::memcmp(&*again, &*norm, sizeof(double)), 0);
  }
}

TEST(GradNormTest, EdgeCases) {
  absl::StatusOr<double> none = GlobalGradNorm(Cpu(), {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0.0);

  Model model = MakeModel({{"w", {5}, true}, {"b", {1}, false}}, 131);
  model.grads[1].data<float>()[0] = -3.0f;
  absl::StatusOr<double> norm = GlobalGradNorm(Cpu(), model.params);
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(*norm, 3.0);
  // Squares in f64: a grad whose square overflows f32 still gives a finite norm.
  model.grads[0].data<float>()[2] = 1e30f;
  norm = GlobalGradNorm(Cpu(), model.params);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 1e30, 1e24);
  model.grads[0].data<float>()[2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(*GlobalGradNorm(Cpu(), model.params), std::numeric_limits<double>::infinity());
  model.grads[0].data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(*GlobalGradNorm(Cpu(), model.params)));

  std::vector<Parameter> broken = model.params;
  broken[1].grad = TensorView();
  ExpectInvalid(GlobalGradNorm(Cpu(), broken).status(), "parameter b: grad has no tensor");
}

TEST(ClipGradNormTest, ScalesToMaxNorm) {
  Model model = MakeModel(MixedSpecs(), 141);
  FillGrads(&model, 142, 0);
  const Model original = CloneModel(model);
  const double norm = ReferenceNorm(model);
  const double max_norm = norm / 7.0;
  double norm_before = -1.0;
  ASSERT_TRUE(ClipGradNorm(Cpu(), model.params, max_norm, &norm_before).ok());
  EXPECT_NEAR(norm_before, norm, 1e-12 * norm);
  EXPECT_NEAR(*GlobalGradNorm(Cpu(), model.params), max_norm, 1e-6 * max_norm);
  // Every element is scaled by the same f32 factor.
  const float scale = static_cast<float>(max_norm / (norm_before + 1e-6));
  for (size_t i = 0; i < model.grads.size(); ++i) {
    const std::vector<float> clipped = Contents(model.grads[i]);
    const std::vector<float> before = Contents(original.grads[i]);
    for (size_t j = 0; j < clipped.size(); ++j) ASSERT_EQ(clipped[j], before[j] * scale);
  }
}

TEST(ClipGradNormTest, LeavesGradsAloneWhenNotClipping) {
  Model model = MakeModel(MixedSpecs(), 151);
  FillGrads(&model, 152, 0);
  const Model original = CloneModel(model);
  const double norm = ReferenceNorm(model);
  const auto expect_untouched = [&] {
    for (size_t i = 0; i < model.grads.size(); ++i) {
      EXPECT_TRUE(BitEqual(model.grads[i], original.grads[i])) << model.params[i].name;
    }
  };
  double norm_before = -1.0;
  // Below the limit, at it, disabled by 0 or a negative limit, an infinite limit.
  for (double max_norm : {2.0 * norm, norm, 0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    ASSERT_TRUE(ClipGradNorm(Cpu(), model.params, max_norm, &norm_before).ok());
    EXPECT_NEAR(norm_before, norm, 1e-12 * norm);
    expect_untouched();
  }
  ASSERT_TRUE(ClipGradNorm(Cpu(), model.params, 2.0 * norm, nullptr).ok());
  expect_untouched();
}

TEST(ClipGradNormTest, NonFiniteNormLeavesGradsAlone) {
  Model model = MakeModel({{"w", {100}, true}}, 161);
  FillGrads(&model, 162, 0);
  model.grads[0].data<float>()[99] = std::numeric_limits<float>::infinity();
  const Model original = CloneModel(model);
  double norm_before = 0.0;
  ASSERT_TRUE(ClipGradNorm(Cpu(), model.params, 1.0, &norm_before).ok());
  EXPECT_TRUE(std::isinf(norm_before));
  EXPECT_TRUE(BitEqual(model.grads[0], original.grads[0]));
  model.grads[0].data<float>()[99] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(ClipGradNorm(Cpu(), model.params, 1.0, &norm_before).ok());
  EXPECT_TRUE(std::isnan(norm_before));
}

TEST(ClipGradNormTest, RejectsNanMaxNorm) {
  Model model = MakeModel({{"w", {4}, true}}, 171);
  ExpectInvalid(ClipGradNorm(Cpu(), model.params, std::nan(""), nullptr), "max grad norm = nan");
  ExpectInvalid(ClipGradsToNorm(Cpu(), model.params, std::nan(""), 1.0), "max grad norm = nan");
}

// The pieces a norm over several ranks is made of: the squared sum, and clipping to a norm
// computed elsewhere, which does what ClipGradNorm does with it.
TEST(ClipGradNormTest, SquaredSumAndClipToAGivenNorm) {
  Model model = MakeModel(MixedSpecs(), 181);
  FillGrads(&model, 182, 0);
  Model copy = CloneModel(model);
  absl::StatusOr<double> squares = GradSquaredSum(Cpu(), model.params);
  ASSERT_TRUE(squares.ok()) << squares.status();
  EXPECT_EQ(std::sqrt(*squares), *GlobalGradNorm(Cpu(), model.params));
  double norm_before = 0.0;
  const double max_norm = std::sqrt(*squares) / 3.0;
  ASSERT_TRUE(ClipGradNorm(Cpu(), copy.params, max_norm, &norm_before).ok());
  ASSERT_TRUE(ClipGradsToNorm(Cpu(), model.params, max_norm, norm_before).ok());
  for (size_t i = 0; i < model.grads.size(); ++i) {
    EXPECT_TRUE(BitEqual(model.grads[i], copy.grads[i])) << model.params[i].name;
  }
  // A larger norm from other ranks clips harder; a smaller one not at all.
  const Model before = CloneModel(model);
  ASSERT_TRUE(ClipGradsToNorm(Cpu(), model.params, max_norm, max_norm / 2).ok());
  for (size_t i = 0; i < model.grads.size(); ++i) {
    EXPECT_TRUE(BitEqual(model.grads[i], before.grads[i])) << model.params[i].name;
  }
  ASSERT_TRUE(ClipGradsToNorm(Cpu(), model.params, max_norm, 2 * max_norm).ok());
  EXPECT_NEAR(*GlobalGradNorm(Cpu(), model.params), max_norm / 2, 1e-6 * max_norm);
}

// ---------------------------------------------------------------------------------------------
// AllFinite and ZeroGrads.
// ---------------------------------------------------------------------------------------------

TEST(AllFiniteTest, FindsOneNonFiniteValueAnywhere) {
  Model model = MakeModel(
      {{"first", {17}, true}, {"large", {(1 << 20) + 3}, true}, {"last", {1}, false}}, 181);
  FillGrads(&model, 182, 0);
  ASSERT_TRUE(AllFinite(Cpu(), model.params));
  const int64_t large = model.grads[1].numel();
  const std::vector<std::pair<int, int64_t>> places = {
      {0, 0}, {0, 16}, {1, 0}, {1, large / 2 + 1}, {1, large - 1}, {2, 0}};
  uint32_t signalling_bits = 0x7F800001u;
  float signalling_nan;
  std::memcpy(&signalling_nan, &signalling_bits, sizeof(float));
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        signalling_nan, std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    for (const auto& [param, index] : places) {
      float* g = model.grads[param].data<float>() + index;
      const float saved = *g;
      *g = bad;
      EXPECT_FALSE(AllFinite(Cpu(), model.params)) << bad << " at " << param << "[" << index << "]";
      *g = saved;
    }
  }
  EXPECT_TRUE(AllFinite(Cpu(), model.params));
}

TEST(AllFiniteTest, ExtremeFiniteValuesAreFinite) {
  Model model = MakeModel({{"w", {6}, true}}, 191);
  float* g = model.grads[0].data<float>();
  g[0] = std::numeric_limits<float>::max();
  g[1] = -std::numeric_limits<float>::max();
  g[2] = std::numeric_limits<float>::denorm_min();
  g[3] = -0.0f;
  g[4] = std::numeric_limits<float>::min();
  g[5] = -std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(AllFinite(Cpu(), model.params));
  EXPECT_TRUE(AllFinite(Cpu(), {}));
}

TEST(AllFiniteTest, AnUncheckableGradIsNotFinite) {
  Model model = MakeModel({{"w", {4, 3}, true}}, 201);
  std::vector<Parameter> params = model.params;
  params[0].grad = TensorView(model.grads[0].data<float>(), DType::kF32, {4, 3}, {1, 4});
  EXPECT_FALSE(AllFinite(Cpu(), params));
  params[0].grad = TensorView();
  EXPECT_FALSE(AllFinite(Cpu(), params));
}

TEST(ZeroGradsTest, ZeroesEveryGradAndNothingElse) {
  std::vector<ParamSpec> specs = MixedSpecs();
  specs.push_back({"big", {300007}, true});
  Model model = MakeModel(specs, 211);
  FillGrads(&model, 212, 0);
  // A strided grad (column 1 of a (6, 4) buffer) and a bf16 one: zeroed element by element.
  std::vector<float> matrix(24, 5.0f);
  std::vector<BF16> bf16(7, FloatToBF16(2.0f));
  std::vector<Parameter> params = model.params;
  params.push_back(
      {"strided", TensorView(), TensorView(matrix.data() + 1, DType::kF32, {6}, {4}), true});
  params.push_back({"bf16", TensorView(), TensorView(bf16.data(), DType::kBF16, {7}), true});
  ASSERT_TRUE(ZeroGrads(Cpu(), params).ok());
  for (const Tensor& grad : model.grads) {
    for (float g : Contents(grad)) ASSERT_EQ(g, 0.0f);
  }
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(matrix[r * 4 + c], c == 1 ? 0.0f : 5.0f);
  }
  for (BF16 x : bf16) EXPECT_EQ(x.bits, 0);
  // Values are not touched.
  const Model fresh = MakeModel(specs, 211);
  for (size_t i = 0; i < model.values.size(); ++i) {
    EXPECT_TRUE(BitEqual(model.values[i], fresh.values[i]));
  }
}

}  // namespace
}  // namespace moetrain::optimizer_test
