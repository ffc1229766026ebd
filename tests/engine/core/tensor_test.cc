#include "engine/core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/core/allocator.h"
#include "engine/core/device.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

// The element at `index` of an f32 view, found from strides alone.
float At(const TensorView& v, std::initializer_list<int64_t> index) {
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : index) offset += i * v.stride(d++);
  return v.data<float>()[offset];
}

// A (rows, cols) f32 tensor holding 0, 1, 2, ... in row-major order.
Tensor Iota(int64_t rows, int64_t cols) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, cols});
  std::iota(t.data<float>(), t.data<float>() + t.numel(), 0.0f);
  return t;
}

TEST(TensorViewTest, DefaultIsEmpty) {
  const TensorView v;
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.rank(), 0);
}

TEST(TensorViewTest, ContiguousViewHasRowMajorStrides) {
  float storage[2 * 3 * 4];
  const TensorView v(storage, DType::kF32, {2, 3, 4});
  EXPECT_FALSE(v.empty());
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(std::vector<int64_t>(v.shape().begin(), v.shape().end()),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.raw(), storage);
  EXPECT_EQ(v.DebugString(), "(2, 3, 4) f32");
}

TEST(TensorViewTest, ScalarViewHasOneElement) {
  float x = 1;
  const TensorView v(&x, DType::kBF16, {});
  EXPECT_EQ(v.rank(), 0);
  EXPECT_EQ(v.numel(), 1);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.DebugString(), "() bf16");
}

TEST(TensorViewTest, StridedViewsAndContiguity) {
  Tensor t = Iota(4, 6);
  // The transpose: (6, 4) with strides (1, 6).
  const TensorView transposed(t.data<float>(), DType::kF32, {6, 4}, {1, 6});
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_EQ(At(transposed, {5, 2}), 2 * 6 + 5);
  // Every other column: rows still 6 apart, but columns 2 apart.
  const TensorView even_columns(t.data<float>(), DType::kF32, {4, 3}, {6, 2});
  EXPECT_FALSE(even_columns.is_contiguous());
  EXPECT_EQ(At(even_columns, {3, 2}), 3 * 6 + 4);
  // A dimension of extent 1 is contiguous whatever its stride.
  const TensorView one_row(t.data<float>(), DType::kF32, {1, 6}, {999, 1});
  EXPECT_TRUE(one_row.is_contiguous());
}

TEST(TensorViewTest, SliceOffsetsRowsAndKeepsStrides) {
  Tensor t = Iota(8, 4);
  const TensorView rows = t.view().Slice(2, 5);
  EXPECT_EQ(rows.dim(0), 3);
  EXPECT_EQ(rows.dim(1), 4);
  EXPECT_EQ(rows.stride(0), 4);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.data<float>(), t.data<float>() + 2 * 4);
  EXPECT_EQ(At(rows, {0, 0}), 8);
  EXPECT_EQ(At(rows, {2, 3}), 19);
  // A slice of a slice, and of a strided view: offsets follow the strides.
  EXPECT_EQ(At(rows.Slice(1, 3), {0, 1}), 13);
  const TensorView transposed(t.data<float>(), DType::kF32, {4, 8}, {1, 4});
  const TensorView columns = transposed.Slice(1, 3);
  EXPECT_EQ(columns.dim(0), 2);
  EXPECT_EQ(At(columns, {0, 7}), 7 * 4 + 1);
  EXPECT_FALSE(columns.is_contiguous());
}

TEST(TensorViewTest, SliceOffsetUsesTheElementSize) {
  std::vector<uint16_t> storage(6 * 5);
  const TensorView v(storage.data(), DType::kBF16, {6, 5});
  EXPECT_EQ(v.Slice(3, 6).data<uint16_t>(), storage.data() + 15);
  std::vector<int64_t> wide(6 * 5);
  const TensorView w(wide.data(), DType::kI64, {6, 5});
  EXPECT_EQ(w.Slice(3, 6).data<int64_t>(), wide.data() + 15);
}

TEST(TensorViewTest, SelectDropsTheFirstDimension) {
  Tensor t = Iota(3, 5);
  const TensorView row = t.view().Select(2);
  EXPECT_EQ(row.rank(), 1);
  EXPECT_EQ(row.dim(0), 5);
  EXPECT_EQ(At(row, {4}), 14);
  const TensorView element = row.Select(3);
  EXPECT_EQ(element.rank(), 0);
  EXPECT_EQ(element.numel(), 1);
  EXPECT_EQ(*element.data<float>(), 13);
  // A column of the matrix, selected through the transpose, keeps its stride of 5.
  const TensorView transposed(t.data<float>(), DType::kF32, {5, 3}, {1, 5});
  const TensorView column = transposed.Select(1);
  EXPECT_EQ(column.stride(0), 5);
  EXPECT_EQ(At(column, {2}), 11);
  EXPECT_FALSE(column.is_contiguous());
}

