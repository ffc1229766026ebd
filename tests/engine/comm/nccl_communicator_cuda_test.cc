// The NCCL communicator on a GPU, as the trainer uses it: a world of one (no store), collectives on
// the device's communication stream, ordered after its compute stream by events. Skips, naming
// why, where there is no GPU or no NCCL.
//
// A world of one makes every collective the identity (or a copy), so these tests check what one
// GPU can: that each collective runs through NCCL on device buffers and on host buffers (staged),
// that results land where they should, that several host-buffer collectives in flight at once
// keep their own results, and that a collective reads what ops queued before it wrote with no
// host synchronisation in between. Reductions over several ranks are covered by the Gloo tests of
// the same trainer code; NCCL refuses two ranks on one GPU.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "engine/comm/create_communicator.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/core/tensor.h"
#include "engine/ops/elementwise/elementwise.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/tensor_test_util.h"

namespace moetrain {
namespace {

using test_util::ToDevice;
using test_util::ToHost;

// The world of one a GPU rank makes (rank_runner's WorldCommunicator): no store, the context's
// communication stream, ordered after its compute stream.
std::unique_ptr<Communicator> GpuWorld(const ExecContext& gpu) {
  CommOptions options;
  options.cuda = true;
  options.cuda_device = gpu.device().index;
  options.cuda_stream = gpu.runtime()->comm_stream_handle();
  options.order_after_stream = gpu.runtime()->compute_stream_handle();
  options.group.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<Communicator>> comm = CreateCommunicator(options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

#define MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm)                            \
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "this build has no NCCL"; \
  MOETRAIN_GPU_CONTEXT_OR_SKIP(gpu);                                      \
  std::unique_ptr<Communicator> comm = GpuWorld(gpu);                     \
  ASSERT_NE(comm, nullptr)

template <typename T>
Tensor HostTensor(DType dtype, const std::vector<T>& values) {
  Tensor t = Tensor::Empty(dtype, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

template <typename T>
std::vector<T> Values(const TensorView& host) {
  return std::vector<T>(host.data<T>(), host.data<T>() + host.numel());
}

TEST(NcclCommunicatorCudaTest, WorldOfOneWithoutAStoreOrdersAfterTheComputeStream) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_TRUE(comm->orders_after_device_work());
  auto group = comm->Subgroup({0});
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_TRUE((*group)->orders_after_device_work());
  ASSERT_OK((*group)->Barrier());
  ASSERT_OK(comm->Barrier());
}

TEST(NcclCommunicatorCudaTest, AllToAllVOnDeviceBuffers) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  std::vector<float> values(1000);
  std::iota(values.begin(), values.end(), -17.5f);
  Tensor send = ToDevice(gpu, HostTensor(DType::kF32, values));
  auto recv = Tensor::Allocate(gpu.allocator(), DType::kF32, {1000});
  ASSERT_TRUE(recv.ok()) << recv.status();
  ASSERT_OK(comm->AllToAllV({.send = send.view().raw(),
                             .send_counts = {1000},
                             .recv = recv->view().raw(),
                             .recv_counts = {1000},
                             .dtype = DType::kF32}));
  EXPECT_EQ(Values<float>(ToHost(gpu, *recv)), values);
  // Zero rows: nothing to exchange, and it still completes.
  ASSERT_OK(comm->AllToAllV({.send = send.view().raw(),
                             .send_counts = {0},
                             .recv = recv->view().raw(),
                             .recv_counts = {0},
                             .dtype = DType::kF32}));
}

TEST(NcclCommunicatorCudaTest, AllToAllVOnHostBuffers) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  std::vector<int32_t> send = {4, -8, 15, 16, 23, 42}, recv(6, 0);
  ASSERT_OK(comm->AllToAllV({.send = send.data(),
                             .send_counts = {6},
                             .recv = recv.data(),
                             .recv_counts = {6},
                             .dtype = DType::kI32}));
  EXPECT_EQ(recv, send);
}

TEST(NcclCommunicatorCudaTest, AllReduceSumOnDeviceBuffers) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  const std::vector<float> floats = {1.0f, -2.0f, 3.5f, 0.25f, 1e-30f};
  Tensor f = ToDevice(gpu, HostTensor(DType::kF32, floats));
  ASSERT_OK(comm->AllReduceSum(f.view().raw(), 5, DType::kF32));
  EXPECT_EQ(Values<float>(ToHost(gpu, f)), floats);
  const std::vector<int64_t> ints = {int64_t{1} << 40, -3, 0, 7};
  Tensor i = ToDevice(gpu, HostTensor(DType::kI64, ints));
  ASSERT_OK(comm->AllReduceSum(i.view().raw(), 4, DType::kI64));
  EXPECT_EQ(Values<int64_t>(ToHost(gpu, i)), ints);
}

TEST(NcclCommunicatorCudaTest, AllReduceSumOnHostBuffers) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  std::vector<float> floats = {1.0f, -2.0f, 3.5f};
  const std::vector<float> floats_before = floats;
  ASSERT_OK(comm->AllReduceSum(floats.data(), 3, DType::kF32));
  EXPECT_EQ(floats, floats_before);
  std::vector<int64_t> ints = {int64_t{1} << 40, -3, 0, 7};
  const std::vector<int64_t> ints_before = ints;
  ASSERT_OK(comm->AllReduceSum(ints.data(), 4, DType::kI64));
  EXPECT_EQ(ints, ints_before);
  // Larger than the first staging buffer (64 KiB): the staging grows.
  std::vector<int64_t> big(1 << 20);
  std::iota(big.begin(), big.end(), int64_t{-5000});
  const std::vector<int64_t> big_before = big;
  ASSERT_OK(comm->AllReduceSum(big.data(), static_cast<int64_t>(big.size()), DType::kI64));
  EXPECT_EQ(big, big_before);
}

// A world of one: the own block is the whole sum, in place, on device and host memory.
TEST(NcclCommunicatorCudaTest, ReduceScatterAndAllGatherVInPlace) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  const std::vector<float> floats = {1.0f, -2.0f, 3.5f, 0.25f, 1e-30f};
  const std::vector<int64_t> counts = {5};
  Tensor f = ToDevice(gpu, HostTensor(DType::kF32, floats));
  ASSERT_OK(comm->ReduceScatterSum(f.view().raw(), counts, DType::kF32));
  EXPECT_EQ(Values<float>(ToHost(gpu, f)), floats);
  ASSERT_OK(comm->AllGatherV(f.view().raw(), counts, DType::kF32));
  EXPECT_EQ(Values<float>(ToHost(gpu, f)), floats);
  std::vector<int64_t> ints = {int64_t{1} << 40, -3, 0};
  const std::vector<int64_t> ints_before = ints;
  const std::vector<int64_t> three = {3};
  ASSERT_OK(comm->ReduceScatterSum(ints.data(), three, DType::kI64));
  ASSERT_OK(comm->AllGatherV(ints.data(), three, DType::kI64));
  EXPECT_EQ(ints, ints_before);
}

