// RmsNormForward and RmsNormBackward on CUDA against the CPU backend, on fresh random inputs (the
// seed is printed with any failure). Both run rms_norm_math.h and sum in the same orders (a row
// in 16 interleaved partial sums, the tail, then the partials; the weight gradient over the same
// blocks of rows), so where the CPU's clone fuses multiply-adds as nvcc does (x86-64-v3 and v4,
// aarch64) the results should be the same bits. The CPU's baseline clone rounds each product
// apart, which moves a row sum by a few ulp; the bounds leave room for that:
// - rstd and an f32 out: |cuda − cpu| ≤ 1e-6·|cpu| (about 8 f32 ulp).
// - a bf16 out: that plus one bf16 ulp (rounding may land on either neighbour).
// - d_x and d_weight: max |cuda − cpu| ≤ 1e-5 · max |cpu| over the tensor. d_x = rstd·(g − x·c)
//   cancels, so an element's own relative error is no measure; the tensor's scale is.
// Each test prints how many elements differ from the CPU at all. Every CUDA result is
// bit-identical from run to run. Without a GPU these skip; the host test of the weight
// gradient's row blocks runs everywhere.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/norm/rms_norm.h"
#include "engine/ops/norm/rms_norm_math.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

constexpr double kForwardDelta = 1e-6;
constexpr double kBackwardDelta = 1e-5;
constexpr float kEps = 1e-5f;

// (T, D): one element; D below, at and off the 16 lanes (1, 7, 16, 24, 130); a wide row (4096 + 3,
// 8192 + 3) alone and with many rows; more rows than one grid covers, so the row loop strides
// and the weight gradient has its full 64 blocks; and no rows at all.
const Size kSizes[] = {{1, 1},      {1, 7},     {3, 130},  {37, 16},    {1, 4099},
                       {300, 4099}, {17, 8195}, {1000, 7}, {65540, 24}, {0, 8}};

double BF16Ulp(double x) { return x == 0.0 ? 0.0 : std::ldexp(1.0, std::ilogb(x) - 7); }

// An f32 host tensor holding `values`.
Tensor F32(std::vector<int64_t> shape, std::vector<float> values) {
  return MakeAct(DType::kF32, std::move(shape), values);
}

// How far `got` is from `want` over a whole tensor: the largest difference, the largest |want|,
// and how many elements differ at all. A NaN in either counts as an infinite difference.
struct TensorDiff {
  double max_diff = 0.0;
  double max_want = 0.0;
  int64_t differing = 0;
};

TensorDiff Compare(const Tensor& want, const Tensor& got) {
  TensorDiff diff;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = At(want, i), g = At(got, i);
    const double d = std::isnan(w) || std::isnan(g) ? INFINITY : std::fabs(g - w);
    diff.max_diff = std::max(diff.max_diff, d);
    diff.max_want = std::max(diff.max_want, std::fabs(w));
    if (!(w == g)) ++diff.differing;
  }
  return diff;
}

