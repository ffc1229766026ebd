// Registrations on a real store and coordinator: one client may have only so many registered
// workers that have not heartbeated yet; a worker that never heartbeated is forgotten soon after
// it is lost, one that did stays listed for forget_lost_after (its heartbeat is kept in the store
// across a coordinator restart); and ListWorkers pages.
#include <set>
#include <string>
#include <vector>

#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Short timeouts: a silent worker is lost within 300 ms.
FleetOptions ShortTimeouts(FleetOptions options) {
  options.heartbeat_interval = absl::Milliseconds(50);
  options.heartbeat_timeout = absl::Milliseconds(300);
  options.reconcile_grace = absl::Milliseconds(300);
  return options;
}

TEST_F(FleetTest, RegistrationsThatNeverHeartbeatAreCappedPerClient) {
  StartFleet();
  constexpr char kClient[] = "ipv4:10.0.0.7";
  std::vector<std::string> ids;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<v1::RegisterWorkerResponse> registered =
        fleet_->Register(CpuWorker(absl::StrCat("burst-", i)), kClient);
    ASSERT_TRUE(registered.ok()) << i << ": " << registered.status();
    ids.push_back(registered->worker_id());
  }
  absl::StatusOr<v1::RegisterWorkerResponse> refused =
      fleet_->Register(CpuWorker("burst-16"), kClient);
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("client ipv4:10.0.0.7 has registered 16 workers"),
                    HasSubstr("max_unheartbeated_registrations_per_client")));
  EXPECT_EQ(AllWorkers().size(), 16u) << "a refused registration leaves no worker";
  // Another client, and an in-process caller, are not this client.
  EXPECT_OK(fleet_->Register(CpuWorker("other"), "ipv4:10.0.0.8").status());
  EXPECT_OK(fleet_->Register(CpuWorker("in-process")).status());
  // A worker that heartbeats is one that works: the client may register one more.
  ASSERT_OK(Heartbeat(ids[0]).status());
  EXPECT_OK(fleet_->Register(CpuWorker("after-a-heartbeat"), kClient).status());
  EXPECT_TRUE(absl::IsResourceExhausted(fleet_->Register(CpuWorker("again"), kClient).status()));
}

// A registration that never heartbeats is forgotten a heartbeat timeout after it is lost; a
// worker that heartbeated stays listed (LOST) for forget_lost_after, here 24 h.
TEST_F(FleetTest, AWorkerThatNeverHeartbeatedIsForgottenSoonAfterItIsLost) {
  StartFleet(ShortTimeouts(DefaultOptions()));
  const std::string worked = Register("worked");
  ASSERT_OK(Heartbeat(worked).status());
  ASSERT_TRUE(WaitUntil([&] { return WorkerStateOf(worked) == v1::WORKER_STATE_LOST; }));
  // Registered after `worked` was lost: forgotten once it has been lost for 300 ms, by when
  // `worked` has been lost longer.
  const std::string silent = Register("silent");
  EXPECT_TRUE(WaitUntil([&] { return InfoOf(silent).id().empty(); }))
      << "a worker that never heartbeated is still listed";
  EXPECT_EQ(WorkerStateOf(worked), v1::WORKER_STATE_LOST);
}

// Whether a worker heartbeated is in the store: after a coordinator restart that nobody comes
// back from, the worker that had heartbeated stays listed and the one that had not is forgotten.
TEST_F(FleetTest, AWorkersHeartbeatIsRememberedAcrossARestart) {
  StartFleet(ShortTimeouts(DefaultOptions()));
  const std::string worked = Register("worked");
  const std::string silent = Register("silent");
  ASSERT_OK(Heartbeat(worked).status());
  StopFleet();
  StartFleet(ShortTimeouts(DefaultOptions()));
  EXPECT_TRUE(WaitUntil([&] { return InfoOf(silent).id().empty(); }))
      << "a worker that never heartbeated is still listed";
  EXPECT_EQ(WorkerStateOf(worked), v1::WORKER_STATE_LOST);
}

TEST_F(FleetTest, ListWorkersPagesByIdAndFollowsItsToken) {
  StartFleet();
  std::set<std::string> registered;
  for (int i = 0; i < 250; ++i) registered.insert(Register(absl::StrCat("worker-", i)));

  absl::StatusOr<WorkerPage> first = fleet_->ListWorkers({});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->workers.size(), 100u) << "the default page";
  EXPECT_EQ(first->next_page_token, first->workers.back().id());

  std::vector<std::string> listed;
  ListWorkersOptions options{.page_size = 70};
  int pages = 0;
  do {
    absl::StatusOr<WorkerPage> page = fleet_->ListWorkers(options);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->workers.size(), 70u);
    for (const v1::WorkerInfo& info : page->workers) listed.push_back(info.id());
    options.page_token = page->next_page_token;
    ++pages;
  } while (!options.page_token.empty());
  EXPECT_EQ(pages, 4);
  EXPECT_EQ(listed, std::vector<std::string>(registered.begin(), registered.end()));

  absl::StatusOr<WorkerPage> capped = fleet_->ListWorkers({.page_size = 5000});
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->workers.size(), 250u);
  EXPECT_TRUE(capped->next_page_token.empty());
  const absl::Status negative = fleet_->ListWorkers({.page_size = -1}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(negative)) << negative;
  EXPECT_THAT(negative.message(), HasSubstr("page_size = -1"));
}

}  // namespace
}  // namespace moetrain::server