TEST(NcclCommunicatorCudaTest, AllGatherOfHostIntegers) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  // What PlanDispatch, SumOverRanks (doubles as bits) and the checkpoint reports gather.
  const std::vector<int64_t> send = {3, 0, 9, int64_t{1} << 50, -1};
  std::vector<int64_t> recv(5, 77);
  ASSERT_OK(comm->AllGather(send.data(), recv.data(), 5, DType::kI64));
  EXPECT_EQ(recv, send);
  // Device to host and host to device.
  Tensor device_send = ToDevice(gpu, HostTensor(DType::kI64, send));
  std::vector<int64_t> host_recv(5, 0);
  ASSERT_OK(comm->AllGather(device_send.view().raw(), host_recv.data(), 5, DType::kI64));
  EXPECT_EQ(host_recv, send);
  auto device_recv = Tensor::Allocate(gpu.allocator(), DType::kI64, {5});
  ASSERT_TRUE(device_recv.ok());
  ASSERT_OK(comm->AllGather(send.data(), device_recv->view().raw(), 5, DType::kI64));
  EXPECT_EQ(Values<int64_t>(ToHost(gpu, *device_recv)), send);
}

TEST(NcclCommunicatorCudaTest, BroadcastOnHostAndDevice) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  std::vector<int64_t> steps = {100, 200, 300};
  ASSERT_OK(comm->Broadcast(steps.data(), 3, DType::kI64, 0));
  EXPECT_EQ(steps, (std::vector<int64_t>{100, 200, 300}));
  const std::vector<float> values = {0.5f, -1.5f};
  Tensor device = ToDevice(gpu, HostTensor(DType::kF32, values));
  ASSERT_OK(comm->Broadcast(device.view().raw(), 2, DType::kF32, 0));
  EXPECT_EQ(Values<float>(ToHost(gpu, device)), values);
}

