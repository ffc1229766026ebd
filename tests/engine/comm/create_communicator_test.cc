#include "engine/comm/create_communicator.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "engine/comm/nccl_communicator.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::RunRanks;
using testutil::TempDir;

// Runs body(comm) on both ranks of a CPU world of two that CreateCommunicator makes from a gloo
// group over a fresh store.
void RunCpuWorldOfTwo(const std::function<void(Communicator& comm)>& body) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  RunRanks(2, [&](int rank) {
    CommOptions options;
    options.group = comm_test::Gloo(*store, rank, 2).group;
    auto comm = CreateCommunicator(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    body(**comm);
  });
}

TEST(CreateCommunicatorTest, WorldOfOneIsLocalWithoutAStore) {
  auto comm = CreateCommunicator({});
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "local");
}

TEST(CreateCommunicatorTest, CpuWorldOfTwoIsGloo) {
  RunCpuWorldOfTwo([](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "gloo");
    ASSERT_OK(comm.Barrier());
  });
}

TEST(CreateCommunicatorTest, GpuBuffersGoToNccl) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  CommOptions options;
  options.cuda = true;
  options.group.store = *store;
  options.group.timeout = absl::Seconds(60);
  auto comm = CreateCommunicator(options);
  if (!NcclCommunicatorBuilt()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented);
  } else if (!comm.ok()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  } else {
    EXPECT_EQ((*comm)->backend(), "nccl");
  }
}

// A GPU rank alone (`moetrain run`, a one-rank job) has no rendezvous store: NCCL makes its id
// locally. Here that fails only for want of NCCL or of a GPU, each said as such.
TEST(CreateCommunicatorTest, GpuWorldOfOneNeedsNoStore) {
  CommOptions options;
  options.cuda = true;
  options.group.timeout = absl::Seconds(60);
  auto comm = CreateCommunicator(options);
  if (!NcclCommunicatorBuilt()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented) << comm.status();
  } else if (!comm.ok()) {
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
    EXPECT_NE(comm.status().message().find("no usable CUDA device"), std::string::npos)
        << comm.status();
  } else {
    EXPECT_EQ((*comm)->backend(), "nccl");
    EXPECT_FALSE((*comm)->orders_after_device_work());  // no order_after_stream given
  }
}

TEST(CreateCommunicatorTest, GpuWorldOfTwoNeedsAStore) {
  CommOptions options;
  options.cuda = true;
  options.group.size = 2;
  const absl::Status status = CreateCommunicator(options).status();
  if (!NcclCommunicatorBuilt()) GTEST_SKIP() << "built without NCCL";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("store"), std::string::npos) << status;
}

// Only a communicator that orders its collectives after the device's queued work says so; the
// callers synchronise their ExecContext before the others'.
TEST(CreateCommunicatorTest, HostCommunicatorsDoNotOrderAfterDeviceWork) {
  auto local = CreateCommunicator({});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE((*local)->orders_after_device_work());
  RunCpuWorldOfTwo([](Communicator& comm) {
    EXPECT_FALSE(comm.orders_after_device_work());
    auto sub = comm.Subgroup({0, 1});
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_FALSE((*sub)->orders_after_device_work());
  });
}

TEST(CreateCommunicatorTest, BackendThatCannotServeTheRequestIsRejected) {
  CommOptions local_of_two;
  local_of_two.backend = CommBackend::kLocal;
  local_of_two.group.size = 2;
  EXPECT_EQ(CreateCommunicator(local_of_two).status().code(), absl::StatusCode::kInvalidArgument);
  CommOptions gloo_on_gpu;
  gloo_on_gpu.backend = CommBackend::kGloo;
  gloo_on_gpu.cuda = true;
  EXPECT_EQ(CreateCommunicator(gloo_on_gpu).status().code(), absl::StatusCode::kInvalidArgument);
  CommOptions nccl_on_host;
  nccl_on_host.backend = CommBackend::kNccl;
  EXPECT_EQ(CreateCommunicator(nccl_on_host).status().code(), absl::StatusCode::kInvalidArgument);
  CommOptions gloo_without_store;
  gloo_without_store.backend = CommBackend::kGloo;
  EXPECT_EQ(CreateCommunicator(gloo_without_store).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moetrain
