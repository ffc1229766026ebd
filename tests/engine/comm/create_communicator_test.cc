#include "engine/comm/create_communicator.h"

#include <memory>
#include <vector>

#include "comm_test_util.h"
#include "engine/comm/nccl_communicator.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using comm_test::RunRanks;
using comm_test::ScratchDir;

TEST(CreateCommunicatorTest, WorldOfOneIsLocalWithoutAStore) {
  auto comm = CreateCommunicator({});
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "local");
}

TEST(CreateCommunicatorTest, CpuWorldOfTwoIsGloo) {
  ScratchDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  RunRanks(2, [&](int rank) {
    CommOptions options;
    options.group = comm_test::Gloo(*store, rank, 2).group;
    auto comm = CreateCommunicator(options);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ((*comm)->backend(), "gloo");
    MOETRAIN_ASSERT_OK((*comm)->Barrier());
  });
}

TEST(CreateCommunicatorTest, GpuBuffersGoToNccl) {
  ScratchDir dir;
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
