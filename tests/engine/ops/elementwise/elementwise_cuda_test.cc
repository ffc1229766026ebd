// The CUDA element-wise ops against their CPU twins on fresh random inputs (the seed is printed
// with any failure). Tolerances:
// - CopyTensor, ConvertTensor, Fill, Add: bit-identical (the same conversions, one f32 add).
// - FillNormal: |cuda − cpu| ≤ 1e-6 · (|mean| + |stddev|·(|z| + 1)), z the CPU's normal value:
//   the Philox words are the same integers, sqrtf and the affine step round alike (correctly
//   rounded, unfused), but CUDA's logf (≤ 1 ulp) and cosf (≤ 2 ulp) need not round as glibc's
//   do, a few ulp (< 1e-6 relative) of z.
// Without a GPU the CUDA tests skip; the host emulation of FillNormal's kernel runs everywhere.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/exec_context.h"
#include "engine/core/dtype.h"
#include "engine/core/philox_math.h"
#include "engine/core/rng.h"
#include "engine/core/tensor.h"
#include "engine/ops/elementwise/elementwise.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/ops/act_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain::ops_test {
namespace {

// A new seed per run, so that every run tries other inputs; a failure prints it.
uint32_t FreshSeed() { return std::random_device{}(); }

// Shapes: one element, sizes that are no multiple of 2, 4 or 8, one above a grid's worth of
// blocks, and none at all.
const std::vector<std::vector<int64_t>> kShapes = {{1, 1},      {37, 23}, {1, 1001},
                                                   {3000, 301}, {0, 5},   {7, 0}};

// A host tensor of `dtype` with random bits (f32, bf16: random finite values).
Tensor RandomHost(DType dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor t = Tensor::Empty(dtype, shape);
  const int64_t n = t.numel();
  std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32:
        t.data<float>()[i] = value(rng);
        break;
      case DType::kBF16:
        t.data<BF16>()[i] = FloatToBF16(value(rng));
        break;
      case DType::kI32:
        t.data<int32_t>()[i] = static_cast<int32_t>(rng());
        break;
      case DType::kI64:
        t.data<int64_t>()[i] = static_cast<int64_t>(uint64_t{rng()} << 32 | rng());
        break;
      default:
        ADD_FAILURE() << "no random values for this dtype";
    }
  }
  return t;
}

// f32 values with the specials a conversion must get right, at fixed places.
void PlantSpecials(Tensor& t) {
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(),  // rounds up to infinity
                            std::numeric_limits<float>::denorm_min(),
                            1.00390625f,  // halfway between two bf16 values: to even
                            1.01171875f};
  const int64_t n = t.numel();
  for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i) {
    t.data<float>()[static_cast<int64_t>(i) * 7 % n] = specials[i];
  }
}

// A device tensor of `dtype` holding random bytes: outputs an op must overwrite entirely.
Tensor GarbageDevice(const ExecContext& gpu, DType dtype, const std::vector<int64_t>& shape,
                     std::mt19937& rng) {
  Tensor host = Tensor::Empty(dtype, shape);
  auto* bytes = static_cast<unsigned char*>(host.view().raw());
  for (int64_t i = 0; i < host.numel() * static_cast<int64_t>(DTypeSize(dtype)); ++i) {
    bytes[i] = static_cast<unsigned char>(rng());
  }
  return test_util::ToDevice(gpu, host);
}

// ---------------------------------------------------------------------------------------------
// CopyTensor.
// ---------------------------------------------------------------------------------------------

TEST(ElementwiseCudaTest, CopyRoundTripsBitExactlyInEveryDirection) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64}) {
    for (const std::vector<int64_t>& shape : kShapes) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " (" << shape[0] << ", " << shape[1] << ")");
      const Tensor host = RandomHost(dtype, shape, rng);
      const Tensor device = test_util::ToDevice(gpu, host);  // host → device
      Tensor device_copy = GarbageDevice(gpu, dtype, shape, rng);
      ASSERT_OK(ops::CopyTensor(gpu, device, device_copy));     // device → device
      const Tensor back = test_util::ToHost(gpu, device_copy);  // device → host
      EXPECT_TRUE(test_util::SameBytes(host, back));
      // Host → host through a CUDA context stays a plain copy.
      Tensor host_copy = Tensor::Empty(dtype, shape);
      ASSERT_OK(ops::CopyTensor(gpu, host, host_copy));
      EXPECT_TRUE(test_util::SameBytes(host, host_copy));
    }
  }
}

