// Helpers of the tests that compare a CUDA op with its CPU twin. They run where a GPU is and skip,
// with the one-line reason, where none is (no driver, no device, or a build without CUDA):
//
//   MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);      // ExecContext gpu on cuda:0
//   Tensor x_gpu = test_util::ToDevice(gpu, x);
//   ... run the op on gpu and on ExecContext::Cpu() ...
//   Tensor y = test_util::ToHost(gpu, y_gpu);
#ifndef MOETRAIN_TESTS_ENGINE_CUDA_TEST_UTIL_H_
#define MOETRAIN_TESTS_ENGINE_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/device_query.h"
#include "engine/backend/exec_context.h"
#include "engine/core/tensor.h"
#include "engine/ops/elementwise/elementwise.h"
#include "gtest/gtest.h"

namespace moetrain::test_util {

// A device copy of host tensor `host` (any dtype), on ctx's device.
inline Tensor ToDevice(const ExecContext& ctx, const TensorView& host) {
  absl::StatusOr<Tensor> t = Tensor::Allocate(ctx.allocator(), host.dtype(), host.shape());
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return Tensor();
  const absl::Status copied = ops::CopyTensor(ctx, host, *t);
  EXPECT_TRUE(copied.ok()) << copied;
  return *std::move(t);
}

// A host copy of `device` (dense, on ctx's device); waits for the ops that wrote it.
inline Tensor ToHost(const ExecContext& ctx, const TensorView& device) {
  Tensor t = Tensor::Empty(device.dtype(), device.shape());
  const absl::Status copied = ops::CopyTensor(ctx, device, t);
  EXPECT_TRUE(copied.ok()) << copied;
  return t;
}

// Whether two host tensors hold the same bytes (bit-identical results).
inline bool SameBytes(const TensorView& a, const TensorView& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.numel() * DTypeSize(a.dtype())) == 0;
}

}  // namespace moetrain::test_util

// Declares `const ExecContext name` on cuda:0, or skips the test naming why there is no GPU. A GPU
// that is there but whose context cannot be opened fails the test: a broken backend must not
// pass as a machine without a GPU.
#define MOETRAIN_GPU_CONTEXT_OR_SKIP(name)                                                     \
  const ::moetrain::DeviceReport name##_report_ = ::moetrain::QueryDevices();                  \
  if (name##_report_.gpus.empty()) GTEST_SKIP() << "no GPU: " << name##_report_.no_gpu_reason; \
  absl::StatusOr<::moetrain::ExecContext> name##_or_ =                                         \
      ::moetrain::ExecContext::ForDevice(::moetrain::Device::Cuda(0));                         \
  ASSERT_TRUE(name##_or_.ok()) << "the GPU is there but its context is not: "                  \
                               << name##_or_.status();                                         \
  const ::moetrain::ExecContext name = *name##_or_

// `std::mt19937 name` seeded afresh on every run, the seed in the trace of every failure below
// it (so a failing input can be replayed).
#define MOETRAIN_FRESH_RNG(name)                                 \
  const uint32_t name##_seed_ = std::random_device{}();          \
  SCOPED_TRACE(::testing::Message() << "seed " << name##_seed_); \
  std::mt19937 name(name##_seed_)

#endif  // MOETRAIN_TESTS_ENGINE_CUDA_TEST_UTIL_H_
