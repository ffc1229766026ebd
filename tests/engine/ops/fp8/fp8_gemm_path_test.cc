// Which path the CUDA Fp8Gemm takes for each pair of scalings and formats (fp8_gemm_path.h): a
// pure function, checked here without a GPU.
#include "engine/ops/fp8/fp8_gemm_path.h"

#include <utility>

#include "engine/core/fp8_math.h"
#include "engine/ops/fp8/fp8.h"
#include "gtest/gtest.h"

namespace moetrain::ops {
namespace {

constexpr Fp8Format kE4M3 = Fp8Format::kE4M3;
constexpr Fp8Format kE5M2 = Fp8Format::kE5M2;
constexpr Fp8Scaling kTensor = Fp8Scaling::kTensor;
constexpr Fp8Scaling k1x128 = Fp8Scaling::kBlock1x128;
constexpr Fp8Scaling k128x128 = Fp8Scaling::kBlock128x128;
constexpr Fp8Scaling kMx = Fp8Scaling::kMx1x32;

TEST(Fp8GemmPathTest, PerTensorPairsRunInCublasLt) {
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, kTensor, kE4M3, kE4M3, 7), Fp8GemmPath::kCublasLtPerTensor);
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, kTensor, kE4M3, kE5M2, 64), Fp8GemmPath::kCublasLtPerTensor);
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, kTensor, kE5M2, kE4M3, 64), Fp8GemmPath::kCublasLtPerTensor);
}

TEST(Fp8GemmPathTest, BlockPairsRunInCublasLtWhenNIsAMultipleOf8) {
  for (const auto& [a, b] :
       {std::pair{k1x128, k1x128}, std::pair{k1x128, k128x128}, std::pair{k128x128, k1x128}}) {
    EXPECT_EQ(ChooseFp8GemmPath(a, b, kE4M3, kE4M3, 256), Fp8GemmPath::kCublasLtBlockwise);
    EXPECT_EQ(ChooseFp8GemmPath(a, b, kE5M2, kE4M3, 8), Fp8GemmPath::kCublasLtBlockwise);
    // cuBLASLt's block-scaled kernels want m (our N) % 8 == 0: the exact f32 GEMM instead.
    EXPECT_EQ(ChooseFp8GemmPath(a, b, kE4M3, kE4M3, 12), Fp8GemmPath::kDequantizedF32);
    EXPECT_EQ(ChooseFp8GemmPath(a, b, kE4M3, kE4M3, 1), Fp8GemmPath::kDequantizedF32);
  }
}

TEST(Fp8GemmPathTest, Mxfp8IsEmulatedInBf16) {
  EXPECT_EQ(ChooseFp8GemmPath(kMx, kMx, kE4M3, kE4M3, 5), Fp8GemmPath::kDequantizedBf16);
  EXPECT_EQ(ChooseFp8GemmPath(kMx, kMx, kE4M3, kE5M2, 64), Fp8GemmPath::kDequantizedBf16);
}

TEST(Fp8GemmPathTest, RefusesWhatHopperCannotMultiply) {
  EXPECT_EQ(ChooseFp8GemmPath(k128x128, k128x128, kE4M3, kE4M3, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, k1x128, kE4M3, kE4M3, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(k128x128, kTensor, kE4M3, kE4M3, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(kMx, k1x128, kE4M3, kE4M3, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, kMx, kE4M3, kE4M3, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(kTensor, kTensor, kE5M2, kE5M2, 64), Fp8GemmPath::kUnsupported);
  EXPECT_EQ(ChooseFp8GemmPath(kMx, kMx, kE5M2, kE5M2, 64), Fp8GemmPath::kUnsupported);
}

// Constant-evaluable: the choice costs nothing at run time and can be checked at compile time.
static_assert(ChooseFp8GemmPath(Fp8Scaling::kBlock1x128, Fp8Scaling::kBlock128x128,
                                Fp8Format::kE4M3, Fp8Format::kE4M3,
                                16) == Fp8GemmPath::kCublasLtBlockwise);

}  // namespace
}  // namespace moetrain::ops