TEST(TensorViewTest, ReshapeKeepsDataAndRecomputesStrides) {
  Tensor t = Iota(4, 6);
  const TensorView flat = t.view().Reshape({24});
  EXPECT_EQ(flat.raw(), t.data<float>());
  EXPECT_EQ(At(flat, {17}), 17);
  const TensorView cube = t.view().Reshape({2, 3, 4});
  EXPECT_EQ(cube.stride(0), 12);
  EXPECT_EQ(At(cube, {1, 2, 3}), 23);
  // Rows of a contiguous tensor are contiguous, so they reshape too.
  const TensorView rows = t.view().Slice(1, 3).Reshape({3, 4});
  EXPECT_EQ(At(rows, {0, 0}), 6);
  EXPECT_EQ(rows.DebugString(), "(3, 4) f32");
}

TEST(TensorViewTest, ZeroElementViews) {
  Tensor t = Iota(8, 4);
  const TensorView none = t.view().Slice(3, 3);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_FALSE(none.empty());  // Absent and zero-sized are different things.
  EXPECT_TRUE(none.is_contiguous());
  EXPECT_EQ(none.Reshape({0}).numel(), 0);
  EXPECT_EQ(none.Reshape({4, 0}).dim(0), 4);
  // Zero rows of a strided view hold nothing out of place either.
  const TensorView transposed(t.data<float>(), DType::kF32, {4, 8}, {1, 4});
  EXPECT_TRUE(transposed.Slice(2, 2).is_contiguous());
  EXPECT_EQ(t.view().Slice(8, 8).numel(), 0);  // Slicing at the end is allowed.
}

TEST(TensorTest, ZerosAllocatesAlignedZeroedStorage) {
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2, DType::kI32, DType::kI64}) {
    // Dirty a same-sized block first so that fresh pages are less likely to hide a missing fill.
    { Tensor dirty = Tensor::Empty(dtype, {3, 7, 5}); }
    Tensor t = Tensor::Zeros(dtype, {3, 7, 5});
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.rank(), 3);
    EXPECT_EQ(t.dim(1), 7);
    EXPECT_EQ(t.numel(), 105);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<void>()) % 64, 0u);
    const auto* bytes = t.data<unsigned char>();
    const size_t size = 105 * DTypeSize(dtype);
    EXPECT_EQ(std::count(bytes, bytes + size, 0), static_cast<std::ptrdiff_t>(size));
  }
}

TEST(TensorTest, ZeroElementTensorIsPresent) {
  Tensor t = Tensor::Zeros(DType::kBF16, {0, 16});
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.view().is_contiguous());
  EXPECT_TRUE(CheckTensor(t, "t", DType::kBF16, {0, 16}).ok());
}

TEST(TensorTest, MoveTransfersOwnershipAndEmptiesTheSource) {
  Tensor a = Iota(2, 3);
  float* data = a.data<float>();
  Tensor b = std::move(a);
  EXPECT_TRUE(a.empty());   // NOLINT(bugprone-use-after-move): the moved-from state is the test.
  EXPECT_EQ(a.numel(), 1);  // NOLINT: a rank-0 default view.
  EXPECT_EQ(b.data<float>(), data);
  EXPECT_EQ(b.view().DebugString(), "(2, 3) f32");
  Tensor c;
  c = std::move(b);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(At(c, {1, 2}), 5);
}

TEST(CheckTensorTest, AcceptsMatchesAndWildcards) {
  Tensor t = Tensor::Zeros(DType::kF32, {4, 512});
  EXPECT_TRUE(CheckTensor(t, "x", DType::kF32, {4, 512}).ok());
  EXPECT_TRUE(CheckTensor(t, "x", DType::kF32, {-1, 512}).ok());
  EXPECT_TRUE(CheckTensor(t, "x", DType::kF32, {-1, -1}).ok());
}