TEST(ElementwiseCudaTest, CopyGathersAStridedHostSource) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
    const Tensor full = RandomHost(dtype, {19, 13}, rng);
    // Every other column of rows 2.., and the transpose: neither is dense.
    const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
    const TensorView columns(static_cast<char*>(full.view().raw()) + 2 * 13 * size, dtype, {17, 6},
                             {13, 2});
    const TensorView transposed(full.view().raw(), dtype, {13, 19}, {1, 13});
    for (const TensorView& strided : {columns, transposed}) {
      ASSERT_FALSE(strided.is_contiguous());
      Tensor want = Tensor::Empty(dtype, strided.shape());
      ASSERT_OK(ops::CopyTensor(ExecContext::Cpu(), strided, want));
      const Tensor device = test_util::ToDevice(gpu, strided);
      const Tensor back = test_util::ToHost(gpu, device);
      EXPECT_TRUE(test_util::SameBytes(want, back)) << DTypeName(dtype);
    }
  }
}

TEST(ElementwiseCudaTest, CopyToHostWaitsForTheOpsBefore) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  // A large fill queued just before the copy: the host must see its result, not the old bytes.
  const std::vector<int64_t> shape = {4096, 4097};
  absl::StatusOr<Tensor> t = Tensor::Allocate(gpu.allocator(), DType::kF32, shape);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_OK(ops::Fill(gpu, *t, 1.0f));
  ASSERT_OK(ops::Fill(gpu, *t, 2.5f));
  const Tensor back = test_util::ToHost(gpu, *t);
  for (int64_t i = 0; i < back.numel(); ++i) {
    ASSERT_EQ(back.data<float>()[i], 2.5f) << "element " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// ConvertTensor.
// ---------------------------------------------------------------------------------------------

TEST(ElementwiseCudaTest, ConvertIsBitIdenticalToTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext cpu = ExecContext::Cpu();
  for (const std::vector<int64_t>& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << "(" << shape[0] << ", " << shape[1] << ")");
    for (DType from : {DType::kF32, DType::kBF16}) {
      Tensor src = RandomHost(from, shape, rng);
      if (from == DType::kF32) PlantSpecials(src);
      const Tensor src_gpu = test_util::ToDevice(gpu, src);
      for (DType to : {DType::kF32, DType::kBF16}) {
        Tensor want = Tensor::Empty(to, shape);
        ASSERT_OK(ops::ConvertTensor(cpu, src, want));
        Tensor got_gpu = GarbageDevice(gpu, to, shape, rng);
        ASSERT_OK(ops::ConvertTensor(gpu, src_gpu, got_gpu));
        EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, got_gpu)))
            << DTypeName(from) << " → " << DTypeName(to);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Add.
// ---------------------------------------------------------------------------------------------

// Columns into and out of a wider tensor (the MTP modules' concatenation and its split).
TEST(ElementwiseCudaTest, CopyColumnsIsBitIdenticalToTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor src = RandomHost(dtype, {37, 23}, rng);
    const Tensor dst_start = RandomHost(dtype, {37, 51}, rng);
    Tensor want = Tensor::Empty(dtype, {37, 51});
    ASSERT_OK(ops::CopyTensor(ExecContext::Cpu(), dst_start, want));
    ASSERT_OK(ops::CopyColumns(ExecContext::Cpu(), src, 3, want, 28, 20));
    const Tensor dst_gpu = test_util::ToDevice(gpu, dst_start);
    ASSERT_OK(ops::CopyColumns(gpu, test_util::ToDevice(gpu, src), 3, dst_gpu, 28, 20));
    EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, dst_gpu)));
  }
}

TEST(ElementwiseCudaTest, AddIsBitIdenticalToTheCpuAndMayWriteIntoA) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext cpu = ExecContext::Cpu();
  for (const std::vector<int64_t>& shape : kShapes) {
    for (DType b_dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << "b " << DTypeName(b_dtype) << " (" << shape[0] << ", " << shape[1] << ")");
      const Tensor a = RandomHost(DType::kF32, shape, rng);
      const Tensor b = RandomHost(b_dtype, shape, rng);
      Tensor want = Tensor::Empty(DType::kF32, shape);
      ASSERT_OK(ops::Add(cpu, a, b, want));

      const Tensor a_gpu = test_util::ToDevice(gpu, a), b_gpu = test_util::ToDevice(gpu, b);
      Tensor out_gpu = GarbageDevice(gpu, DType::kF32, shape, rng);
      ASSERT_OK(ops::Add(gpu, a_gpu, b_gpu, out_gpu));
      EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, out_gpu)));
      ASSERT_OK(ops::Add(gpu, a_gpu, b_gpu, a_gpu));  // in place
      EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, a_gpu)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Fill.
