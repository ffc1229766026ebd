#include "engine/comm/local_communicator.h"

#include <cstdint>
#include <vector>

#include "comm_test_util.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

TEST(LocalCommunicatorTest, IsAWorldOfOne) {
  LocalCommunicator comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend(), "local");
}

TEST(LocalCommunicatorTest, AllToAllVCopiesTheOwnChunk) {
  LocalCommunicator comm;
  const std::vector<int64_t> send = {5, -6, 7};
  std::vector<int64_t> recv(3, 0);
  ASSERT_OK(comm.AllToAllV({.send = send.data(),
                            .send_counts = {3},
                            .recv = recv.data(),
                            .recv_counts = {3},
                            .dtype = DType::kI64}));
  EXPECT_EQ(recv, send);
  ASSERT_OK(comm.AllToAllV({.send_counts = {0}, .recv_counts = {0}}));
}

TEST(LocalCommunicatorTest, ReduceAndBroadcastLeaveDataAsIs) {
  LocalCommunicator comm;
  std::vector<float> data = {1.5f, -2.0f};
  ASSERT_OK(comm.AllReduceSum(data.data(), 2, DType::kF32));
  ASSERT_OK(comm.Broadcast(data.data(), 2, DType::kF32, 0));
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
  ASSERT_OK(comm.Barrier());
}

TEST(LocalCommunicatorTest, ReduceScatterAndAllGatherVOfOneBlockLeaveItAsIs) {
  LocalCommunicator comm;
  std::vector<float> data = {1.5f, -2.0f, 4.0f};
  const std::vector<int64_t> counts = {3};
  ASSERT_OK(comm.ReduceScatterSum(data.data(), counts, DType::kF32));
  ASSERT_OK(comm.AllGatherV(data.data(), counts, DType::kF32));
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 4.0f}));
  const std::vector<int64_t> two = {1, 2};
  EXPECT_EQ(comm.ReduceScatterSum(data.data(), two, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LocalCommunicatorTest, AllGatherCopies) {
  LocalCommunicator comm;
  const std::vector<int32_t> send = {1, 2, 3, 4};
  std::vector<int32_t> recv(4, 0);
  ASSERT_OK(comm.AllGather(send.data(), recv.data(), 4, DType::kI32));
  EXPECT_EQ(recv, send);
}

TEST(LocalCommunicatorTest, AsyncRequestsAreCompleteAtOnce) {
  LocalCommunicator comm;
  auto request = comm.StartBarrier();
  ASSERT_TRUE(request.ok());
  ASSERT_OK((*request)->Wait());
  ASSERT_OK((*request)->Wait());
}

TEST(LocalCommunicatorTest, SubgroupOfRankZeroOnly) {
  LocalCommunicator comm;
  auto group = comm.Subgroup({0});
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->backend(), "local");
  EXPECT_EQ(comm.Subgroup({1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.Subgroup({0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalCommunicatorTest, ArgumentErrorsNameTheValue) {
  LocalCommunicator comm;
  float x = 0;
  const absl::Status root = comm.Broadcast(&x, 1, DType::kF32, 1);
  EXPECT_EQ(root.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root.message(), "local broadcast (rank 0 of 1): root = 1 is outside [0, size = 1)");
  const absl::Status counts = comm.AllToAllV({.send_counts = {1, 2}, .recv_counts = {1}});
  EXPECT_EQ(counts.message(),
            "local all_to_all_v (rank 0 of 1): send_counts has 2 entries, expected size = 1");
  const absl::Status negative = comm.AllToAllV({.send_counts = {-1}, .recv_counts = {-1}});
  EXPECT_EQ(negative.message(),
            "local all_to_all_v (rank 0 of 1): send_counts[0] = -1 is negative");
  const absl::Status own =
      comm.AllToAllV({.send = &x, .send_counts = {1}, .recv = &x + 1, .recv_counts = {0}});
  EXPECT_EQ(own.code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> buffer(4);
  const absl::Status overlap = comm.AllToAllV(
      {.send = buffer.data(), .send_counts = {2}, .recv = buffer.data() + 1, .recv_counts = {2}});
  EXPECT_EQ(overlap.message(), "local all_to_all_v (rank 0 of 1): send and recv overlap");
  EXPECT_EQ(comm.AllReduceSum(&x, 1, DType::kF8E4M3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.AllReduceSum(&x, -1, DType::kF32).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moetrain