TEST(CheckTensorTest, NamesTheTensorAndBothShapes) {
  Tensor t = Tensor::Zeros(DType::kF32, {4, 256});
  const absl::Status extent = CheckTensor(t, "x", DType::kF32, {-1, 512});
  EXPECT_EQ(extent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(extent.message(), "x: expected (-1, 512) f32, got (4, 256) f32");
  EXPECT_EQ(CheckTensor(t, "w", DType::kBF16, {4, 256}).message(),
            "w: expected (4, 256) bf16, got (4, 256) f32");
  EXPECT_EQ(CheckTensor(t, "w", DType::kF32, {4, 256, 1}).message(),
            "w: expected (4, 256, 1) f32, got (4, 256) f32");
  EXPECT_EQ(CheckTensor(TensorView(), "bias", DType::kF32, {8}).message(),
            "bias: expected (8) f32, got no tensor");
}

// Views and tensors carry their device; every view made from one keeps it.
TEST(TensorDeviceTest, ViewsKeepTheirDevice) {
  Tensor t = Iota(4, 6);
  EXPECT_EQ(t.device(), Device::Cpu());
  EXPECT_EQ(t.view().device(), Device::Cpu());
  int64_t fake_device_memory[24];
  const TensorView gpu(fake_device_memory, DType::kF32, {4, 6}, Device::Cuda(1));
  EXPECT_EQ(gpu.device(), Device::Cuda(1));
  EXPECT_EQ(gpu.Slice(1, 3).device(), Device::Cuda(1));
  EXPECT_EQ(gpu.Select(2).device(), Device::Cuda(1));
  EXPECT_EQ(gpu.Reshape({24}).device(), Device::Cuda(1));
  const TensorView strided(fake_device_memory, DType::kF32, {6, 4}, {1, 6}, Device::Cuda(1));
  EXPECT_EQ(strided.device(), Device::Cuda(1));
  EXPECT_EQ(gpu.DebugString(), "(4, 6) f32 on cuda:1");
  EXPECT_EQ(t.view().DebugString(), "(4, 6) f32");
  // raw() is the address on the device, for kernels and copies; it never reads it.
  EXPECT_EQ(gpu.raw(), fake_device_memory);
  EXPECT_EQ(Device::Cpu().DebugString(), "cpu");
  EXPECT_EQ(Device::Cuda(3).DebugString(), "cuda:3");
  EXPECT_TRUE(Device::Cpu().is_cpu());
  EXPECT_FALSE(Device::Cuda(0).is_cpu());
  EXPECT_NE(Device::Cuda(0), Device::Cuda(1));
}

// The host cannot read another device's memory through a view: data<T>() stops the process,
// naming the device, instead of reading garbage.
TEST(TensorDeviceDeathTest, HostAccessToDeviceMemoryIsRefused) {
  float fake_device_memory[8];
  const TensorView gpu(fake_device_memory, DType::kF32, {8}, Device::Cuda(0));
  EXPECT_DEATH(gpu.data<float>(), "host access to a \\(8\\) f32 on cuda:0 view");
  EXPECT_DEATH(gpu.Slice(0, 2).data<float>(), "cuda:0");
}

// Allocate takes memory from the allocator it is given, and gives it back to that allocator.
TEST(TensorAllocateTest, UsesAndReturnsItsAllocatorsMemory) {
  class CountingAllocator final : public Allocator {
   public:
    Device device() const override { return Device::Cpu(); }
    absl::StatusOr<void*> Allocate(size_t bytes) override {
      if (bytes > limit) return absl::ResourceExhaustedError("over the limit");
      ++live;
      return CpuAllocator().Allocate(bytes);
    }
    void Deallocate(void* data) override {
      --live;
      CpuAllocator().Deallocate(data);
    }
    size_t limit = 1 << 20;
    int live = 0;
  } counting;
  {
    absl::StatusOr<Tensor> t = Tensor::Allocate(counting, DType::kBF16, {3, 5});
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(counting.live, 1);
    EXPECT_EQ(t->dtype(), DType::kBF16);
    EXPECT_EQ(t->numel(), 15);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->view().raw()) % 64, 0u);
    Tensor moved = *std::move(t);
    EXPECT_EQ(counting.live, 1);
  }
  EXPECT_EQ(counting.live, 0);
  // No room: a Status naming the request, nothing allocated.
  const absl::StatusOr<Tensor> big = Tensor::Allocate(counting, DType::kF32, {1 << 20});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(counting.live, 0);
  // An empty tensor still has memory, so it is not empty().
  absl::StatusOr<Tensor> none = Tensor::Allocate(counting, DType::kF32, {0, 4});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->empty());
  // Sizes that overflow are refused, not wrapped.
  EXPECT_EQ(Tensor::Allocate(CpuAllocator(), DType::kF32, {int64_t{1} << 40, int64_t{1} << 40})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(TensorViewDeathTest, BrokenInvariantsStopTheProcess) {
  Tensor t = Iota(4, 6);
  const TensorView transposed(t.data<float>(), DType::kF32, {6, 4}, {1, 6});
  EXPECT_DEATH(transposed.Reshape({24}), "Reshape of a contiguous view");
  EXPECT_DEATH(t.view().Reshape({5, 5}), "Reshape keeps numel");
  EXPECT_DEATH(t.view().Slice(2, 5), "Slice: 0 <= begin <= end <= dim");
  EXPECT_DEATH(t.view().Slice(3, 2), "Slice: 0 <= begin <= end <= dim");
  EXPECT_DEATH(t.view().Select(4), "Select: 0 <= i < dim");
  EXPECT_DEATH(t.view().Select(0).Select(0).Select(0), "Select needs rank >= 1");
  EXPECT_DEATH(TensorView(t.data<float>(), DType::kF32, {1, 1, 1, 1, 24}), "rank <= kMaxRank");
  EXPECT_DEATH(Tensor::Empty(DType::kF32, {2, -1}), "every extent >= 0");
}

}  // namespace
}  // namespace moetrain
