// The NCCL communicator where this machine allows: the rendezvous checks run in every build with
// NCCL; the collectives need a GPU (a world of one on device memory) and are skipped without one.
#include "engine/comm/nccl_communicator.h"

#include <cstdint>
#include <vector>

#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifdef MOETRAIN_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using testutil::TempDir;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = FileKeyValueStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // Rank `rank` of `size`, meeting in this test's store.
  NcclOptions Nccl(int rank, int size) {
    NcclOptions options;
    options.group.store = store_;
    options.group.rank = rank;
    options.group.size = size;
    options.group.timeout = absl::Milliseconds(300);
    return options;
  }

  TempDir dir_;
  std::shared_ptr<FileKeyValueStore> store_;
};

TEST_F(NcclCommunicatorTest, WithoutNcclTheFactorySaysSo) {
  if (NcclCommunicatorBuilt()) GTEST_SKIP() << "this build has NCCL";
  EXPECT_EQ(CreateNcclCommunicator(Nccl(0, 1)).status().code(), absl::StatusCode::kUnimplemented);
}

TEST_F(NcclCommunicatorTest, RankWaitingForAnIdNobodyPublishesTimesOut) {
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "built without NCCL";
  const absl::Status status = CreateNcclCommunicator(Nccl(1, 2)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("'world/nccl_unique_id'"));
}

TEST_F(NcclCommunicatorTest, WorldOfOneNeedsNoStoreButTwoDo) {
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "built without NCCL";
  NcclOptions alone = Nccl(0, 1);
  alone.group.store = nullptr;
  // The fixture's 300 ms is for the timeouts above; a real NCCL init on a GPU may take longer
  // (once it did not finish in 300 ms on an H200).
  alone.group.timeout = absl::Seconds(30);
  const absl::Status status = CreateNcclCommunicator(alone).status();
  // Without a GPU it gets as far as looking for one; with one it works.
  EXPECT_TRUE(status.ok() || absl::IsFailedPrecondition(status)) << status;
  NcclOptions pair = Nccl(0, 2);
  pair.group.store = nullptr;
  EXPECT_EQ(CreateNcclCommunicator(pair).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclCommunicatorTest, MalformedIdIsDataLoss) {
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "built without NCCL";
  ASSERT_OK(store_->Set("world/nccl_unique_id", "not hex"));
  EXPECT_EQ(CreateNcclCommunicator(Nccl(1, 2)).status().code(), absl::StatusCode::kDataLoss);
}

// A world of one on the GPU: every collective is the identity or a copy, but each goes through
// NCCL (the self copy of all-to-all-v through the stream).
TEST_F(NcclCommunicatorTest, WorldOfOneOnTheGpu) {
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "built without NCCL";
  NcclOptions options = Nccl(0, 1);
  options.group.timeout = absl::Seconds(60);
  auto comm = CreateNcclCommunicator(options);
  if (absl::IsFailedPrecondition(comm.status())) GTEST_SKIP() << comm.status();
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "nccl");
#ifdef MOETRAIN_TEST_CUDA
  const std::vector<float> host = {1.0f, -2.0f, 3.5f, 0.25f};
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 4 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 4 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(a, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_OK((*comm)->AllReduceSum(a, 4, DType::kF32));
  ASSERT_OK((*comm)->AllToAllV(
      {.send = a, .send_counts = {4}, .recv = b, .recv_counts = {4}, .dtype = DType::kF32}));
  std::vector<float> back(4);
  ASSERT_EQ(cudaMemcpy(back.data(), b, 4 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  ASSERT_OK((*comm)->AllGather(a, b, 4, DType::kF32));
  ASSERT_OK((*comm)->Broadcast(a, 4, DType::kF32, 0));
  ASSERT_OK((*comm)->Barrier());
  auto group = (*comm)->Subgroup({0});
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_OK((*group)->AllReduceSum(a, 4, DType::kF32));
  ASSERT_EQ(cudaMemcpy(back.data(), a, 4 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(a);
  cudaFree(b);
#endif
}

}  // namespace
}  // namespace moetrain
