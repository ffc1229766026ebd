// The LM head loss's CUDA parts against the CPU backend, on fresh random inputs (the seed is
// printed with any failure): the cross-entropy rows alone (ops::CrossEntropyRows), and the whole
// chunked loss, forward and forward + backward, in f32 and bf16.
//
// Tolerances. Both backends run cross_entropy_math.h's steps; they differ in
// - the order of the row's f32 sum of e^(z − max): serial on the CPU, a block tree on CUDA. Each
//   order errs by at most (V − 1)·u relative (u = 2^-24, positive terms); with expf's error
//   (CUDA ≤ 2 ulp, glibc < 1) the two sums differ by at most ε_s = (2V + 8)·u relative;
// - nvcc's fused multiply-add of the target's p·scale − scale (one rounding fewer);
// so, with p·scale the gradient before the target's −scale:
// - token loss = (max + log s) − z_t: log s moves by ε_s, logf errs by ≤ 1 ulp (2u·|log s|) on
//   each side, and each side rounds the two additions; with |log s| ≤ |loss| + |max| + |z_t|,
//   |Δ| ≤ ε_s + 8u·(|max| + |z_t| + |loss|);
// - d_logits: |Δ| ≤ (ε_s + 12u)·|p·scale| (the expf terms, the division and the product), plus
//   4u·|scale| at the target, plus 1e-38; bf16 outputs one bf16 ulp more (rounding may land on
//   either neighbour).
// The whole loss adds the GEMMs (cuBLASLt against oneDNN, f32 accumulation, TF32 off): mean loss
// within 1e-5 relative (f32 and bf16 inputs alike: the logits are f32 either way), gradients in
// norm within 1e-4 relative in f32 (each backend is within about 1e-5 of float64, per
// lm_head_loss_test; the wide vocabulary sums 50257 products) and 1e-2 in bf16 (the logits'
// gradient is rounded to bf16 for the GEMMs, where an ulp either way moves it by 2^-8). The CUDA
// results repeat bit for bit. Bad targets: the CPU's message exactly, the gradients untouched.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/loss/lm_head_loss.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

constexpr double kU = 1.0 / (1 << 24);

uint32_t FreshSeed() { return std::random_device{}(); }

double BF16Ulp(double x) { return x == 0.0 ? 0.0 : std::ldexp(1.0, std::ilogb(x) - 7); }

// Targets in [0, V) with the edges 0 and V − 1 among them.
std::vector<int32_t> Targets(int64_t rows, int64_t v, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(v - 1));
  std::vector<int32_t> y(rows);
  for (int32_t& x : y) x = id(rng);
  y[0] = 0;
  if (rows > 1) y[rows - 1] = static_cast<int32_t>(v - 1);
  return y;
}

// Logits in [-12, 12], with a few rows peaked (one logit far above the rest) or flat.
std::vector<float> Logits(int64_t rows, int64_t v, std::mt19937& rng) {
  std::vector<float> z = Uniform(rows * v, -12.0f, 12.0f, rng);
  for (int64_t r = 0; r < rows; r += 3) z[r * v + (r * 7) % v] = 40.0f;
  if (rows > 1) std::fill(z.begin() + v, z.begin() + 2 * v, 0.5f);
  return z;
}

struct RowsCase {
  int64_t rows, v;
};

