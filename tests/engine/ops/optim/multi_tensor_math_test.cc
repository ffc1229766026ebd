// The host-device search and tiling that the optimizer's CUDA kernels run (multi_tensor_math.h),
// checked on the CPU: the search agrees with std::upper_bound, and the tiles of any list of
// tensors cover every element of every tensor exactly once.
#include "engine/ops/optim/multi_tensor_math.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

TEST(MultiTensorMathTest, SearchFindsTheLastStartAtOrBelow) {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 200; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 40);
    // Non-decreasing starts from 0, with repeats (tensors of no elements).
    std::vector<int64_t> starts(count + 1, 0);
    for (int i = 1; i <= count; ++i) starts[i] = starts[i - 1] + (rng() % 3 == 0 ? 0 : rng() % 9);
    for (int64_t x = 0; x < starts[count]; ++x) {
      const int want =
          static_cast<int>(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin()) - 1;
      ASSERT_EQ(LastStartAtOrBelow(starts.data(), count, x), want) << "x " << x;
      // The tensor found holds x.
      ASSERT_LE(starts[want], x);
      ASSERT_LT(x, starts[want + 1]);
    }
  }
}

TEST(MultiTensorMathTest, TilesCoverEveryElementOnce) {
  std::mt19937 rng(std::random_device{}());
  const int64_t k = kOptimTileElements;
  // Sizes around the tile: none, one element, one short of a tile, a tile, one over, several.
  const std::vector<int64_t> sizes = {0, 1, 3, k - 1, k, k + 1, 3 * k, 3 * k + 5, 7};
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> numel;
    const int count = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < count; ++i) numel.push_back(sizes[rng() % sizes.size()]);
    std::vector<int64_t> tile_start(count + 1, 0);
    for (int i = 0; i < count; ++i) tile_start[i + 1] = tile_start[i] + OptimTilesOf(numel[i]);
    std::vector<std::vector<int>> seen(count);
    for (int i = 0; i < count; ++i) seen[i].assign(numel[i], 0);
    for (int64_t t = 0; t < tile_start[count]; ++t) {
      const OptimTile tile = OptimTileOf(tile_start.data(), numel.data(), count, t);
      ASSERT_GE(tile.tensor, 0);
      ASSERT_LT(tile.tensor, count);
      ASSERT_EQ(tile.begin % k, 0);
      ASSERT_GE(tile.len, 1);
      ASSERT_LE(tile.len, k);
      ASSERT_LE(tile.begin + tile.len, numel[tile.tensor]);
      for (int64_t j = 0; j < tile.len; ++j) ++seen[tile.tensor][tile.begin + j];
    }
    for (int i = 0; i < count; ++i) {
      for (int64_t j = 0; j < numel[i]; ++j) ASSERT_EQ(seen[i][j], 1) << i << " " << j;
    }
  }
  EXPECT_EQ(OptimTilesOf(0), 0);
  EXPECT_EQ(OptimTilesOf(1), 1);
  EXPECT_EQ(OptimTilesOf(k), 1);
  EXPECT_EQ(OptimTilesOf(k + 1), 2);
  // Past 2^31 elements the tile count and offsets stay exact (int64).
  EXPECT_EQ(OptimTilesOf(int64_t{5} << 31), (int64_t{5} << 31) / k);
}

}  // namespace
}  // namespace moetrain
