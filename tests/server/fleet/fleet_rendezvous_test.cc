// FleetRendezvous on its own: the maps of open attempts, their bounds and byte counts, and Await
// waking on a Set, a Close, Shutdown or its deadline. The fleet's checks of who may use a map
// are in fleet_kv_test.cc and fleet_kv_limits_test.cc.
#include "server/core/fleet_rendezvous.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

// Longer than any wake-up takes; only a failing test waits this long.
constexpr absl::Duration kPatience = absl::Seconds(20);
// Attempts as wide, and a worker running as many of their ranks, as make the per-rank allowances
// (fleet_kv_limits_test.cc) larger than anything here: the bounds tested are the absolute ones.
constexpr int64_t kWorldSize = 64;
constexpr char kWorker[] = "w-1";

TEST(FleetRendezvousTest, SetGetReplaceAndByteCounts) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> unset, kv.Get("job-a", 1, "addr"));
  EXPECT_FALSE(unset.has_value());
  ASSERT_OK(kv.Set("job-a", 1, "addr", "10.0.0.7:29500", kWorker, kWorldSize));
  EXPECT_EQ(kv.Bytes(), 4 + 14);
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value, kv.Get("job-a", 1, "addr"));
  EXPECT_EQ(value, "10.0.0.7:29500");
  // A new value replaces the old one, and its bytes.
  ASSERT_OK(kv.Set("job-a", 1, "addr", "x", kWorker, kWorldSize));
  EXPECT_EQ(kv.Bytes(), 4 + 1);
  ASSERT_OK_AND_ASSIGN(value, kv.Get("job-a", 1, "addr"));
  EXPECT_EQ(value, "x");
  // An empty value is a value.
  ASSERT_OK(kv.Set("job-a", 1, "empty", "", kWorker, kWorldSize));
  ASSERT_OK_AND_ASSIGN(value, kv.Get("job-a", 1, "empty"));
  EXPECT_EQ(value, "");
  EXPECT_EQ(kv.Bytes(), 4 + 1 + 5);
}

TEST(FleetRendezvousTest, OnlyTheOpenAttemptHasAMap) {
  FleetRendezvous kv(RendezvousLimits{});
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Set("job-a", 1, "k", "v", kWorker, kWorldSize)));
  kv.Open("job-a", 1, kWorldSize);
  kv.Open("job-b", 1, kWorldSize);
  ASSERT_OK(kv.Set("job-a", 1, "k", "v1", kWorker, kWorldSize));
  ASSERT_OK(kv.Set("job-b", 1, "k", "other job", kWorker, kWorldSize));
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Get("job-a", 2, "k").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Set("job-a", 0, "k", "v", kWorker, kWorldSize)));

  // The next attempt starts empty; the previous one's keys and bytes are gone.
  kv.Open("job-a", 2, kWorldSize);
  EXPECT_EQ(kv.Bytes(), 1 + 9);
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Get("job-a", 1, "k").status()));
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value, kv.Get("job-a", 2, "k"));
  EXPECT_FALSE(value.has_value());

  kv.Close("job-b");
  EXPECT_EQ(kv.Bytes(), 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Get("job-b", 1, "k").status()));
  kv.Close("job-b");  // closing twice is harmless
  kv.Close("job-never-opened");
  ASSERT_OK_AND_ASSIGN(value, kv.Get("job-a", 2, "k"));
  EXPECT_FALSE(value.has_value());
}

TEST(FleetRendezvousTest, KeysAndValuesAreBounded) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set("job-a", 1, "", "v", kWorker, kWorldSize)));
  const std::string longest_key(FleetRendezvous::kMaxKeyBytes, 'k');
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Set("job-a", 1, longest_key + "k", "v", kWorker, kWorldSize)));
  EXPECT_TRUE(absl::IsInvalidArgument(kv.Get("job-a", 1, longest_key + "k").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      kv.Set("job-a", 1, "big", std::string(FleetRendezvous::kMaxValueBytes + 1, 'v'), kWorker, kWorldSize)));
  ASSERT_OK(kv.Set("job-a", 1, longest_key, std::string(FleetRendezvous::kMaxValueBytes, 'v'), kWorker, kWorldSize));
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value, kv.Get("job-a", 1, longest_key));
  ASSERT_TRUE(value.has_value());
  EXPECT_EQ(value->size(), FleetRendezvous::kMaxValueBytes);
  EXPECT_EQ(kv.Bytes(),
            static_cast<int64_t>(FleetRendezvous::kMaxKeyBytes + FleetRendezvous::kMaxValueBytes));
}

