#include "engine/core/workspace.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

// A slot is reused while it is large enough, so a steady step allocates nothing, and grows when
// a request needs more; each request gets the dtype and shape it asked for.
TEST(WorkspaceTest, ReusesASlotUntilItMustGrow) {
  Workspace workspace(2, CpuAllocator());
  absl::StatusOr<TensorView> a = workspace.Get(0, DType::kF32, {4, 8});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->DebugString(), "(4, 8) f32");
  EXPECT_EQ(a->device(), Device::Cpu());
  EXPECT_TRUE(a->is_contiguous());
  // Smaller, in another dtype: the same memory.
  absl::StatusOr<TensorView> b = workspace.Get(0, DType::kBF16, {3, 10});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->raw(), a->raw());
  EXPECT_EQ(b->DebugString(), "(3, 10) bf16");
  // Another slot: other memory.
  absl::StatusOr<TensorView> c = workspace.Get(1, DType::kI32, {32});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->raw(), a->raw());
  // Larger than slot 0 holds: grown; the whole view is writable.
  absl::StatusOr<TensorView> d = workspace.Get(0, DType::kF32, {64, 64});
  ASSERT_TRUE(d.ok());
  for (int64_t i = 0; i < d->numel(); ++i) d->data<float>()[i] = 1.0f;
}

TEST(WorkspaceTest, ASlotOutsideTheWorkspaceIsAnError) {
  Workspace workspace(2, CpuAllocator());
  EXPECT_EQ(workspace.Get(2, DType::kF32, {1}).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(workspace.Get(-1, DType::kF32, {1}).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace moetrain