TEST(NcclCommunicatorCudaTest, HostCollectivesInFlightTogetherKeepTheirResults) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  std::vector<int64_t> a = {1, 2, 3}, a_out(3, 0);
  std::vector<float> b = {4.0f, 5.0f};
  std::vector<int64_t> c(20000);  // bigger than a, so maybe another staging buffer
  std::iota(c.begin(), c.end(), int64_t{9});
  const std::vector<int64_t> c_before = c;
  auto ra = comm->StartAllGather(a.data(), a_out.data(), 3, DType::kI64);
  ASSERT_TRUE(ra.ok()) << ra.status();
  auto rb = comm->StartAllReduceSum(b.data(), 2, DType::kF32);
  ASSERT_TRUE(rb.ok()) << rb.status();
  auto rc = comm->StartBroadcast(c.data(), static_cast<int64_t>(c.size()), DType::kI64, 0);
  ASSERT_TRUE(rc.ok()) << rc.status();
  // Waited for in another order than started.
  ASSERT_OK((*rc)->Wait());
  ASSERT_OK((*rb)->Wait());
  ASSERT_OK((*ra)->Wait());
  ASSERT_OK((*ra)->Wait());  // a second Wait returns the same
  EXPECT_EQ(a_out, a);
  EXPECT_EQ(b, (std::vector<float>{4.0f, 5.0f}));
  EXPECT_EQ(c, c_before);
  // A request dropped without Wait is waited for when destroyed; the staging is reused after.
  {
    std::vector<int64_t> d = {6, 7};
    auto rd = comm->StartAllReduceSum(d.data(), 2, DType::kI64);
    ASSERT_TRUE(rd.ok()) << rd.status();
  }
  for (int round = 0; round < 50; ++round) {
    std::vector<int64_t> e = {round, -round};
    ASSERT_OK(comm->AllReduceSum(e.data(), 2, DType::kI64));
    ASSERT_EQ(e, (std::vector<int64_t>{round, -round}));
  }
}

// The collective starts right after ops were queued on the compute stream, with no host
// synchronisation: it must read what they wrote. Forty doublings of a 32 MiB tensor keep the GPU
// busy for far longer than the host takes to start the collective, so a collective that did not
// wait would read 1, 2, 4 ... instead of 2^40 (powers of two: exact in f32).
TEST(NcclCommunicatorCudaTest, CollectiveReadsWhatQueuedOpsWroteWithoutAHostSync) {
  MOETRAIN_NCCL_WORLD_OR_SKIP(gpu, comm);
  const int64_t n = int64_t{8} << 20;
  constexpr int kDoublings = 40;
  const float expected = static_cast<float>(int64_t{1} << kDoublings);
  auto x = Tensor::Allocate(gpu.allocator(), DType::kF32, {1, n});
  auto y = Tensor::Allocate(gpu.allocator(), DType::kF32, {1, n});
  ASSERT_TRUE(x.ok() && y.ok());
  for (int round = 0; round < 3; ++round) {
    ASSERT_OK(gpu.Synchronize());
    ASSERT_OK(ops::Fill(gpu, *x, 1.0f));
    for (int i = 0; i < kDoublings; ++i) ASSERT_OK(ops::Add(gpu, *x, *x, *x));
    // All-to-all-v (the dispatch's collective) into y, and an in-place all-reduce of x (the
    // gradient buckets').
    auto exchanged = comm->StartAllToAllV({.send = x->view().raw(),
                                           .send_counts = {n},
                                           .recv = y->view().raw(),
                                           .recv_counts = {n},
                                           .dtype = DType::kF32});
    ASSERT_TRUE(exchanged.ok()) << exchanged.status();
    ASSERT_OK((*exchanged)->Wait());
    // After Wait, ops queued on the compute stream see the collective's output.
    ASSERT_OK(ops::Add(gpu, *y, *y, *y));
    const std::vector<float> got = Values<float>(ToHost(gpu, *y));
    int64_t wrong = 0;
    for (float v : got) wrong += v != 2 * expected;
    EXPECT_EQ(wrong, 0) << "round " << round << ": e.g. " << got.front() << " and " << got.back()
                        << " instead of " << 2 * expected;

    ASSERT_OK(ops::Fill(gpu, *x, 1.0f));
    for (int i = 0; i < kDoublings; ++i) ASSERT_OK(ops::Add(gpu, *x, *x, *x));
    ASSERT_OK(comm->AllReduceSum(x->view().raw(), n, DType::kF32));
    const std::vector<float> reduced = Values<float>(ToHost(gpu, *x));
    wrong = 0;
    for (float v : reduced) wrong += v != expected;
    EXPECT_EQ(wrong, 0) << "round " << round;
  }
}

}  // namespace
}  // namespace moetrain