// Element-wise: |got − want| ≤ δ·|want| (plus a bf16 ulp for bf16).
::testing::AssertionResult ElementsNear(const Tensor& want, const Tensor& got, double delta) {
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = At(want, i), g = At(got, i);
    double bound = delta * std::fabs(w);
    if (want.dtype() == DType::kBF16) bound += BF16Ulp(std::max(std::fabs(w), std::fabs(g)));
    if (!(std::fabs(g - w) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": cpu " << w << ", cuda " << g << ", bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

// Over the tensor: max |got − want| ≤ δ·max |want|.
::testing::AssertionResult TensorNear(const Tensor& want, const Tensor& got, double delta) {
  const TensorDiff diff = Compare(want, got);
  if (diff.max_diff <= delta * diff.max_want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |cuda − cpu| " << diff.max_diff << " > " << delta
                                       << " · max |cpu| " << diff.max_want;
}

// Prints how many elements of each of the two outputs differ from the CPU's at all (for the log;
// the bounds are the test).
void PrintDiffering(const std::string& header, const char* a_name, const Tensor& want_a,
                    const Tensor& a, const char* b_name, const Tensor& want_b, const Tensor& b) {
  std::printf("%s: %lld of %lld %s and %lld of %lld %s differ\n", header.c_str(),
              static_cast<long long>(Compare(want_a, a).differing),
              static_cast<long long>(a.numel()), a_name,
              static_cast<long long>(Compare(want_b, b).differing),
              static_cast<long long>(b.numel()), b_name);
}

// Runs `run` (which fills two outputs) again and expects the same bytes as its first `a`, `b`.
template <typename Run>
void ExpectRepeats(const Run& run, const Tensor& a, const Tensor& b) {
  Tensor a_again, b_again;
  run(&a_again, &b_again);
  EXPECT_TRUE(SameBytes(a, a_again));
  EXPECT_TRUE(SameBytes(b, b_again));
}

TEST(RmsNormCudaTest, ForwardMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Size& size : kSizes) {
      const int64_t t = size.rows, d = size.cols;
      SCOPED_TRACE(::testing::Message() << Name(dtype) << " T=" << t << " D=" << d);
      const Tensor x = F32({t, d}, Uniform(t * d, -2.0f, 2.0f, rng));
      const Tensor weight = F32({d}, Uniform(d, 0.5f, 1.5f, rng));
      Tensor want_out = NaNAct(dtype, {t, d});
      Tensor want_rstd = NaNAct(DType::kF32, {t});
      ASSERT_OK(ops::RmsNormForward(Cpu(), x, weight, kEps, want_out, want_rstd));

      const Tensor x_gpu = test_util::ToDevice(gpu, x);
      const Tensor weight_gpu = test_util::ToDevice(gpu, weight);
      auto run = [&](Tensor* out, Tensor* rstd) {
        const Tensor out_gpu = test_util::ToDevice(gpu, NaNAct(dtype, {t, d}));
        const Tensor rstd_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {t}));
        const absl::Status status =
            ops::RmsNormForward(gpu, x_gpu, weight_gpu, kEps, out_gpu, rstd_gpu);
        EXPECT_TRUE(status.ok()) << status;
        *out = test_util::ToHost(gpu, out_gpu);
        *rstd = test_util::ToHost(gpu, rstd_gpu);
      };
      Tensor out, rstd;
      run(&out, &rstd);
      ASSERT_TRUE(ElementsNear(want_rstd, rstd, kForwardDelta)) << "rstd";
      ASSERT_TRUE(ElementsNear(want_out, out, kForwardDelta)) << "out";
      PrintDiffering(std::string("forward ") + Name(dtype) + " T=" + std::to_string(t) +
                         " D=" + std::to_string(d),
                     "out", want_out, out, "rstd", want_rstd, rstd);
      ExpectRepeats(run, out, rstd);

      if (dtype == DType::kF32) {  // in place (out = x), which the CPU also allows
        const Tensor in_place = test_util::ToDevice(gpu, x);
        const Tensor rstd_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {t}));
        ASSERT_OK(ops::RmsNormForward(gpu, in_place, weight_gpu, kEps, in_place, rstd_gpu));
        EXPECT_TRUE(SameBytes(out, test_util::ToHost(gpu, in_place)));
        EXPECT_TRUE(SameBytes(rstd, test_util::ToHost(gpu, rstd_gpu)));
      }
    }
  }
}

