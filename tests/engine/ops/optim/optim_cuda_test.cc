// The optimizer's ops on CUDA against the CPU backend, on fresh random inputs (the seed is printed
// with any failure). Tolerance: none. AdamW and the scaling round every operation alike on both
// sides (adamw_math.h: no fused multiply-add on either, IEEE division and square root), and the
// squared norm adds in the CPU's fixed order (optim_cpu.h), so every finite result must be the
// CPU's bits; NaN results must be NaN on both (their payloads may differ). The squared norm is
// also checked against a plain f64 sum (relative 1e-12: f64 sums of f32 squares over ~1e6 terms
// differ from any other order by far less). Every CUDA result repeats bit for bit.
//
// Sizes cover one element, odd sizes, a tile ± 1 (kOptimTileElements), a norm block ± 1
// (kNormBlock), 2^20 + 5, tensors one element past a 16-byte boundary (the kernels' scalar
// path), and lists longer than one launch takes (kMaxTensorsPerLaunch = 512).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/ops/elementwise/elementwise.h"
#include "engine/ops/optim/adamw_math.h"
#include "engine/ops/optim/optim.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"
#include "tests/testing/testing.h"

namespace moetrain::ops {
namespace {

using test_util::MakeTensor;
using test_util::SameBytes;
using test_util::ToDevice;
using test_util::ToHost;

uint32_t FreshSeed() { return std::random_device{}(); }

// One f32 tensor of `values` on the host and a copy on the GPU, each either at the start of its
// buffer or one element in (4 bytes past a 16-byte boundary).
struct Pair {
  Tensor host_storage, device_storage;
  TensorView host, device;
};
Pair MakePair(const ExecContext& gpu, const std::vector<float>& values, bool misaligned) {
  const int64_t n = static_cast<int64_t>(values.size()), skip = misaligned ? 1 : 0;
  std::vector<float> padded(n + skip, 0.0f);
  std::copy(values.begin(), values.end(), padded.begin() + skip);
  Pair pair;
  pair.host_storage = MakeTensor(DType::kF32, {n + skip}, padded);
  pair.device_storage = ToDevice(gpu, pair.host_storage);
  pair.host = pair.host_storage.view().Slice(skip, n + skip);
  pair.device = pair.device_storage.view().Slice(skip, n + skip);
  return pair;
}

// Host views of the pairs' host or device sides.
std::vector<TensorView> Hosts(const std::vector<Pair>& pairs) {
  std::vector<TensorView> views;
  for (const Pair& pair : pairs) views.push_back(pair.host);
  return views;
}
std::vector<TensorView> Devices(const std::vector<Pair>& pairs) {
  std::vector<TensorView> views;
  for (const Pair& pair : pairs) views.push_back(pair.device);
  return views;
}

std::vector<float> Uniform(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Whether the GPU side of every pair holds the host side's bytes; names the first difference.
::testing::AssertionResult SameAsHost(const ExecContext& gpu, const std::vector<Pair>& pairs,
                                      const char* what) {
  for (size_t i = 0; i < pairs.size(); ++i) {
    const Tensor got = ToHost(gpu, pairs[i].device);
    if (SameBytes(got, pairs[i].host)) continue;
    const float* want = pairs[i].host.data<float>();
    for (int64_t j = 0; j < got.numel(); ++j) {
      if (std::memcmp(&want[j], &got.data<float>()[j], sizeof(float)) != 0) {
        return ::testing::AssertionFailure() << what << "[" << i << "][" << j << "]: cpu "
                                             << want[j] << ", cuda " << got.data<float>()[j];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The scalars of AdamW step t, as train/optimizer.cc computes them.
AdamWScalars Scalars(int64_t t, float lr, float weight_decay) {
  const float beta1 = 0.9f, beta2 = 0.95f;
  const double bias1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  AdamWScalars s;
  s.beta1 = beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.step_size = static_cast<float>(lr / bias1);
  s.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  s.eps = 1e-8f;
  s.decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  return s;
}

constexpr int64_t kTile = 4096;      // kOptimTileElements
constexpr int64_t kBlock = 1 << 16;  // kNormBlock

// The sizes of most tests, and whether each sits one element past an aligned start.
struct Shape {
  int64_t numel;
  bool misaligned;
};
const Shape kShapes[] = {{1, false},          {3, false},
                         {1001, false},       {kTile - 1, false},
                         {kTile, false},      {kTile + 1, true},
                         {1001, true},        {kBlock - 1, true},
                         {kBlock + 1, false}, {(1 << 20) + 5, false}};

// `count` tensors of sizes 1–50, every third misaligned: more than one launch's worth.
std::vector<Shape> ManySmall(int count, std::mt19937& rng) {
  std::vector<Shape> shapes;
  for (int i = 0; i < count; ++i)
    shapes.push_back({1 + static_cast<int64_t>(rng() % 50), i % 3 == 0});
  return shapes;
}

// kShapes' edge sizes followed by 600 small tensors.
std::vector<Shape> EdgesAndManySmall(std::mt19937& rng) {
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  for (const Shape& shape : ManySmall(600, rng)) shapes.push_back(shape);
  return shapes;
}

// AdamW inputs: params, grads, and both moments, over `shapes`. Grads include 0, −0, values
// whose square is subnormal (1e-20) or overflows (1e20), so that both sides handle them alike.
struct AdamWState {
  std::vector<Pair> p, g, m, v;
};
AdamWState MakeAdamWState(const ExecContext& gpu, const std::vector<Shape>& shapes,
                          std::mt19937& rng) {
  AdamWState state;
  const float specials[] = {0.0f, -0.0f, 1e-20f, -3e-21f, 1e20f, 1e-3f};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = shapes[i].numel;
    const bool misaligned = shapes[i].misaligned;
    std::vector<float> g = Uniform(n, -1e-2f, 1e-2f, rng);
    for (int64_t j = 0; j < n; j += 97) g[j] = specials[(j / 97) % std::size(specials)];
    std::vector<float> v = Uniform(n, 0.0f, 1e-3f, rng);
    for (int64_t j = 0; j < n; j += 89) v[j] = 0.0f;
    state.p.push_back(MakePair(gpu, Uniform(n, -1.0f, 1.0f, rng), misaligned));
    state.g.push_back(MakePair(gpu, g, misaligned));
    state.m.push_back(MakePair(gpu, Uniform(n, -0.1f, 0.1f, rng), !misaligned && i % 2 == 1));
    state.v.push_back(MakePair(gpu, v, misaligned));
  }
  return state;
}

// Three AdamW steps of `shapes` on both backends, tensors alternating weight decay on and off;
// the GPU's parameters and moments must be the CPU's bits after every step. Returns the GPU's
// final parameters (host copies), for the run-to-run check.
std::vector<Tensor> RunAdamW(const ExecContext& gpu, const std::vector<Shape>& shapes,
                             uint32_t seed) {
  std::mt19937 rng(seed);
  AdamWState state = MakeAdamWState(gpu, shapes, rng);
  std::vector<bool> decay(shapes.size());
  for (size_t i = 0; i < decay.size(); ++i) decay[i] = i % 2 == 0;
  const auto p_cpu = Hosts(state.p), g_cpu = Hosts(state.g), m_cpu = Hosts(state.m),
             v_cpu = Hosts(state.v);
  const auto p_gpu = Devices(state.p), g_gpu = Devices(state.g), m_gpu = Devices(state.m),
             v_gpu = Devices(state.v);
  for (int64_t t = 1; t <= 3; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    const float lr = 1e-3f * static_cast<float>(t);
    AdamWScalars plain = Scalars(t, lr, 0.1f);
    const AdamWScalars decaying = plain;
    plain.decay = 1.0f;
    EXPECT_TRUE(AdamWStep(ExecContext::Cpu(), {.params = p_cpu,
                                               .grads = g_cpu,
                                               .exp_avg = m_cpu,
                                               .exp_avg_sq = v_cpu,
                                               .weight_decay = &decay,
                                               .decaying = decaying,
                                               .plain = plain})
                    .ok());
    const absl::Status status = AdamWStep(gpu, {.params = p_gpu,
                                                .grads = g_gpu,
                                                .exp_avg = m_gpu,
                                                .exp_avg_sq = v_gpu,
                                                .weight_decay = &decay,
                                                .decaying = decaying,
                                                .plain = plain});
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_TRUE(SameAsHost(gpu, state.p, "params"));
    EXPECT_TRUE(SameAsHost(gpu, state.m, "exp_avg"));
    EXPECT_TRUE(SameAsHost(gpu, state.v, "exp_avg_sq"));
    EXPECT_TRUE(SameAsHost(gpu, state.g, "grads"));  // read, never written
  }
  std::vector<Tensor> result;
  for (const Pair& pair : state.p) result.push_back(ToHost(gpu, pair.device));
  return result;
}

TEST(OptimCudaTest, AdamWMatchesTheCpuBitForBitAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  const std::vector<Tensor> first = RunAdamW(gpu, shapes, seed);
  const std::vector<Tensor> second = RunAdamW(gpu, shapes, seed);
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(SameBytes(first[i], second[i])) << i;
}

TEST(OptimCudaTest, AdamWOverMoreTensorsThanOneLaunchTakes) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();  // for the shapes and RunAdamW's values
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<Shape> shapes = ManySmall(1100, rng);
  shapes[600] = {kTile + 3, false};  // a multi-tile tensor in the second launch
  RunAdamW(gpu, shapes, seed);
}

// BF16 moments: three steps on both backends from the same bf16 m and v (each tensor's own, at
// the start of its buffer); the GPU's parameters and moments must be the CPU's bits.
TEST(OptimCudaTest, AdamWWithBf16MomentsMatchesTheCpuBitForBit) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  AdamWState state = MakeAdamWState(gpu, shapes, rng);
  std::vector<Tensor> m_host, v_host, m_device, v_device;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (const auto& [pair, host, device] : {std::tuple(&state.m[i], &m_host, &m_device),
                                             std::tuple(&state.v[i], &v_host, &v_device)}) {
      host->push_back(Tensor::Empty(DType::kBF16, {shapes[i].numel}));
      ASSERT_OK(ConvertTensor(ExecContext::Cpu(), pair->host, host->back()));
      device->push_back(ToDevice(gpu, host->back()));
    }
  }
  const auto views = [](const std::vector<Tensor>& tensors) {
    std::vector<TensorView> out;
    for (const Tensor& t : tensors) out.push_back(t.view());
    return out;
  };
  std::vector<bool> decay(shapes.size());
  for (size_t i = 0; i < decay.size(); ++i) decay[i] = i % 2 == 1;
  const auto p_cpu = Hosts(state.p), g_cpu = Hosts(state.g), p_gpu = Devices(state.p),
             g_gpu = Devices(state.g);
  const auto m_cpu = views(m_host), v_cpu = views(v_host), m_gpu = views(m_device),
             v_gpu = views(v_device);
  for (int64_t t = 1; t <= 3; ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    AdamWScalars plain = Scalars(t, 1e-3f, 0.1f);
    const AdamWScalars decaying = plain;
    plain.decay = 1.0f;
    ASSERT_OK(AdamWStep(ExecContext::Cpu(), {.params = p_cpu,
                                             .grads = g_cpu,
                                             .exp_avg = m_cpu,
                                             .exp_avg_sq = v_cpu,
                                             .weight_decay = &decay,
                                             .decaying = decaying,
                                             .plain = plain}));
    ASSERT_OK(AdamWStep(gpu, {.params = p_gpu,
                              .grads = g_gpu,
                              .exp_avg = m_gpu,
                              .exp_avg_sq = v_gpu,
                              .weight_decay = &decay,
                              .decaying = decaying,
                              .plain = plain}));
    EXPECT_TRUE(SameAsHost(gpu, state.p, "params"));
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_TRUE(SameBytes(ToHost(gpu, m_device[i]), m_host[i])) << "exp_avg " << i;
      EXPECT_TRUE(SameBytes(ToHost(gpu, v_device[i]), v_host[i])) << "exp_avg_sq " << i;
    }
  }
}

// Σ x² of the host views in f64, in index order: the reference the CPU's order is checked against.
double PlainSquaredSum(const std::vector<TensorView>& views) {
  double sum = 0.0;
  for (const TensorView& view : views) {
    for (int64_t j = 0; j < view.numel(); ++j) {
      const double x = view.data<float>()[j];
      sum += x * x;
    }
  }
  return sum;
}

TEST(OptimCudaTest, SquaredNormIsTheCpusBitsAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  std::vector<std::vector<Shape>> lists = {
      std::vector<Shape>(std::begin(kShapes), std::end(kShapes)),
      ManySmall(5000, rng),  // many tensors in one norm block, some across two
      {{1, false}},
      {{kBlock, false}, {kBlock, true}, {2 * kBlock + 7, false}},
  };
  for (size_t l = 0; l < lists.size(); ++l) {
    SCOPED_TRACE(::testing::Message() << "list " << l);
    std::vector<Pair> pairs;
    for (const Shape& shape : lists[l]) {
      std::vector<float> values = Uniform(shape.numel, -3.0f, 3.0f, rng);
      values[0] = l == 2 ? 1e-30f : values[0];  // a square far below f32's range, exact in f64
      pairs.push_back(MakePair(gpu, values, shape.misaligned));
    }
    const absl::StatusOr<double> cpu = SquaredNorm(ExecContext::Cpu(), Hosts(pairs));
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const absl::StatusOr<double> cuda = SquaredNorm(gpu, Devices(pairs));
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    const absl::StatusOr<double> again = SquaredNorm(gpu, Devices(pairs));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(std::memcmp(&*cpu, &*cuda, sizeof(double)), 0) << *cpu << " vs " << *cuda;
    EXPECT_EQ(std::memcmp(&*cuda, &*again, sizeof(double)), 0) << *cuda << " vs " << *again;
    const double reference = PlainSquaredSum(Hosts(pairs));
    EXPECT_NEAR(*cuda, reference, 1e-12 * reference);
  }
}

TEST(OptimCudaTest, ScaleTensorsIsTheCpusBits) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const std::vector<Shape> shapes = EdgesAndManySmall(rng);
  std::vector<Pair> pairs;
  for (const Shape& shape : shapes) {
    std::vector<float> values = Uniform(shape.numel, -5.0f, 5.0f, rng);
    values[0] = 1e-39f;  // subnormal in and out
    pairs.push_back(MakePair(gpu, values, shape.misaligned));
  }
  for (const float scale : {0.37f, 1.0f / 3.0f, 1e-5f}) {
    SCOPED_TRACE(::testing::Message() << "scale " << scale);
    ASSERT_TRUE(ScaleTensors(ExecContext::Cpu(), Hosts(pairs), scale).ok());
    const absl::Status status = ScaleTensors(gpu, Devices(pairs), scale);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(SameAsHost(gpu, pairs, "tensors"));
  }
}

// Non-finite values planted one at a time: each is found by both backends, and by the norm (NaN
// stays NaN, ±Inf alone gives +Inf, both agree).
TEST(OptimCudaTest, NonFiniteValuesAreFoundAndPropagate) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  const std::vector<Shape> shapes = EdgesAndManySmall(rng);
  std::vector<std::vector<float>> values;
  for (const Shape& shape : shapes) values.push_back(Uniform(shape.numel, -1.0f, 1.0f, rng));
  struct Plant {
    size_t tensor;
    int64_t index;
  };
  const size_t last = shapes.size() - 1;
  const Plant plants[] = {{0, 0},
                          {2, 1000},
                          {5, kTile},  // the misaligned tensor's last element
                          {9, (1 << 20) + 4},
                          {9, 123457},
                          {600, shapes[600].numel - 1},  // in the second launch
                          {last, shapes[last].numel - 1}};
  const float bad_values[] = {std::nanf(""), INFINITY, -INFINITY};
  {
    std::vector<Pair> clean;
    for (size_t i = 0; i < shapes.size(); ++i) {
      clean.push_back(MakePair(gpu, values[i], shapes[i].misaligned));
    }
    const absl::StatusOr<bool> finite = AllFinite(gpu, Devices(clean));
    ASSERT_TRUE(finite.ok()) << finite.status();
    EXPECT_TRUE(*finite);
  }
  for (const Plant& plant : plants) {
    for (const float bad : bad_values) {
      SCOPED_TRACE(::testing::Message()
                   << bad << " at [" << plant.tensor << "][" << plant.index << "]");
      std::vector<Pair> pairs;
      for (size_t i = 0; i < shapes.size(); ++i) {
        std::vector<float> v = values[i];
        if (i == plant.tensor) v[plant.index] = bad;
        pairs.push_back(MakePair(gpu, v, shapes[i].misaligned));
      }
      const absl::StatusOr<bool> cpu = AllFinite(ExecContext::Cpu(), Hosts(pairs));
      const absl::StatusOr<bool> cuda = AllFinite(gpu, Devices(pairs));
      ASSERT_TRUE(cpu.ok() && cuda.ok()) << cpu.status() << " " << cuda.status();
      EXPECT_FALSE(*cpu);
      EXPECT_FALSE(*cuda);
      const absl::StatusOr<double> norm_cpu = SquaredNorm(ExecContext::Cpu(), Hosts(pairs));
      const absl::StatusOr<double> norm_cuda = SquaredNorm(gpu, Devices(pairs));
      ASSERT_TRUE(norm_cpu.ok() && norm_cuda.ok());
      EXPECT_EQ(std::isnan(*norm_cpu), std::isnan(bad));
      EXPECT_EQ(std::isnan(*norm_cuda), std::isnan(bad));
      if (!std::isnan(bad)) {
        EXPECT_EQ(*norm_cpu, INFINITY);
        EXPECT_EQ(*norm_cuda, INFINITY);
      }
    }
  }
}

