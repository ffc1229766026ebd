#include "moetrain/v1/backoff.h"

#include <vector>

#include "gtest/gtest.h"

namespace moetrain {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

std::vector<absl::Duration> Waits(Backoff& backoff, int n) {
  std::vector<absl::Duration> waits;
  for (int i = 0; i < n; ++i) waits.push_back(backoff.Next(kNow));
  return waits;
}

TEST(BackoffTest, DoublesUpToTheCap) {
  Backoff backoff({.initial = absl::Milliseconds(50), .max = absl::Milliseconds(300)});
  EXPECT_EQ(Waits(backoff, 6),
            (std::vector<absl::Duration>{absl::Milliseconds(50), absl::Milliseconds(100),
                                         absl::Milliseconds(200), absl::Milliseconds(300),
                                         absl::Milliseconds(300), absl::Milliseconds(300)}));
}

TEST(BackoffTest, OtherFactor) {
  Backoff backoff({.initial = absl::Seconds(1), .max = absl::Seconds(10), .factor = 3});
  EXPECT_EQ(Waits(backoff, 4), (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(3),
                                                            absl::Seconds(9), absl::Seconds(10)}));
}

TEST(BackoffTest, ResetStartsAgainFromInitial) {
  Backoff backoff({.initial = absl::Milliseconds(10), .max = absl::Seconds(1)});
  Waits(backoff, 5);
  backoff.Reset();
  EXPECT_EQ(Waits(backoff, 2),
            (std::vector<absl::Duration>{absl::Milliseconds(10), absl::Milliseconds(20)}));
}

// An initial wait above the cap is kept once, as given, then capped.
TEST(BackoffTest, InitialAboveTheCap) {
  Backoff backoff({.initial = absl::Seconds(3), .max = absl::Seconds(2)});
  EXPECT_EQ(Waits(backoff, 2), (std::vector<absl::Duration>{absl::Seconds(3), absl::Seconds(2)}));
}

TEST(BackoffTest, DeadlineCutsTheWaitShortThenExpires) {
  Backoff backoff({.initial = absl::Milliseconds(400),
                   .max = absl::Seconds(5),
                   .deadline = kNow + absl::Milliseconds(1000)});
  EXPECT_FALSE(backoff.Expired(kNow));
  EXPECT_EQ(backoff.Next(kNow), absl::Milliseconds(400));
  // The next delay, 800 ms, would pass the deadline 600 ms away.
  EXPECT_EQ(backoff.Next(kNow + absl::Milliseconds(400)), absl::Milliseconds(600));
  EXPECT_FALSE(backoff.Expired(kNow + absl::Milliseconds(999)));
  EXPECT_TRUE(backoff.Expired(kNow + absl::Milliseconds(1000)));
  EXPECT_EQ(backoff.Next(kNow + absl::Milliseconds(1000)), absl::ZeroDuration());
  EXPECT_EQ(backoff.Next(kNow + absl::Seconds(5)), absl::ZeroDuration());
}

TEST(BackoffTest, WithoutDeadlineNeverExpires) {
  Backoff backoff({});
  EXPECT_FALSE(backoff.Expired(absl::InfinitePast()));
  EXPECT_FALSE(backoff.Expired(absl::Now() + absl::Hours(24 * 365 * 100)));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(100));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(200));
}

}  // namespace
}  // namespace moetrain