TEST(LmHeadLossCudaTest, CrossEntropyRowsMatchTheCpuAndRepeat) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // One logit, V below a block's 512 threads, V = 1000 + 7, a wide vocabulary.
  const RowsCase cases[] = {{1, 1}, {3, 2}, {4, 300}, {37, 1007}, {1, 1007}, {5, 50257}};
  for (const RowsCase& c : cases) {
    const int64_t rows = c.rows, v = c.v;
    const std::vector<float> z_values = Logits(rows, v, rng);
    const Tensor targets = MakeI32({rows}, Targets(rows, v, rng));
    const float scale = 0.75f / 37.0f;
    const double eps_s = (2.0 * v + 8.0) * kU;
    for (int grad = 0; grad < 3; ++grad) {  // none, f32, bf16
      const DType act = grad == 2 ? DType::kBF16 : DType::kF32;
      SCOPED_TRACE(::testing::Message() << "rows=" << rows << " V=" << v << " d_logits "
                                        << (grad == 0 ? "none" : Name(act)));
      Tensor z = test_util::MakeTensor(DType::kF32, {rows, v}, z_values);
      Tensor loss = NaNAct(DType::kF32, {rows});
      Tensor d = grad > 0 ? NaNAct(act, {rows, v}) : Tensor();
      ASSERT_OK(ops::CrossEntropyRows(Cpu(), z, targets, loss, d, scale));

      const Tensor z_gpu =
          test_util::ToDevice(gpu, test_util::MakeTensor(DType::kF32, {rows, v}, z_values));
      const Tensor targets_gpu = test_util::ToDevice(gpu, targets);
      Tensor first_loss, first_d;
      for (int run = 0; run < 2; ++run) {
        const Tensor loss_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {rows}));
        const Tensor d_gpu = grad > 0 ? test_util::ToDevice(gpu, NaNAct(act, {rows, v})) : Tensor();
        ASSERT_OK(ops::CrossEntropyRows(gpu, z_gpu, targets_gpu, loss_gpu, d_gpu, scale));
        Tensor got_loss = test_util::ToHost(gpu, loss_gpu);
        Tensor got_d = grad > 0 ? test_util::ToHost(gpu, d_gpu) : Tensor();
        if (run == 1) {
          EXPECT_TRUE(test_util::SameBytes(first_loss, got_loss)) << "token losses repeat";
          if (grad > 0) {
            EXPECT_TRUE(test_util::SameBytes(first_d, got_d)) << "d_logits repeat";
          }
          continue;
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float* row = z_values.data() + r * v;
          const double max = *std::max_element(row, row + v);
          const double want = loss.data<float>()[r], got = got_loss.data<float>()[r];
          const double bound =
              eps_s +
              8.0 * kU *
                  (std::fabs(max) + std::fabs(row[targets.data<int32_t>()[r]]) + std::fabs(want));
          ASSERT_LE(std::fabs(got - want), bound)
              << "row " << r << ": cpu " << want << ", cuda " << got;
          if (grad == 0) continue;
          const int32_t target = targets.data<int32_t>()[r];
          for (int64_t i = 0; i < v; ++i) {
            const double w = At(d, r * v + i), g = At(got_d, r * v + i);
            const double p_scale = i == target ? w + scale : w;
            double b = (eps_s + 12.0 * kU) * std::fabs(p_scale) + 1e-38;
            if (i == target) b += 4.0 * kU * scale;
            if (act == DType::kBF16) b += BF16Ulp(std::max(std::fabs(w), std::fabs(g)));
            ASSERT_LE(std::fabs(g - w), b) << "row " << r << ", column " << i << " (target "
                                           << target << "): cpu " << w << ", cuda " << g;
          }
        }
        first_loss = std::move(got_loss);
        first_d = std::move(got_d);
      }
    }
  }
}

struct LossCase {
  int64_t tokens, hidden, vocab, chunk;
};

// ‖got − want‖ / ‖want‖ over two host tensors (f32 or bf16).
double RelDiff(const Tensor& got, const Tensor& want) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = At(want, i), g = At(got, i);
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