TEST(RmsNormCudaTest, BackwardMatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Size& size : kSizes) {
      for (bool accumulate : {false, true}) {
        const int64_t t = size.rows, d = size.cols;
        SCOPED_TRACE(::testing::Message() << Name(dtype) << " T=" << t << " D=" << d
                                          << (accumulate ? " accumulating d_x" : ""));
        const Tensor x = F32({t, d}, Uniform(t * d, -2.0f, 2.0f, rng));
        const Tensor weight = F32({d}, Uniform(d, 0.5f, 1.5f, rng));
        std::vector<float> dy_values = Uniform(t * d, -1.0f, 1.0f, rng);
        const Tensor d_out = MakeAct(dtype, {t, d}, dy_values);
        // Both backends take the CPU's rstd, so the backward is compared on equal inputs.
        Tensor rstd = NaNAct(DType::kF32, {t});
        Tensor scratch_out = NaNAct(dtype, {t, d});
        ASSERT_OK(ops::RmsNormForward(Cpu(), x, weight, kEps, scratch_out, rstd));
        // d_x starts as NaN when written (every element must be), as a residual when added to;
        // d_weight always accumulates.
        const std::vector<float> d_x_start =
            accumulate ? Uniform(t * d, -1.0f, 1.0f, rng) : std::vector<float>(t * d, kNaN);
        const std::vector<float> d_w_start = Uniform(d, -1.0f, 1.0f, rng);

        Tensor want_d_x = F32({t, d}, d_x_start);
        Tensor want_d_w = F32({d}, d_w_start);
        ASSERT_OK(ops::RmsNormBackward(Cpu(), {.x = x,
                                               .weight = weight,
                                               .rstd = rstd,
                                               .d_out = d_out,
                                               .d_x = want_d_x,
                                               .d_weight = want_d_w,
                                               .accumulate_d_x = accumulate}));

        const Tensor x_gpu = test_util::ToDevice(gpu, x);
        const Tensor weight_gpu = test_util::ToDevice(gpu, weight);
        const Tensor rstd_gpu = test_util::ToDevice(gpu, rstd);
        const Tensor d_out_gpu = test_util::ToDevice(gpu, d_out);
        auto run = [&](Tensor* d_x, Tensor* d_w) {
          const Tensor d_x_gpu = test_util::ToDevice(gpu, F32({t, d}, d_x_start));
          const Tensor d_w_gpu = test_util::ToDevice(gpu, F32({d}, d_w_start));
          const absl::Status status = ops::RmsNormBackward(gpu, {.x = x_gpu,
                                                                 .weight = weight_gpu,
                                                                 .rstd = rstd_gpu,
                                                                 .d_out = d_out_gpu,
                                                                 .d_x = d_x_gpu,
                                                                 .d_weight = d_w_gpu,
                                                                 .accumulate_d_x = accumulate});
          EXPECT_TRUE(status.ok()) << status;
          *d_x = test_util::ToHost(gpu, d_x_gpu);
          *d_w = test_util::ToHost(gpu, d_w_gpu);
        };
        Tensor d_x, d_w;
        run(&d_x, &d_w);
        ASSERT_TRUE(TensorNear(want_d_x, d_x, kBackwardDelta)) << "d_x";
        ASSERT_TRUE(TensorNear(want_d_w, d_w, kBackwardDelta)) << "d_weight";
        PrintDiffering(std::string("backward ") + Name(dtype) + " T=" + std::to_string(t) +
                           " D=" + std::to_string(d) + (accumulate ? " (accumulating)" : ""),
                       "d_x", want_d_x, d_x, "d_w", want_d_w, d_w);
        ExpectRepeats(run, d_x, d_w);
      }
    }
  }
}

// The weight gradient's row blocks (shared by both backends): at least 16 rows each, at most 64
// blocks, covering every row.
TEST(RmsNormWeightGradBlocksTest, CoverEveryRowInAtMost64Blocks) {
  for (int64_t t : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{1024}, int64_t{1025},
                    int64_t{65540}, int64_t{1} << 31}) {
    const int64_t rows = RmsNormWeightGradBlockRows(t);
    const int64_t blocks = (t + rows - 1) / rows;
    EXPECT_GE(rows, 16) << "T = " << t;
    EXPECT_LE(blocks, 64) << "T = " << t;
    EXPECT_GE(blocks * rows, t) << "T = " << t;
    EXPECT_LT((blocks - 1) * rows, t) << "T = " << t << ": an empty block";
  }
}

}  // namespace
}  // namespace moetrain::ops_test