// CheckAdamWMoments names the first bad element with its value, in the CPU's very words.
TEST(OptimCudaTest, CheckAdamWMomentsSaysWhatTheCpuSays) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  MOETRAIN_FRESH_RNG(rng);
  struct Bad {
    bool in_v;
    int64_t index;
    float value;
  };
  const int64_t n = (1 << 20) + 5;
  const std::vector<std::vector<Bad>> cases = {
      {},                                                      // valid, −0 in v included
      {{false, 0, std::nanf("")}},                             // the very first element
      {{true, n - 1, -1.0f}},                                  // the very last
      {{true, 777777, INFINITY}, {false, 900000, -INFINITY}},  // the first of two
      {{false, 5000, INFINITY}, {true, 5000, -2.5f}},          // m and v bad at once: m
      {{true, 3, -1e-30f}, {false, 4, std::nanf("")}},         // v first
      {{true, 123456, std::nanf("")}, {true, 123457, -3.0f}},  // NaN v
      {{false, 40000, 1e38f}, {true, 65536, -0.0f}, {true, 65537, -7.0f}},  // finite big m is fine
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(::testing::Message() << "case " << c);
    std::vector<float> m = Uniform(n, -1.0f, 1.0f, rng);
    std::vector<float> v = Uniform(n, 0.0f, 1.0f, rng);
    v[17] = -0.0f;
    for (const Bad& bad : cases[c]) (bad.in_v ? v : m)[bad.index] = bad.value;
    const Pair m_pair = MakePair(gpu, m, c % 2 == 1);
    const Pair v_pair = MakePair(gpu, v, false);
    const absl::Status cpu = CheckAdamWMoments(ExecContext::Cpu(), "w.exp_avg", m_pair.host,
                                               "w.exp_avg_sq", v_pair.host);
    const absl::Status cuda =
        CheckAdamWMoments(gpu, "w.exp_avg", m_pair.device, "w.exp_avg_sq", v_pair.device);
    EXPECT_EQ(cpu.ok(), cases[c].empty()) << cpu;
    EXPECT_EQ(cuda.code(), cpu.code()) << cuda;
    EXPECT_EQ(std::string(cuda.message()), std::string(cpu.message()));
  }
}

}  // namespace
}  // namespace moetrain::ops
