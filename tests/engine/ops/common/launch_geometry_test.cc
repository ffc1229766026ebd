// The launch geometry of the ops' CUDA kernels, on the CPU: every grid is at least one block
// (a zero-block launch is an error), covers its items or caps for a grid-stride loop, and 16-byte
// vectors are used only where every row starts aligned.
#include "engine/ops/common/launch_geometry.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace moetrain::ops {
namespace {

TEST(LaunchGeometryTest, BlocksCoverTheItemsAndNeverDropToZero) {
  EXPECT_EQ(BlocksFor(0, 256, 1000), 1);
  EXPECT_EQ(BlocksFor(1, 256, 1000), 1);
  EXPECT_EQ(BlocksFor(256, 256, 1000), 1);
  EXPECT_EQ(BlocksFor(257, 256, 1000), 2);
  EXPECT_EQ(BlocksFor(1000 * 256, 256, 1000), 1000);
  EXPECT_EQ(BlocksFor(1000 * 256 + 1, 256, 1000), 1000);  // the loop strides over the rest
}

// Items past 2^31 (rows × hidden of a large permutation) neither overflow nor exceed the cap.
TEST(LaunchGeometryTest, GridStrideGridsStayWithinEightBlocksPerSm) {
  EXPECT_EQ(GridStrideBlocks(int64_t{1} << 33, 132), 132 * kGridStrideBlocksPerSm);
  EXPECT_EQ(GridStrideBlocks(5, 132), 1);
  EXPECT_EQ(GridStrideBlocks(kThreadsPerBlock * 3 + 1, 132), 4);
  for (int64_t items : {int64_t{0}, int64_t{1}, int64_t{12345}, (int64_t{1} << 31) + 7}) {
    const int64_t blocks = GridStrideBlocks(items, 132);
    EXPECT_GE(blocks, 1);
    EXPECT_LE(blocks, 132 * kGridStrideBlocksPerSm);
    // Blocks × threads × iterations reach every item: the loop runs ceil(items / stride) times.
    EXPECT_GE(blocks * kThreadsPerBlock *
                  ((items + blocks * kThreadsPerBlock - 1) / (blocks * kThreadsPerBlock)),
              items);
  }
}

TEST(LaunchGeometryTest, SixteenByteVectorsOnlyWhereEveryRowStartsAligned) {
  EXPECT_TRUE(CanUse16ByteVectors(0x1000, 8, 2));   // 8 bf16 = 16 bytes per row
  EXPECT_FALSE(CanUse16ByteVectors(0x1000, 7, 2));  // row 1 starts 14 bytes in
  EXPECT_TRUE(CanUse16ByteVectors(0x1000, 4, 4));   // 4 f32
  EXPECT_FALSE(CanUse16ByteVectors(0x1008, 4, 4));  // base only 8-byte aligned
  EXPECT_TRUE(CanUse16ByteVectors(0x1000, 4096, 2));
}

}  // namespace
}  // namespace moetrain::ops
