// CausalAttentionForward and CausalAttentionBackward on CUDA against the CPU backend, on fresh
// random inputs (the seed is printed with any failure), MHA and GQA, sequence lengths around and
// off the tiles (1, 63, 64, 65, 200, 1024), head dims 16..256 (72: a padded width), B = 1..3.
// The backward of both backends reads the CPU forward's out and lse, so each direction is
// compared on its own.
//
// Tolerance, f32: max |cuda − cpu| ≤ 1e-5 · max |cpu| per tensor (lse: · max(1, max |lse|)).
// Both backends run FastExp on the same f32 products, summed in the same order over features,
// queries and keys, except the softmax's row sum l (the CPU adds keys in order, CUDA per lane,
// then across lanes by shuffles); multiply-adds are fused on the GPU and not in the CPU's
// baseline clone, and the GPU's logf may differ by an ulp. A host emulation of the kernels (one
// thread per CUDA thread) stayed below 3e-7; the bound leaves ~30× for the GPU's differences.
// D = rowsum(dO ⊙ O) is summed in f64 by both, to the same bits.
// Outputs start as NaN, so an element no thread wrote fails the comparison. Every CUDA result
// must repeat bit for bit. Without a GPU these tests skip; the plan test runs everywhere.
#include "engine/ops/attention/attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/attention/attention.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops {
namespace {

constexpr double kTolerance = 1e-5;  // relative to the tensor's largest |cpu| entry

ExecContext Cpu() { return ExecContext::Cpu(); }

Tensor Normal(std::vector<int64_t> shape, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& x : values) x = normal(rng);
  return test_util::MakeTensor(DType::kF32, std::move(shape), values);
}

Tensor NaNs(std::vector<int64_t> shape) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), std::numeric_limits<float>::quiet_NaN());
  return t;
}

// Whether the host tensor `got` is within kTolerance · max(floor, max |want|) of `want`,
// element by element (a NaN fails). Prints the worst ratio, to tune the bound on a GPU.
::testing::AssertionResult Close(const char* name, const Tensor& want, const Tensor& got,
                                 double floor = 0.0) {
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  double max_want = floor;
  for (int64_t i = 0; i < want.numel(); ++i) max_want = std::max(max_want, std::fabs(double{w[i]}));
  const double bound = kTolerance * max_want + 1e-30;
  double worst = 0.0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double diff = std::fabs(double{g[i]} - double{w[i]});
    if (!(diff <= bound)) {
      return ::testing::AssertionFailure()
             << name << "[" << i << "]: cpu " << w[i] << ", cuda " << g[i] << ", bound " << bound
             << " (max |cpu| " << max_want << ")";
    }
    if (diff > worst) worst = diff, worst_at = i;
  }
  std::printf("  %-4s max |cuda - cpu| / max |cpu| = %.3g (at %ld)\n", name,
              max_want > 0 ? worst / max_want : worst, static_cast<long>(worst_at));
  return ::testing::AssertionSuccess();
}

struct Case {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  AttentionShape shape() const { return {batch, seq_len, heads, kv_heads, head_dim}; }
};

// One case: CPU and CUDA forward on the same q, k, v; CPU and CUDA backward on the same q, k, v,
// the CPU's out and lse, and d_out; then both CUDA directions again, compared bit for bit.
void CompareWithTheCpu(const ExecContext& gpu, const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "B " << c.batch << " S " << c.seq_len << " H " << c.heads
                                    << " Hkv " << c.kv_heads << " Dh " << c.head_dim);
  std::printf("B %ld S %ld H %ld Hkv %ld Dh %ld\n", static_cast<long>(c.batch),
              static_cast<long>(c.seq_len), static_cast<long>(c.heads),
              static_cast<long>(c.kv_heads), static_cast<long>(c.head_dim));
  const AttentionShape shape = c.shape();
  const int64_t rows = c.batch * c.seq_len;
  const std::vector<int64_t> q_shape = {rows, c.heads * c.head_dim};
  const std::vector<int64_t> kv_shape = {rows, c.kv_heads * c.head_dim};
  const std::vector<int64_t> lse_shape = {c.batch, c.heads, c.seq_len};
  const Tensor q = Normal(q_shape, rng), k = Normal(kv_shape, rng), v = Normal(kv_shape, rng);
  const Tensor d_out = Normal(q_shape, rng);

  Tensor out = NaNs(q_shape), lse = NaNs(lse_shape);
  ASSERT_OK(CausalAttentionForward(Cpu(), shape, q, k, v, out, lse));
  Tensor d_q = NaNs(q_shape), d_k = NaNs(kv_shape), d_v = NaNs(kv_shape);
  ASSERT_OK(CausalAttentionBackward(Cpu(), shape, q, k, v, out, lse, d_out, d_q, d_k, d_v));

  const Tensor q_gpu = test_util::ToDevice(gpu, q), k_gpu = test_util::ToDevice(gpu, k);
  const Tensor v_gpu = test_util::ToDevice(gpu, v), d_out_gpu = test_util::ToDevice(gpu, d_out);
  const Tensor cpu_out_gpu = test_util::ToDevice(gpu, out);
  const Tensor cpu_lse_gpu = test_util::ToDevice(gpu, lse);

  Tensor results[2][5];  // per run: out, lse, d_q, d_k, d_v
  for (Tensor(&run)[5] : results) {
    const Tensor out_gpu = test_util::ToDevice(gpu, NaNs(q_shape));
    const Tensor lse_gpu = test_util::ToDevice(gpu, NaNs(lse_shape));
    ASSERT_OK(CausalAttentionForward(gpu, shape, q_gpu, k_gpu, v_gpu, out_gpu, lse_gpu));
    const Tensor d_q_gpu = test_util::ToDevice(gpu, NaNs(q_shape));
    const Tensor d_k_gpu = test_util::ToDevice(gpu, NaNs(kv_shape));
    const Tensor d_v_gpu = test_util::ToDevice(gpu, NaNs(kv_shape));
    ASSERT_OK(CausalAttentionBackward(gpu, shape, q_gpu, k_gpu, v_gpu, cpu_out_gpu, cpu_lse_gpu,
                                      d_out_gpu, d_q_gpu, d_k_gpu, d_v_gpu));
    run[0] = test_util::ToHost(gpu, out_gpu);
    run[1] = test_util::ToHost(gpu, lse_gpu);
    run[2] = test_util::ToHost(gpu, d_q_gpu);
    run[3] = test_util::ToHost(gpu, d_k_gpu);
    run[4] = test_util::ToHost(gpu, d_v_gpu);
  }
  EXPECT_TRUE(Close("out", out, results[0][0]));
  EXPECT_TRUE(Close("lse", lse, results[0][1], 1.0));
  EXPECT_TRUE(Close("d_q", d_q, results[0][2]));
  EXPECT_TRUE(Close("d_k", d_k, results[0][3]));
  EXPECT_TRUE(Close("d_v", d_v, results[0][4]));
  const char* names[5] = {"out", "lse", "d_q", "d_k", "d_v"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(test_util::SameBytes(results[0][i], results[1][i])) << names[i] << " repeats";
  }
}

