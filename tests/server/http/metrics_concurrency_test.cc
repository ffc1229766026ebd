// The registry under many threads: updates, children made and removed, and scrapes at once.
// Run under -fsanitize=thread when the locking changes.
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/http/metrics.h"
#include "tests/testing/exposition.h"
#include "tests/testing/testing.h"

namespace moetrain::server {
namespace {

using testutil::Exposition;
using testutil::ExpositionSample;
using testutil::Must;
using testutil::MustParseExposition;

// Exact totals from 8 threads on shared, private and contended-to-create children, with scrapes
// running alongside.
TEST(MetricsConcurrencyTest, ConcurrentUpdatesGiveExactTotals) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 100000;
  constexpr int kKeys = 1000;
  MetricsRegistry registry;
  Family<Counter>* counters =
      Must(registry.AddCounter("moetrain_events_total", "Events.", {"thread"}));
  Family<Counter>* keyed = Must(registry.AddCounter("moetrain_keyed_total", "Keyed.", {"key"}));
  Family<Gauge>* gauges = Must(registry.AddGauge("moetrain_level", "Level."));
  Family<Histogram>* histograms =
      Must(registry.AddHistogram("moetrain_sizes_bytes", "Sizes.", {}, {0.5, 1}));

  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) EXPECT_FALSE(MustParseExposition(registry.Serialize()).samples.empty());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter* shared = Must(counters->WithLabels({"shared"}));
      Gauge* level = Must(gauges->WithLabels({}));
      Histogram* sizes = Must(histograms->WithLabels({}));
      const std::string own = std::to_string(t);
      for (int i = 0; i < kIterations; ++i) {
        shared->Increment();
        Must(counters->WithLabels({own}))->Increment();
        Must(keyed->WithLabels({std::to_string(i % kKeys)}))->Increment();
        level->Add(1);
        sizes->Observe((i % 4) * 0.5);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.store(true);
  scraper.join();

  EXPECT_EQ(Must(counters->WithLabels({"shared"}))->Value(), kThreads * kIterations);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(Must(counters->WithLabels({std::to_string(t)}))->Value(), kIterations);
  }
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_EQ(Must(keyed->WithLabels({std::to_string(k)}))->Value(),
              kThreads * kIterations / kKeys);
  }
  EXPECT_EQ(Must(gauges->WithLabels({}))->Value(), kThreads * kIterations);
  const Exposition parsed = MustParseExposition(registry.Serialize());
  const double quarter = kThreads * kIterations / 4;
  const Exposition::HistogramSeries sizes = parsed.Histogram("moetrain_sizes_bytes");
  EXPECT_EQ(sizes.buckets, (std::map<std::string, double>{
                               {"0.5", 2 * quarter}, {"1", 3 * quarter}, {"+Inf", 4 * quarter}}));
  EXPECT_EQ(sizes.sum, quarter * (0 + 0.5 + 1 + 1.5));
  EXPECT_EQ(sizes.count, kThreads * kIterations);
  EXPECT_EQ(parsed.Value("moetrain_events_total", {{"thread", "shared"}}), 800000);
  EXPECT_EQ(parsed.samples.size(), 1u + kThreads + kKeys + 1 + 5);
}

// Children made, updated and removed by many threads at once while scrapes run: the children
// that stay keep exact totals and the removed ones are gone. Each thread removes only children it
// made itself, since a removed child's pointer dangles.
TEST(MetricsConcurrencyTest, ConcurrentAddAndRemoveKeepTheOtherChildrenExact) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  MetricsRegistry registry;
  Family<Counter>* events =
      Must(registry.AddCounter("moetrain_events_total", "Events.", {"job_id", "kind"}));
  Family<Histogram>* sizes =
      Must(registry.AddHistogram("moetrain_sizes_bytes", "Sizes.", {"job_id"}, {0.5, 1}));

  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      for (const ExpositionSample& sample : MustParseExposition(registry.Serialize()).samples) {
        const std::string& job = sample.labels.at("job_id");
        EXPECT_NE(job, "gone") << "a removed series was written";
        if (sample.name == "moetrain_events_total" && absl::StartsWith(job, "short-lived")) {
          EXPECT_TRUE(sample.value == 0 || sample.value == 1) << job << " " << sample.value;
        }
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string kept = absl::StrCat("kept-", t);
      const std::string short_lived = absl::StrCat("short-lived-", t);
      for (int i = 0; i < kIterations; ++i) {
        Must(events->WithLabels({kept, "step"}))->Increment();
        Must(events->WithLabels({"shared", "step"}))->Increment();
        Must(sizes->WithLabels({kept}))->Observe(0.25);
        // Made, counted once, removed: written as 0 or 1, or not at all.
        Must(events->WithLabels({short_lived, "step"}))->Increment();
        Must(events->WithLabels({short_lived, "checkpoint"}))->Increment();
        Must(sizes->WithLabels({short_lived}))->Observe(2);
        EXPECT_TRUE(events->Remove({short_lived, "checkpoint"}));
        EXPECT_EQ(events->RemoveWhere("job_id", short_lived), 1);
        EXPECT_EQ(sizes->RemoveWhere("job_id", short_lived), 1);
        // Removing what was never there, while others add and remove, is harmless.
        EXPECT_FALSE(events->Remove({"gone", "step"}));
        EXPECT_EQ(sizes->RemoveWhere("job_id", "gone"), 0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done.store(true);
  scraper.join();

  const Exposition parsed = MustParseExposition(registry.Serialize());
  EXPECT_EQ(parsed.Value("moetrain_events_total", {{"job_id", "shared"}, {"kind", "step"}}),
            kThreads * kIterations);
  for (int t = 0; t < kThreads; ++t) {
    const std::string id = absl::StrCat("kept-", t);
    EXPECT_EQ(parsed.Value("moetrain_events_total", {{"job_id", id}, {"kind", "step"}}),
              kIterations);
    EXPECT_EQ(parsed.Histogram("moetrain_sizes_bytes", {{"job_id", id}}).count, kIterations);
  }
  // shared + kThreads kept counters, kThreads kept histograms of 3 buckets, sum and count.
  EXPECT_EQ(parsed.samples.size(), 1u + kThreads + kThreads * 5);
}

}  // namespace
}  // namespace moetrain::server