TEST(FleetRendezvousTest, LimitsRefuseWhatWouldPassThemAndStoreNothing) {
  RendezvousLimits limits;
  limits.max_keys_per_attempt = 2;
  limits.max_bytes_per_attempt = 100;
  limits.max_bytes_total = 150;
  FleetRendezvous kv(limits);
  kv.Open("job-a", 1, kWorldSize);
  kv.Open("job-b", 3, kWorldSize);

  ASSERT_OK(kv.Set("job-a", 1, "k1", "v", kWorker, kWorldSize));
  ASSERT_OK(kv.Set("job-a", 1, "k2", "v", kWorker, kWorldSize));
  absl::Status third = kv.Set("job-a", 1, "k3", "v", kWorker, kWorldSize);
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  EXPECT_NE(third.message().find("kv_max_keys_per_attempt"), std::string::npos) << third;
  ASSERT_OK(kv.Set("job-a", 1, "k2", "replaced", kWorker, kWorldSize));  // not a new key
  EXPECT_EQ(kv.Bytes(), 3 + 10);

  // 2 + 98 bytes fill the attempt exactly; one more byte is too many.
  ASSERT_OK(kv.Set("job-a", 1, "k1", std::string(98 - 10, 'v'), kWorker, kWorldSize));
  EXPECT_EQ(kv.Bytes(), 100);
  absl::Status over = kv.Set("job-a", 1, "k2", "replaced!", kWorker, kWorldSize);
  EXPECT_TRUE(absl::IsResourceExhausted(over)) << over;
  EXPECT_NE(over.message().find("kv_max_bytes_per_attempt"), std::string::npos) << over;
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> kept, kv.Get("job-a", 1, "k2"));
  EXPECT_EQ(kept, "replaced");

  // All attempts together: 100 held by job-a leave 50 for job-b.
  ASSERT_OK(kv.Set("job-b", 3, "k", std::string(49, 'v'), kWorker, kWorldSize));
  absl::Status total = kv.Set("job-b", 3, "j", "v", kWorker, kWorldSize);
  EXPECT_TRUE(absl::IsResourceExhausted(total)) << total;
  EXPECT_NE(total.message().find("kv_max_bytes_total"), std::string::npos) << total;
  EXPECT_EQ(kv.Bytes(), 150);
  // Closing an attempt frees its bytes for the others.
  kv.Close("job-a");
  ASSERT_OK(kv.Set("job-b", 3, "j", "v", kWorker, kWorldSize));
  EXPECT_EQ(kv.Bytes(), 52);
}

TEST(FleetRendezvousTest, AwaitReturnsWhenTheKeyIsSetFromAnotherThread) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_OK(kv.Set("job-a", 1, "other", "not this one", kWorker, kWorldSize));
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_OK(kv.Set("job-a", 1, "addr", "10.0.0.7:29500", kWorker, kWorldSize));
  });
  const absl::Time start = absl::Now();
  kv.Await("job-a", 1, "addr", start + kPatience);
  EXPECT_LT(absl::Now() - start, kPatience);
  // Checked before the join: an Await that returned early would not see the value yet.
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value, kv.Get("job-a", 1, "addr"));
  EXPECT_EQ(value, "10.0.0.7:29500");
  setter.join();
  // Already set: at once.
  kv.Await("job-a", 1, "addr", absl::InfiniteFuture());
}

TEST(FleetRendezvousTest, AwaitReturnsWhenTheAttemptCloses) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv.Close("job-a");
  });
  const absl::Time start = absl::Now();
  kv.Await("job-a", 1, "never-set", start + kPatience);
  EXPECT_LT(absl::Now() - start, kPatience);
  // Closed by the time Await returns, not only after the join.
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Get("job-a", 1, "never-set").status()));
  closer.join();
  // Not open: at once.
  kv.Await("job-a", 1, "never-set", absl::InfiniteFuture());
}

TEST(FleetRendezvousTest, AwaitReturnsWhenTheNextAttemptOpens) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  std::thread opener([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv.Open("job-a", 2, kWorldSize);
  });
  const absl::Time start = absl::Now();
  kv.Await("job-a", 1, "never-set", start + kPatience);
  EXPECT_LT(absl::Now() - start, kPatience);
  // Attempt 1's map is gone by the time Await returns.
  EXPECT_TRUE(absl::IsFailedPrecondition(kv.Get("job-a", 1, "never-set").status()));
  opener.join();
}

TEST(FleetRendezvousTest, AwaitReturnsAtItsDeadlineOrOnShutdown) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  absl::Time start = absl::Now();
  kv.Await("job-a", 1, "never-set", start + absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));

  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv.Shutdown();
  });
  start = absl::Now();
  kv.Await("job-a", 1, "never-set", start + kPatience);
  EXPECT_LT(absl::Now() - start, kPatience);
  stopper.join();
  // From now on, at once.
  kv.Await("job-a", 1, "never-set", absl::InfiniteFuture());
}

TEST(FleetRendezvousTest, TrimFreedMemoryKeepsTheMaps) {
  FleetRendezvous kv(RendezvousLimits{});
  kv.Open("job-a", 1, kWorldSize);
  kv.Open("job-b", 1, kWorldSize);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(
        kv.Set("job-a", 1, std::to_string(i), std::string(FleetRendezvous::kMaxValueBytes, 'v'), kWorker, kWorldSize));
  }
  ASSERT_OK(kv.Set("job-b", 1, "addr", "10.0.0.7:29500", kWorker, kWorldSize));
  kv.Close("job-a");  // frees 20 MiB, past the trimming threshold
  kv.TrimFreedMemory();
  EXPECT_EQ(kv.Bytes(), 4 + 14);
  ASSERT_OK_AND_ASSIGN(std::optional<std::string> value, kv.Get("job-b", 1, "addr"));
  EXPECT_EQ(value, "10.0.0.7:29500");
}

}  // namespace
}  // namespace moetrain::server