// ---- The plan: host arithmetic, runs everywhere. ----

TEST(AttentionCudaPlanTest, EveryEvenHeadDimHasTheNarrowestWidthThatHoldsIt) {
  for (int64_t dh = 2; dh <= cuda::kAttentionMaxHeadDim; dh += 2) {
    const int width = cuda::AttentionCudaWidth(dh);
    ASSERT_GE(width, dh) << "head_dim " << dh;
    ASSERT_TRUE(width == 32 || width == 64 || width == 128 || width == 256) << width;
    if (width > 32) {
      EXPECT_GT(dh, width / 2) << "head_dim " << dh << " width " << width;
    }
  }
  EXPECT_EQ(cuda::AttentionCudaWidth(258), 0);
  EXPECT_EQ(cuda::AttentionCudaWidth(1024), 0);
}

TEST(AttentionCudaPlanTest, TilesFitTheThreadsAndSharedMemory) {
  constexpr int64_t kHopperOptInBytes = 227 * 1024;  // sm_90's dynamic shared memory per block
  for (int width : {32, 64, 128, 256}) {
    const int block = cuda::AttentionCudaBlock(width);
    const int lanes = cuda::kAttentionThreads / block;
    EXPECT_EQ(cuda::kAttentionThreads % block, 0) << width;
    EXPECT_EQ(32 % lanes, 0) << "a row's lanes share a warp, width " << width;
    EXPECT_EQ(width % lanes, 0) << width;
    EXPECT_EQ(block % lanes, 0) << width;
    for (cuda::AttentionKernel kernel :
         {cuda::AttentionKernel::kForward, cuda::AttentionKernel::kBackwardKv,
          cuda::AttentionKernel::kBackwardQ}) {
      const int64_t bytes = cuda::AttentionCudaSharedBytes(kernel, width);
      EXPECT_GT(bytes, 0);
      EXPECT_LE(bytes, kHopperOptInBytes) << "width " << width;
    }
  }
}

// ---- CUDA against the CPU. ----

TEST(AttentionCudaTest, MatchesTheCpuAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  // (H, Hkv): GQA groups of 4, MHA, one kv head for an odd group.
  const int64_t heads[3][2] = {{8, 2}, {3, 3}, {4, 1}};
  const int64_t seq_lens[] = {1, 63, 64, 65, 200, 1024};
  const int64_t head_dims[] = {16, 64, 72, 128, 256};
  int index = 0;
  for (int64_t dh : head_dims) {
    for (int64_t s : seq_lens) {
      const int64_t* hv = heads[index % 3];
      const int64_t batch = s >= 1024 ? 1 : 1 + (index / 3) % 3;
      ++index;
      CompareWithTheCpu(gpu, {batch, s, hv[0], hv[1], dh}, rng);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(AttentionCudaTest, EveryHeadConfigurationAtEveryWidth) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  for (int64_t dh : {16, 64, 72, 128, 256}) {
    CompareWithTheCpu(gpu, {3, 130, 8, 2, dh}, rng);
    CompareWithTheCpu(gpu, {2, 97, 2, 2, dh}, rng);
    CompareWithTheCpu(gpu, {2, 33, 6, 1, dh}, rng);
    if (HasFatalFailure()) return;
  }
}

// A long sequence: the kernels hold one tile of scores per thread block and the backward one
// (B, H, S) buffer, never S × S (here 256 MiB per head in f32).
TEST(AttentionCudaTest, LongSequenceNeedsNoQuadraticMemory) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  CompareWithTheCpu(gpu, {1, 8192, 2, 2, 64}, rng);
}

TEST(AttentionCudaTest, HeadDimAboveTheKernelsIsUnimplemented) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const AttentionShape shape{1, 4, 1, 1, 258};
  const std::vector<int64_t> dims = {4, 258};
  std::mt19937 rng(1);
  const Tensor x = test_util::ToDevice(gpu, Normal(dims, rng));
  const Tensor out = test_util::ToDevice(gpu, NaNs(dims));
  const Tensor lse = test_util::ToDevice(gpu, NaNs({1, 1, 4}));
  const absl::Status status = CausalAttentionForward(gpu, shape, x, x, x, out, lse);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_NE(status.message().find("head_dim = 258"), std::string::npos) << status;
}

}  // namespace
}  // namespace moetrain::ops
