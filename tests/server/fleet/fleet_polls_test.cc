// GetAssignment's long poll on a real store and coordinator: a worker has one at most, so a new
// call answers the one waiting (empty), and a flood of calls from one worker leaves one waiting.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "server/core/fleet.h"
#include "tests/server/fleet/fleet_test_util.h"

namespace moetrain::server {
namespace {

TEST_F(FleetTest, ANewPollAnswersTheOneWaiting) {
  StartFleet();
  const std::string worker = Register();
  std::atomic<bool> answered{false};
  absl::StatusOr<v1::GetAssignmentResponse> waiting = absl::UnknownError("not answered");
  std::thread poll([&] {
    waiting = Poll(worker, absl::Seconds(30));
    answered.store(true);
  });
  // Each of these returns at once; once the thread's poll waits, the next one answers it.
  EXPECT_TRUE(WaitUntil([&] {
    EXPECT_OK(Poll(worker).status());
    return answered.load();
  })) << "the first poll still waits";
  poll.join();
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  EXPECT_FALSE(waiting->has_assignment());
  EXPECT_EQ(waiting->cancel_size(), 0);
  // The poll that answered it is the one an assignment goes to.
  const JobRecord job = Submit();
  EXPECT_EQ(AwaitAssignment(worker).job_id(), job.id);
}

TEST_F(FleetTest, AFloodOfPollsFromOneWorkerLeavesOneWaiting) {
  StartFleet();
  const std::string worker = Register("flooding"), other = Register("other");
  constexpr int kPolls = 50;
  std::atomic<int> answered{0};
  std::vector<std::thread> polls;
  for (int i = 0; i < kPolls; ++i) {
    polls.emplace_back([&] {
      EXPECT_OK(Poll(worker, absl::Seconds(30)).status());
      ++answered;
    });
  }
  EXPECT_TRUE(WaitUntil([&] { return answered.load() >= kPolls - 1; }))
      << answered.load() << " of " << kPolls << " polls answered";
  EXPECT_OK(Heartbeat(other).status());
  EXPECT_OK(Poll(worker).status());  // answers the last one
  for (std::thread& poll : polls) poll.join();
  EXPECT_EQ(answered.load(), kPolls);
}

}  // namespace
}  // namespace moetrain::server