TEST(LmHeadLossCudaTest, ForwardAndBackwardMatchTheCpuAndRepeat) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // T = 1; V = 1000 + 7 with chunks smaller than T (ragged last chunk), one token per chunk, the
  // automatic chunk; a wide vocabulary in several automatic chunks (4 Mi logits / V = 83 rows).
  const LossCase cases[] = {{1, 16, 1007, 0},
                            {37, 64, 1007, 8},
                            {37, 64, 1007, 1},
                            {130, 48, 1007, 0},
                            {200, 32, 50257, 0}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const LossCase& c : cases) {
      const int64_t t = c.tokens, d = c.hidden, v = c.vocab;
      SCOPED_TRACE(::testing::Message() << Name(dtype) << " T=" << t << " D=" << d << " V=" << v
                                        << " chunk=" << c.chunk);
      std::vector<float> h = Uniform(t * d, -1.0f, 1.0f, rng);
      std::vector<float> w = Uniform(v * d, -0.3f, 0.3f, rng);
      std::vector<float> d_w0 = Uniform(v * d, -0.01f, 0.01f, rng);
      const Tensor hidden = MakeAct(dtype, {t, d}, h), weight = MakeAct(dtype, {v, d}, w);
      const Tensor targets = MakeI32({t}, Targets(t, v, rng));
      const Tensor d_weight0 = MakeAct(DType::kF32, {v, d}, d_w0);
      const ops::LmHeadLossArgs cpu_args = {
          .hidden = hidden, .weight = weight, .targets = targets, .chunk_tokens = c.chunk};
      const float d_loss = 0.5f;

      absl::StatusOr<float> want_fwd = ops::LmHeadLossForward(Cpu(), cpu_args, nullptr);
      ASSERT_TRUE(want_fwd.ok()) << want_fwd.status();
      Tensor want_dh = NaNAct(DType::kF32, {t, d});
      Tensor want_dw = MakeAct(DType::kF32, {v, d}, d_w0);
      absl::StatusOr<float> want_loss = ops::LmHeadLossForwardBackward(
          Cpu(), cpu_args, {.d_loss = d_loss, .d_hidden = want_dh, .d_weight = want_dw}, nullptr);
      ASSERT_TRUE(want_loss.ok()) << want_loss.status();

      const Tensor hidden_gpu = test_util::ToDevice(gpu, hidden);
      const Tensor weight_gpu = test_util::ToDevice(gpu, weight);
      const Tensor targets_gpu = test_util::ToDevice(gpu, targets);
      const ops::LmHeadLossArgs gpu_args = {.hidden = hidden_gpu,
                                            .weight = weight_gpu,
                                            .targets = targets_gpu,
                                            .chunk_tokens = c.chunk};
      ops::LmHeadLossWorkspace workspace(gpu);
      float first_fwd = 0.0f, first_loss = 0.0f;
      Tensor first_dh, first_dw;
      for (int run = 0; run < 2; ++run) {
        absl::StatusOr<float> fwd = ops::LmHeadLossForward(gpu, gpu_args, &workspace);
        ASSERT_TRUE(fwd.ok()) << fwd.status();
        const Tensor dh_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {t, d}));
        const Tensor dw_gpu = test_util::ToDevice(gpu, d_weight0);
        absl::StatusOr<float> loss = ops::LmHeadLossForwardBackward(
            gpu, gpu_args, {.d_loss = d_loss, .d_hidden = dh_gpu, .d_weight = dw_gpu}, &workspace);
        ASSERT_TRUE(loss.ok()) << loss.status();
        Tensor dh = test_util::ToHost(gpu, dh_gpu), dw = test_util::ToHost(gpu, dw_gpu);
        if (run == 1) {
          EXPECT_EQ(*fwd, first_fwd) << "forward loss repeats";
          EXPECT_EQ(*loss, first_loss) << "forward + backward loss repeats";
          EXPECT_TRUE(test_util::SameBytes(dh, first_dh)) << "d_hidden repeats";
          EXPECT_TRUE(test_util::SameBytes(dw, first_dw)) << "d_weight repeats";
          continue;
        }
        EXPECT_LE(std::fabs(*fwd - *want_fwd), 1e-5 * std::fabs(*want_fwd)) << *fwd;
        EXPECT_LE(std::fabs(*loss - *want_loss), 1e-5 * std::fabs(*want_loss)) << *loss;
        const double grad_tol = dtype == DType::kBF16 ? 1e-2 : 1e-4;
        EXPECT_LE(RelDiff(dh, want_dh), grad_tol);
        EXPECT_LE(RelDiff(dw, want_dw), grad_tol);
        first_fwd = *fwd;
        first_loss = *loss;
        first_dh = std::move(dh);
        first_dw = std::move(dw);
      }
    }
  }
}

TEST(LmHeadLossCudaTest, BadTargetsGiveTheCpuErrorAndLeaveGradientsAlone) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const int64_t t = 5, d = 4, v = 6;
  std::mt19937 rng(3);
  std::vector<float> h = Uniform(t * d, -1.0f, 1.0f, rng), w = Uniform(v * d, -1.0f, 1.0f, rng);
  std::vector<float> d_w0 = Uniform(v * d, -1.0f, 1.0f, rng);
  const Tensor hidden = MakeAct(DType::kF32, {t, d}, h), weight = MakeAct(DType::kF32, {v, d}, w);
  const Tensor d_weight0 = MakeAct(DType::kF32, {v, d}, d_w0);
  for (const std::vector<int32_t>& y :
       std::vector<std::vector<int32_t>>{{0, 6, 1, 2, 3}, {0, 1, 2, 3, -1}, {9, 1, -4, 2, 6}}) {
    const Tensor targets = MakeI32({t}, y);
    const absl::StatusOr<float> want = ops::LmHeadLossForward(
        Cpu(), {.hidden = hidden, .weight = weight, .targets = targets}, nullptr);
    ASSERT_EQ(want.status().code(), absl::StatusCode::kInvalidArgument) << want.status();
    const Tensor dh_gpu = test_util::ToDevice(gpu, NaNAct(DType::kF32, {t, d}));
    const Tensor dw_gpu = test_util::ToDevice(gpu, d_weight0);
    const absl::StatusOr<float> got = ops::LmHeadLossForwardBackward(
        gpu,
        {.hidden = test_util::ToDevice(gpu, hidden),
         .weight = test_util::ToDevice(gpu, weight),
         .targets = test_util::ToDevice(gpu, targets)},
        {.d_loss = 1.0f, .d_hidden = dh_gpu, .d_weight = dw_gpu}, nullptr);
    EXPECT_EQ(got.status(), want.status());
    EXPECT_TRUE(test_util::SameBytes(d_weight0, test_util::ToHost(gpu, dw_gpu)));
  }
}

}  // namespace
}  // namespace moetrain::ops_test
