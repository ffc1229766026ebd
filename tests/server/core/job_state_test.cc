#include "server/core/job_state.h"

#include <set>
#include <utility>

#include "gtest/gtest.h"

namespace moetrain::server {
namespace {

using S = JobState;

TEST(JobStateTest, TransitionTableIsExactlyTheDesign) {
  const std::set<std::pair<S, S>> legal = {
      {S::kPending, S::kScheduled},    {S::kPending, S::kCancelled},
      {S::kScheduled, S::kRunning},    {S::kScheduled, S::kRestarting},
      {S::kScheduled, S::kFailed},     {S::kScheduled, S::kCancelled},
      {S::kRunning, S::kSucceeded},    {S::kRunning, S::kFailed},
      {S::kRunning, S::kRestarting},   {S::kRunning, S::kCancelled},
      {S::kRestarting, S::kScheduled}, {S::kRestarting, S::kFailed},
      {S::kRestarting, S::kCancelled},
  };
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      EXPECT_EQ(IsLegalTransition(from, to), legal.count({from, to}) == 1)
          << JobStateName(from) << " -> " << JobStateName(to);
    }
  }
}

TEST(JobStateTest, CancelledFromEveryNonFinalStateAndNothingLeavesAFinalOne) {
  for (S from : kAllJobStates) {
    EXPECT_EQ(IsLegalTransition(from, S::kCancelled), !IsFinal(from)) << JobStateName(from);
    if (!IsFinal(from)) continue;
    for (S to : kAllJobStates) EXPECT_FALSE(IsLegalTransition(from, to));
  }
}

TEST(JobStateTest, NamesRoundTrip) {
  std::set<std::string> names;
  for (S state : kAllJobStates) {
    names.insert(std::string(JobStateName(state)));
    auto parsed = ParseJobState(JobStateName(state));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, state);
  }
  EXPECT_EQ(names.size(), kAllJobStates.size());
  EXPECT_EQ(JobStateName(S::kRestarting), "RESTARTING");
  EXPECT_EQ(ParseJobState("pending").status().code(), absl::StatusCode::kInvalidArgument);
  for (WorkerState state : kAllWorkerStates) {
    auto parsed = ParseWorkerState(WorkerStateName(state));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, state);
  }
  EXPECT_FALSE(ParseWorkerState("GONE").ok());
}

TEST(JobStateTest, StateChangePayloadRoundTrips) {
  for (const char* reason : {"", "worker w3 lost", "two  spaces and\nnewline"}) {
    StateChange change{S::kRunning, S::kRestarting, reason};
    auto decoded = DecodeStateChange(EncodeStateChange(change));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->from, change.from);
    EXPECT_EQ(decoded->to, change.to);
    EXPECT_EQ(decoded->reason, reason);
  }
  EXPECT_EQ(EncodeStateChange({S::kPending, S::kScheduled, "gang of 2"}),
            "PENDING SCHEDULED gang of 2");
  EXPECT_FALSE(DecodeStateChange("PENDING").ok());
  EXPECT_FALSE(DecodeStateChange("PENDING NOPE x").ok());
}

}  // namespace
}  // namespace moetrain::server