// ---------------------------------------------------------------------------------------------

TEST(ElementwiseCudaTest, FillIsBitIdenticalToTheCpu) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext cpu = ExecContext::Cpu();
  // Zero (the memset path), a negative zero (not all-zero bytes), a bf16 tie, truncations
  // toward zero, a value beyond i32 but within i64, and a random one.
  const float values[] = {0.0f,
                          -0.0f,
                          1.00390625f,
                          3.75f,
                          -2.9f,
                          1e10f,
                          std::uniform_real_distribution<float>(-1e4f, 1e4f)(rng)};
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64}) {
    for (const std::vector<int64_t>& shape : kShapes) {
      for (float value : values) {
        // 1e10 does not fit an i32: the conversion is undefined on the host alike.
        if (dtype == DType::kI32 && std::fabs(value) > 2e9f) continue;
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " (" << shape[0] << ", "
                                          << shape[1] << ") = " << value);
        Tensor want = Tensor::Empty(dtype, shape);
        ASSERT_OK(ops::Fill(cpu, want, value));
        Tensor got_gpu = GarbageDevice(gpu, dtype, shape, rng);
        ASSERT_OK(ops::Fill(gpu, got_gpu, value));
        EXPECT_TRUE(test_util::SameBytes(want, test_util::ToHost(gpu, got_gpu)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// FillNormal.
// ---------------------------------------------------------------------------------------------

// The kernel's loop nest on the host (one thread per Philox block, two values each): the same
// per-element functions give exactly Rng::FillNormal's values. Runs without a GPU.
TEST(ElementwiseCudaTest, FillNormalKernelEmulationMatchesRngExactly) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1001}}) {
    const Rng stream(uint64_t{rng()} << 32 | rng(), rng(), rng() & 0xFF, rng() & 0xFF);
    const float mean = 0.25f, stddev = 0.02f;
    std::vector<float> want(n), got(n, std::numeric_limits<float>::quiet_NaN());
    stream.FillNormal(want.data(), n, mean, stddev);
    const PhiloxStream words = stream.philox_stream();
    for (int64_t b = 0; b < (n + 1) / 2; ++b) {
      const PhiloxWords block = PhiloxStreamBlock(words, static_cast<uint64_t>(b));
      got[2 * b] = PhiloxNormalOfBlock(block, 0, mean, stddev);
      if (2 * b + 1 < n) got[2 * b + 1] = PhiloxNormalOfBlock(block, 1, mean, stddev);
    }
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), n * sizeof(float))) << "n = " << n;
  }
}

TEST(ElementwiseCudaTest, FillNormalFollowsTheCpuStreamAndRepeats) {
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext cpu = ExecContext::Cpu();
  for (const std::vector<int64_t>& shape : kShapes) {
    SCOPED_TRACE(::testing::Message() << "(" << shape[0] << ", " << shape[1] << ")");
    const Rng stream(uint64_t{rng()} << 32 | rng(), rng(), rng() & 0xFF, rng() & 0xFF);
    const float mean = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    const float stddev = std::uniform_real_distribution<float>(0.01f, 2.0f)(rng);
    Tensor want = Tensor::Empty(DType::kF32, shape);
    ASSERT_OK(ops::FillNormal(cpu, want, stream, mean, stddev));

    Tensor got_gpu = GarbageDevice(gpu, DType::kF32, shape, rng);
    ASSERT_OK(ops::FillNormal(gpu, got_gpu, stream, mean, stddev));
    const Tensor got = test_util::ToHost(gpu, got_gpu);
    int64_t exact = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double w = want.data<float>()[i], g = got.data<float>()[i];
      const double z = (w - mean) / stddev;
      const double bound = 1e-6 * (std::fabs(mean) + stddev * (std::fabs(z) + 1.0));
      ASSERT_LE(std::fabs(g - w), bound) << "element " << i << ": cpu " << w << ", cuda " << g;
      exact += (g == w);
    }
    if (want.numel() > 0) {
      RecordProperty("fill_normal_bit_identical_fraction",
                     std::to_string(static_cast<double>(exact) / want.numel()));
    }

    Tensor again_gpu = GarbageDevice(gpu, DType::kF32, shape, rng);
    ASSERT_OK(ops::FillNormal(gpu, again_gpu, stream, mean, stddev));
    EXPECT_TRUE(test_util::SameBytes(got, test_util::ToHost(gpu, again_gpu)));
  }
}

}  // namespace
}  // namespace moetrain::ops_test
